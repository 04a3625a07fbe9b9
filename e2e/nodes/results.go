package nodes

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"time"
)

// What TestKernelTests leaves in bin/nodes/<suite>/results.json, for
// e2e/cmd/nodes-table (docs/nodes.md) and anyone else to read.

// ReleaseResults are a release's results, as results.json holds them.
type ReleaseResults struct {
	Suite, Version string
	Arch           string            `json:",omitempty"` // Release.Arch
	Kernel         string            // uname -r
	Tools          map[string]string // tool → its package's Debian version
	Date           string            // of the run, RFC 3339, UTC
	// Boot, Setup and Duration are the run's, in seconds (Result).
	Boot, Setup, Duration float64
	Packages              []PackageResults
}

// PackageResults are a package's results on a release.
type PackageResults struct {
	Package  string   // "nft/nftnl"
	Selected []string // the kernel tests run (-test.run)
	ExitCode int      // the test binary's
	Elapsed  float64  // the binary's run, in seconds (the guest's uptime)
	// Pass, Fail, Skip and Incomplete count the top-level tests.
	Pass, Fail, Skip, Incomplete int
	// Missing are selected tests that never started.
	Missing []string `json:",omitempty"`
	// Tests are every test's result, subtests included, in the order
	// they ended.
	Tests []TestResult
}

// TestResult is a test's or subtest's result.
type TestResult struct {
	Name    string  // "TestNetlinkOwnedTable" or "TestNetlinkOwnedTable/ip"
	Action  string  // "pass", "fail", "skip", "incomplete" (started, never ended)
	Elapsed float64 // seconds
	// Reason is a skip's message (t.Skip's, without file and line).
	Reason string `json:",omitempty"`
	// Output is what a failed or incomplete test printed.
	Output string `json:",omitempty"`
}

// Name is the release's Name: "bookworm", "trixie-arm64".
func (rr ReleaseResults) Name() string {
	return Release{Suite: rr.Suite, Arch: rr.Arch}.Name()
}

// Summary is e.g. "bookworm (12), kernel 6.1.0-56-amd64, nft
// 1.0.6-2+deb12u2: boot 6.1s, modules 4.5s, whole run 5m13s" followed by
// a line per package with its counts and the tests that did not pass.
func (rr ReleaseResults) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s (%s), kernel %s, nft %s: boot %.1fs, modules %.1fs, whole run %v\n", rr.Name(), rr.Version,
		rr.Kernel, rr.Tools["nft"], rr.Boot, rr.Setup, time.Duration(rr.Duration*float64(time.Second)).Round(time.Second))
	for _, pr := range rr.Packages {
		fmt.Fprintf(&b, "  %s: %d passed, %d failed, %d skipped", pr.Package, pr.Pass, pr.Fail, pr.Skip)
		if pr.Incomplete > 0 {
			fmt.Fprintf(&b, ", %d incomplete", pr.Incomplete)
		}
		if len(pr.Missing) > 0 {
			fmt.Fprintf(&b, ", %d never ran", len(pr.Missing))
		}
		fmt.Fprintf(&b, " in %.0fs (exit status %d)\n", pr.Elapsed, pr.ExitCode)
		for _, tr := range pr.Tests {
			switch tr.Action {
			case "fail", "incomplete":
				fmt.Fprintf(&b, "    %s %s (%.1fs)\n", tr.Action, tr.Name, tr.Elapsed)
			case "skip":
				fmt.Fprintf(&b, "    skip %s: %s\n", tr.Name, tr.Reason)
			}
		}
	}
	return b.String()
}

// ReadResults reads the results.json of each release of Releases that dir
// (bin/nodes) has one for, oldest release first.
func ReadResults(dir string) ([]ReleaseResults, error) {
	var out []ReleaseResults
	for _, r := range Releases {
		var rr ReleaseResults
		err := readJSON(filepath.Join(dir, r.Name(), "results.json"), &rr)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.Name(), err)
		}
		out = append(out, rr)
	}
	return out, nil
}
