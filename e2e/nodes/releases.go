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
	// Arch is the Debian architecture of the node's kernel and userland
	// (archs); empty means amd64, this machine's.
	Arch string
}

// arch is the Debian architecture of r: amd64 unless Arch says otherwise.
func (r Release) arch() archSpec {
	if r.Arch == "" {
		return archs["amd64"]
	}
	return archs[r.Arch]
}

// Name names the release's node: the suite ("bookworm"), with the
// architecture when it is not amd64 ("trixie-arm64"). Its cache directory
// and its results are named after it.
func (r Release) Name() string {
	if r.Arch == "" || r.Arch == "amd64" {
		return r.Suite
	}
	return r.Suite + "-" + r.Arch
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
// unstable, which shows what the next release's kernel and nft will do;
// then the current stable release on arm64, the image's other platform
// (docs/image.md).
var Releases = []Release{
	{Suite: "bullseye", Version: "11", KernelSeries: "5.10", Archives: stable("bullseye")},
	{Suite: "bookworm", Version: "12", KernelSeries: "6.1", Archives: stable("bookworm")},
	{Suite: "trixie", Version: "13", KernelSeries: "6.12", Archives: stable("trixie")},
	{Suite: "sid", Version: "unstable", Archives: []Archive{{debianArchive, "sid"}}},
	{Suite: "trixie", Version: "13", KernelSeries: "6.12", Archives: stable("trixie"), Arch: "arm64"},
}

// Lookup returns the release of Releases of that Name ("bookworm",
// "trixie-arm64").
func Lookup(name string) (Release, error) {
	for _, r := range Releases {
		if r.Name() == name {
			return r, nil
		}
	}
	names := make([]string, len(Releases))
	for i, r := range Releases {
		names[i] = r.Name()
	}
	return Release{}, fmt.Errorf("no Debian release %q (known: %s)", name, strings.Join(names, ", "))
}

// String is the suite and its version, with the architecture when it is
// not amd64: "bookworm (12)", "trixie (13, arm64)".
func (r Release) String() string {
	if r.Name() == r.Suite {
		return fmt.Sprintf("%s (%s)", r.Suite, r.Version)
	}
	return fmt.Sprintf("%s (%s, %s)", r.Suite, r.Version, r.Arch)
}
