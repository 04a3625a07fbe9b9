// Package netnstest gives a kernel test a network namespace of its own:
// the nftables and conntrack tests of nft, conntrack and proxier/ruleset
// program the kernel only there, never in the root namespace.
package netnstest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// NS is a fresh, named network namespace.
type NS struct {
	Name string // as in `ip netns list`
	Fd   int    // open on /run/netns/Name until the test ends
}

// Require skips the test unless it runs as root with the tools it names
// (besides `ip`) on the PATH.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root")
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("kernel test: needs %s: %v", tool, err)
		}
	}
}

// New creates a namespace named <prefix>-<random>, removed when the test
// ends, however it ends (failure, panic and Ctrl-C of `go test` included:
// t.Cleanup runs on all of them but SIGKILL). It skips the test unless
// Require(t, tools...) holds.
func New(t testing.TB, prefix string, tools ...string) *NS {
	t.Helper()
	Require(t, tools...)
	name := fmt.Sprintf("%s-%08x", prefix, rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, out)
		}
	})
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &NS{Name: name, Fd: int(f.Fd())}
}

// Run runs a command inside the namespace with stdin and returns its
// standard output; a failure is returned with its standard error.
func (ns *NS) Run(stdin string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}
