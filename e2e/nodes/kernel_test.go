package nodes

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// suitesFromEnv returns the releases NFTPROXY_NODES_SUITES names
// ("bookworm,trixie"), all of Releases without it.
func suitesFromEnv(t *testing.T) []Release {
	t.Helper()
	env := os.Getenv("NFTPROXY_NODES_SUITES")
	if env == "" {
		return Releases
	}
	var rs []Release
	for _, s := range strings.Split(env, ",") {
		r, err := Lookup(strings.TrimSpace(s))
		if err != nil {
			t.Fatalf("NFTPROXY_NODES_SUITES: %v", err)
		}
		rs = append(rs, r)
	}
	return rs
}

// requireNodes skips the test unless NFTPROXY_NODES=1 (it boots a VM per
// release, minutes each), and installs QEMU when it is missing.
func requireNodes(t *testing.T) {
	t.Helper()
	if os.Getenv("NFTPROXY_NODES") != "1" {
		t.Skip("boots Debian releases under QEMU for minutes each: set NFTPROXY_NODES=1 (make nodes)")
	}
	if _, err := exec.LookPath(qemu); err != nil {
		deps := filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "deps.sh")
		if out, err := exec.Command(deps).CombinedOutput(); err != nil {
			t.Fatalf("%s (for %s): %v\n%s", deps, qemu, err, out)
		}
	}
}

// outDir is where a test leaves each release's output, console and
// results: $NFTPROXY_NODES_OUT, or bin/nodes of the checkout.
func outDir(t *testing.T, suite string) string {
	t.Helper()
	dir := os.Getenv("NFTPROXY_NODES_OUT")
	if dir == "" {
		dir = filepath.Join(kubebin.RepoRoot(), "bin", "nodes")
	}
	dir = filepath.Join(dir, suite)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// buildTestBinary builds a package's tests as a static binary (no cgo: the
// guest has the release's glibc, not the host's).
func buildTestBinary(t *testing.T, pkg string) string {
	t.Helper()
	// Not t.TempDir: Ctrl-C would leave it behind.
	dir, remove, err := TempDir(kubebin.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	bin := filepath.Join(dir, filepath.Base(pkg)+".test")
	cmd := exec.Command("go", "test", "-c", "-o", bin, pkg)
	cmd.Dir = kubebin.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// testsStart separates the versions a job prints from the tests' output.
const testsStart = "nodes: tests start"

// kernelTestsScript prints the tools' own versions, then runs the tests
// in the format go tool test2json reads on the host.
const kernelTestsScript = `uname -r; nft --version; ip -V; conntrack --version; busybox | head -n 1
echo "` + testsStart + `"
exec /root/pkg.test -test.v=test2json -test.short -test.timeout=50m
`

// TestKernelTests runs nft/nftnl's kernel tests (-short) on each release's
// kernel and tools, booted under QEMU, and reports each top-level test's
// result per release. It fails when the harness could not run them or
// collect every result; the tests' own failures, expected on older
// kernels, are reported (and fail it only with NFTPROXY_NODES_STRICT=1).
// Each release's output, console and results are left in bin/nodes/<suite>.
func TestKernelTests(t *testing.T) {
	requireNodes(t)
	releases := suitesFromEnv(t)
	bin := buildTestBinary(t, "./nft/nftnl")
	var summaries []string
	for _, r := range releases {
		t.Run(r.Suite, func(t *testing.T) {
			s := runKernelTests(t, r, bin)
			summaries = append(summaries, s)
		})
	}
	t.Logf("nft/nftnl -test.short per release:\n%s", strings.Join(summaries, "\n"))
}

// runKernelTests runs the tests on one release and returns a summary.
func runKernelTests(t *testing.T, r Release, bin string) string {
	ctx := t.Context()
	// Ending the run before go test's -timeout panics lets it kill QEMU
	// and remove its files itself.
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-10*time.Second))
		defer cancel()
	}
	n, err := Prepare(ctx, r, kubebin.CacheDir())
	if err != nil {
		t.Fatalf("prepare %s: %v", r, err)
	}
	t.Logf("%s\nprepared in %s", n, preparation(n.Prepared))

	res, err := n.Run(ctx, Job{
		Files:   map[string]string{"/root/pkg.test": bin},
		Script:  kernelTestsScript,
		Timeout: time.Hour,
	})
	dir := outDir(t, r.Suite)
	os.WriteFile(filepath.Join(dir, "console.txt"), []byte(res.Console), 0o644)
	os.WriteFile(filepath.Join(dir, "output.txt"), []byte(res.Output), 0o644)
	if err != nil {
		t.Fatalf("run on %s: %v", r, err)
	}
	header, tests, ok := strings.Cut(res.Output, testsStart+"\n")
	if !ok {
		t.Fatalf("the job's output lacks %q (exit status %d):\n%s", testsStart, res.ExitCode, tail(res.Output, 30))
	}
	t.Logf("in the guest:\n%s", strings.TrimSpace(header))
	results, events, err := testResults(ctx, tests)
	os.WriteFile(filepath.Join(dir, "events.json"), events, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	summary := fmt.Sprintf("%s, kernel %s, nft %s: %s; exit status %d; boot %v, modules %v, whole run %v",
		r.Suite, n.Kernel(), n.Tool("nft"), results.counts(), res.ExitCode,
		res.Boot.Round(100*time.Millisecond), res.Setup.Round(100*time.Millisecond), res.Duration.Round(time.Second))
	t.Logf("%s\n%s", summary, results.table())
	os.WriteFile(filepath.Join(dir, "results.txt"), []byte(summary+"\n"+results.table()), 0o644)
	if len(results.byAction["incomplete"]) > 0 {
		t.Errorf("tests started but never ended (the binary crashed or timed out): %v\n%s",
			results.byAction["incomplete"], tail(res.Output, 30))
	}
	if len(results.byAction["pass"])+len(results.byAction["fail"])+len(results.byAction["skip"]) == 0 {
		t.Errorf("no test results in the output:\n%s", tail(res.Output, 30))
	}
	if failed := results.byAction["fail"]; len(failed) > 0 {
		if res.ExitCode == 0 {
			t.Errorf("tests failed, but the test binary exited 0")
		}
		if os.Getenv("NFTPROXY_NODES_STRICT") == "1" {
			t.Errorf("failed on %s: %v", r.Suite, failed)
		}
	}
	return summary + "\n" + results.table()
}

func listsNote(p Preparation) string {
	switch {
	case p.ListsError != nil:
		return fmt.Sprintf(", refresh failed: %v", p.ListsError)
	case p.ListsUpdated:
		return ", refreshed"
	}
	return ""
}

// testEvent is a line of go tool test2json's output.
type testEvent struct {
	Action  string
	Test    string
	Elapsed float64
}

// results are the top-level tests of a run by outcome ("pass", "fail",
// "skip", "incomplete": started, never ended), with their durations.
type results struct {
	byAction map[string][]string
	elapsed  map[string]float64
}

// testResults converts a test binary's -test.v=test2json output to
// test2json's events and reads each top-level test's outcome.
func testResults(ctx context.Context, output string) (results, []byte, error) {
	cmd := exec.CommandContext(ctx, "go", "tool", "test2json", "-t", "-p", "nft/nftnl")
	cmd.Stdin = strings.NewReader(output)
	events, err := cmd.Output()
	if err != nil && len(events) == 0 {
		return results{}, nil, fmt.Errorf("go tool test2json: %w", err)
	}
	r := results{byAction: map[string][]string{}, elapsed: map[string]float64{}}
	started := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(events))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var e testEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return results{}, events, fmt.Errorf("test2json: %w: %s", err, sc.Bytes())
		}
		if e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		switch e.Action {
		case "run":
			started[e.Test] = true
		case "pass", "fail", "skip":
			r.byAction[e.Action] = append(r.byAction[e.Action], e.Test)
			r.elapsed[e.Test] = e.Elapsed
			delete(started, e.Test)
		}
	}
	for name := range started {
		r.byAction["incomplete"] = append(r.byAction["incomplete"], name)
	}
	for _, names := range r.byAction {
		slices.Sort(names)
	}
	return r, events, sc.Err()
}

// counts is e.g. "52 passed, 8 failed, 6 skipped".
func (r results) counts() string {
	s := fmt.Sprintf("%d passed, %d failed, %d skipped", len(r.byAction["pass"]), len(r.byAction["fail"]), len(r.byAction["skip"]))
	if n := len(r.byAction["incomplete"]); n > 0 {
		s += fmt.Sprintf(", %d incomplete", n)
	}
	return s
}

// table lists the tests that did not pass, and those that did.
func (r results) table() string {
	var b strings.Builder
	for _, action := range []string{"fail", "incomplete", "skip", "pass"} {
		names := r.byAction[action]
		if len(names) == 0 {
			continue
		}
		fmt.Fprintf(&b, "  %s (%d):", action, len(names))
		for _, name := range names {
			fmt.Fprintf(&b, " %s", name)
			if action != "pass" {
				fmt.Fprintf(&b, " (%.1fs)", r.elapsed[name])
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
