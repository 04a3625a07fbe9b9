package nodes

import (
	"fmt"
	"strings"
)

// Release is a Debian release whose kernel and userland a Node runs.
type Release struct {
	// Suite is the codename apt knows it by ("bookworm"); the cache
	// directory of its Node is named after it.
	Suite string
	// Version is Debian's number for it ("12"), or "unstable".
	Version string
	// KernelSeries is the kernel the release ships ("6.1"): Prepare takes
	// the newest kernel of that series the suite and its security updates
	// serve (what the suite's linux-image-amd64 depends on) and fails if
	// the suite's kernel is of another series. Empty for sid, whose kernel
	// moves on: the newest it serves.
	KernelSeries string
	// Archives are the lines of the private sources.list (main only): the
	// suite, its updates and its security updates, so that a Node has what
	// an up-to-date machine of that release runs.
	Archives []Archive
}

// Archive is one line of a sources.list: an archive and a suite of it.
type Archive struct {
	URI, Suite string
}

const (
	debianArchive   = "http://deb.debian.org/debian"
	securityArchive = "http://deb.debian.org/debian-security"
)

// stable is the Archives of a release with updates and security updates.
func stable(suite string) []Archive {
	return []Archive{
		{debianArchive, suite},
		{debianArchive, suite + "-updates"},
		{securityArchive, suite + "-security"},
	}
}

// Releases are the Debian releases nftproxy's users run, oldest first: the
// two supported stable releases, the previous one (still under LTS) and
// unstable, which shows what the next release's kernel and nft will do.
var Releases = []Release{
	{Suite: "bullseye", Version: "11", KernelSeries: "5.10", Archives: stable("bullseye")},
	{Suite: "bookworm", Version: "12", KernelSeries: "6.1", Archives: stable("bookworm")},
	{Suite: "trixie", Version: "13", KernelSeries: "6.12", Archives: stable("trixie")},
	{Suite: "sid", Version: "unstable", Archives: []Archive{{debianArchive, "sid"}}},
}

// Lookup returns the release of Releases named suite.
func Lookup(suite string) (Release, error) {
	for _, r := range Releases {
		if r.Suite == suite {
			return r, nil
		}
	}
	names := make([]string, len(Releases))
	for i, r := range Releases {
		names[i] = r.Suite
	}
	return Release{}, fmt.Errorf("no Debian release %q (known: %s)", suite, strings.Join(names, ", "))
}

// String is the suite and its version, e.g. "bookworm (12)".
func (r Release) String() string { return fmt.Sprintf("%s (%s)", r.Suite, r.Version) }
