package nodes

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// suitesFromEnv returns the releases NFTPROXY_NODES_SUITES names
// ("bookworm,trixie"), all of Releases without it: a slice of its own,
// which callers may filter in place.
func suitesFromEnv(t *testing.T) []Release {
	t.Helper()
	env := os.Getenv("NFTPROXY_NODES_SUITES")
	if env == "" {
		return slices.Clone(Releases)
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

// hostReleases are the releases of suitesFromEnv whose programs run on this
// machine: those of its architecture.
func hostReleases(t *testing.T) []Release {
	return slices.DeleteFunc(suitesFromEnv(t), func(r Release) bool { return r.arch().GOARCH != runtime.GOARCH })
}

// requireNodes skips the test unless NFTPROXY_NODES=1 (it boots a VM per
// release, minutes each), and installs QEMU when it is missing.
func requireNodes(t *testing.T) {
	t.Helper()
	if os.Getenv("NFTPROXY_NODES") != "1" {
		t.Skip("boots Debian releases under QEMU for minutes each: set NFTPROXY_NODES=1 (make nodes)")
	}
	for _, a := range archs {
		if _, err := exec.LookPath(a.QEMU); err != nil {
			deps := filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "deps.sh")
			if out, err := exec.Command(deps).CombinedOutput(); err != nil {
				t.Fatalf("%s (for %s): %v\n%s", deps, a.QEMU, err, out)
			}
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

// testBinary is a package's test binary and what a node needs to run its
// kernel tests.
type testBinary struct {
	pkg   string   // as in kernelPackages: "nft/nftnl"
	bin   string   // the static binary, on the host
	tests []string // its kernel tests (kernelTests)
	// files are the package's testdata, guest path → host path: a test
	// runs in its package's directory, /root/src/<pkg>, as go test runs it.
	files map[string]string
}

// guestBin is where a node finds the binary.
func (b testBinary) guestBin() string {
	return "/root/bin/" + strings.ReplaceAll(b.pkg, "/", "-") + ".test"
}

// buildTestBinaries builds each package's tests as a static binary (no
// cgo: the guest has the release's glibc, not the host's) and finds its
// kernel tests and testdata.
func buildTestBinaries(t *testing.T, pkgs []string, goarch string) []testBinary {
	t.Helper()
	// Not t.TempDir: Ctrl-C would leave it behind.
	dir, remove, err := TempDir(kubebin.CacheDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	root := kubebin.RepoRoot()
	var bins []testBinary
	for _, pkg := range pkgs {
		b := testBinary{pkg: pkg, bin: filepath.Join(dir, strings.ReplaceAll(pkg, "/", "-")+"-"+goarch+".test"), files: map[string]string{}}
		cmd := exec.Command("go", "test", "-c", "-vet=off", "-o", b.bin, "./"+pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("GOARCH=%s go test -c ./%s: %v\n%s", goarch, pkg, err, out)
		}
		if b.tests, err = kernelTests(filepath.Join(root, pkg)); err != nil {
			t.Fatal(err)
		}
		testdata := filepath.Join(root, pkg, "testdata")
		err := filepath.WalkDir(testdata, func(p string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) && p == testdata {
				return fs.SkipAll
			}
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			b.files["/root/src/"+filepath.ToSlash(rel)] = p
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		bins = append(bins, b)
	}
	return bins
}

// Lines a job prints between its parts: the versions, then each package's
// test output between a start and an exit line.
const (
	testsStart   = "nodes: tests start"
	packageStart = "nodes: package "
	packageExit  = "nodes: exit status "
)

// kernelTestsScript prints the tools' own versions, then runs each
// package's kernel tests (-short) in its directory, in the format go tool
// test2json reads on the host.
func kernelTestsScript(bins []testBinary) string {
	var b strings.Builder
	b.WriteString(`uname -r; nft --version; ip -V; conntrack --version; iptables-nft --version; busybox | head -n 1
echo "` + testsStart + `"
`)
	// Each package's lines carry the guest's uptime (/proc/uptime, in
	// seconds), which times its run.
	for _, bin := range bins {
		fmt.Fprintf(&b, "printf '\\n%%s%%s\\n' '%s%s ' \"$(cut -d' ' -f1 /proc/uptime)\"\n", packageStart, bin.pkg)
		fmt.Fprintf(&b, "mkdir -p /root/src/%s && cd /root/src/%s\n", bin.pkg, bin.pkg)
		fmt.Fprintf(&b, "%s -test.v=test2json -test.short -test.timeout=%s -test.run '%s' 2>&1\n",
			bin.guestBin(), packageTimeout, runPattern(bin.tests))
		fmt.Fprintf(&b, "printf '\\n%%s%%d %%s\\n' '%s' $? \"$(cut -d' ' -f1 /proc/uptime)\"\n", packageExit)
	}
	return b.String()
}

// packageTimeout bounds each package's run in the guest (-test.timeout).
const packageTimeout = 30 * time.Minute

// TestKernelTests runs the kernel tests of kernelPackages (-short) on
// each release's kernel and tools, booted under QEMU (one boot per
// release, the packages one after the other), and reports each test's
// result per release and package. It fails when a test fails on a
// release, and when the harness could not run the tests or collect every
// result. Each release's output, console and results (results.json) are
// left in bin/nodes/<suite>.
func TestKernelTests(t *testing.T) {
	requireNodes(t)
	releases := suitesFromEnv(t)
	bins := map[string][]testBinary{} // by GOARCH
	var summaries []string
	for _, r := range releases {
		goarch := r.arch().GOARCH
		if bins[goarch] == nil {
			bins[goarch] = buildTestBinaries(t, kernelPackages, goarch)
		}
		t.Run(r.Name(), func(t *testing.T) {
			s := runKernelTests(t, r, bins[goarch])
			summaries = append(summaries, s)
		})
	}
	t.Logf("kernel tests (-test.short) per release:\n%s", strings.Join(summaries, "\n"))
}

// runKernelTests runs the tests on one release and returns a summary.
func runKernelTests(t *testing.T, r Release, bins []testBinary) string {
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

	files := map[string]string{}
	for _, b := range bins {
		files[b.guestBin()] = b.bin
		maps.Copy(files, b.files)
	}
	res, err := n.Run(ctx, Job{
		Files:     files,
		Script:    kernelTestsScript(bins),
		Timeout:   time.Duration(len(bins)) * packageTimeout,
		MemoryMiB: 2048,
	})
	dir := outDir(t, r.Name())
	os.WriteFile(filepath.Join(dir, "console.txt"), []byte(res.Console), 0o644)
	os.WriteFile(filepath.Join(dir, "output.txt"), []byte(res.Output), 0o644)
	if err != nil {
		t.Fatalf("run on %s: %v", r, err)
	}
	header, output, ok := strings.Cut(res.Output, testsStart+"\n")
	if !ok {
		t.Fatalf("the job's output lacks %q (exit status %d):\n%s", testsStart, res.ExitCode, tail(res.Output, 30))
	}
	t.Logf("in the guest:\n%s", strings.TrimSpace(header))
	rr := ReleaseResults{
		Suite: r.Suite, Version: r.Version, Arch: r.Arch, Kernel: n.Kernel(), Date: time.Now().UTC().Format(time.RFC3339),
		Tools: map[string]string{}, Boot: res.Boot.Seconds(), Setup: res.Setup.Seconds(), Duration: res.Duration.Seconds(),
	}
	for _, tool := range []string{"nft", "ip", "conntrack", "iptables"} {
		rr.Tools[tool] = n.Tool(tool)
	}
	sections := packageSections(output)
	var events []byte
	for _, b := range bins {
		sec, ok := sections[b.pkg]
		if !ok {
			t.Errorf("%s: no output of %s's tests:\n%s", r.Name(), b.pkg, tail(output, 30))
			continue
		}
		pr, ev, err := packageResultsOf(ctx, b, sec)
		events = append(events, ev...)
		if err != nil {
			t.Errorf("%s, %s: %v", r.Name(), b.pkg, err)
			continue
		}
		rr.Packages = append(rr.Packages, pr)
		checkPackage(t, r, pr, sec.body)
	}
	os.WriteFile(filepath.Join(dir, "events.json"), events, 0o644)
	if err := writeJSON(filepath.Join(dir, "results.json"), rr); err != nil {
		t.Error(err)
	}
	summary := rr.Summary()
	t.Logf("%s", summary)
	os.WriteFile(filepath.Join(dir, "results.txt"), []byte(summary), 0o644)
	return summary
}

// checkPackage fails the test for each of a package's tests that failed,
// never ended, or never ran on the release.
func checkPackage(t *testing.T, r Release, pr PackageResults, output string) {
	t.Helper()
	for _, tr := range pr.Tests {
		switch tr.Action {
		case "fail":
			if strings.Contains(tr.Name, "/") {
				continue
			}
			// Its failed subtests' output, which holds the reasons.
			out := tr.Output
			for _, sub := range pr.Tests {
				if sub.Action == "fail" && strings.HasPrefix(sub.Name, tr.Name+"/") {
					out = sub.Output + out
				}
			}
			t.Errorf("%s, %s: %s failed:\n%s", r.Name(), pr.Package, tr.Name, tail(out, 20))
		case "incomplete":
			t.Errorf("%s, %s: %s started but never ended (the binary crashed or timed out; exit status %d):\n%s",
				r.Name(), pr.Package, tr.Name, pr.ExitCode, tail(output, 30))
		}
	}
	if len(pr.Missing) > 0 {
		t.Errorf("%s, %s: tests never ran: %v (exit status %d):\n%s", r.Name(), pr.Package, pr.Missing, pr.ExitCode, tail(output, 30))
	}
	if pr.Fail == 0 && pr.Incomplete == 0 && pr.ExitCode != 0 {
		t.Errorf("%s, %s: exit status %d, yet no test failed:\n%s", r.Name(), pr.Package, pr.ExitCode, tail(output, 30))
	}
	if pr.Fail > 0 && pr.ExitCode == 0 {
		t.Errorf("%s, %s: tests failed, but the test binary exited 0", r.Name(), pr.Package)
	}
}

// section is a package's part of a job's output.
type section struct {
	start float64 // the guest's uptime when it started, in seconds
	body  string  // its output, ending with its exit status line
}

// packageSections splits the tests' output of a job into each package's.
func packageSections(output string) map[string]section {
	sections := map[string]section{}
	parts := strings.Split(output, "\n"+packageStart)
	for _, part := range parts[1:] {
		line, body, _ := strings.Cut(part, "\n")
		pkg, uptime, _ := strings.Cut(line, " ")
		s := section{body: body}
		fmt.Sscan(uptime, &s.start)
		sections[pkg] = s
	}
	return sections
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
	Output  string
}

// packageResultsOf converts a package's -test.v=test2json output (its
// section of the job's output, ending with its exit status line) to
// test2json's events and reads each test's outcome.
func packageResultsOf(ctx context.Context, b testBinary, sec section) (PackageResults, []byte, error) {
	pr := PackageResults{Package: b.pkg, Selected: b.tests, ExitCode: -1}
	body, status, found := cutLast(sec.body, "\n"+packageExit)
	if found {
		var end float64
		if n, _ := fmt.Sscan(status, &pr.ExitCode, &end); n == 2 && sec.start > 0 {
			pr.Elapsed = end - sec.start
		}
	}
	cmd := exec.CommandContext(ctx, "go", "tool", "test2json", "-t", "-p", b.pkg)
	cmd.Stdin = strings.NewReader(body)
	events, err := cmd.Output()
	if err != nil && len(events) == 0 {
		return pr, nil, fmt.Errorf("go tool test2json: %w", err)
	}
	outputs := map[string]*strings.Builder{}
	started := map[string]int{} // name → index in pr.Tests
	sc := bufio.NewScanner(bytes.NewReader(events))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var e testEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return pr, events, fmt.Errorf("test2json: %w: %s", err, sc.Bytes())
		}
		if e.Test == "" {
			continue
		}
		switch e.Action {
		case "run":
			started[e.Test] = -1
			outputs[e.Test] = &strings.Builder{}
		case "output":
			if o := outputs[e.Test]; o != nil && o.Len() < 64<<10 {
				o.WriteString(e.Output)
			}
		case "pass", "fail", "skip":
			tr := TestResult{Name: e.Test, Action: e.Action, Elapsed: e.Elapsed}
			out := outputs[e.Test].String()
			switch e.Action {
			case "skip":
				tr.Reason = skipReason(out)
			case "fail":
				tr.Output = out
			}
			delete(started, e.Test)
			pr.Tests = append(pr.Tests, tr)
		}
	}
	if err := sc.Err(); err != nil {
		return pr, events, err
	}
	var incomplete []string
	for name := range started {
		incomplete = append(incomplete, name)
	}
	slices.Sort(incomplete)
	for _, name := range incomplete {
		pr.Tests = append(pr.Tests, TestResult{Name: name, Action: "incomplete", Output: outputs[name].String()})
	}
	seen := map[string]bool{}
	for _, tr := range pr.Tests {
		seen[tr.Name] = true
		if strings.Contains(tr.Name, "/") {
			continue
		}
		switch tr.Action {
		case "pass":
			pr.Pass++
		case "fail":
			pr.Fail++
		case "skip":
			pr.Skip++
		case "incomplete":
			pr.Incomplete++
		}
	}
	for _, name := range b.tests {
		if !seen[name] {
			pr.Missing = append(pr.Missing, name)
		}
	}
	if !found {
		return pr, events, fmt.Errorf("the output lacks the binary's exit status (the run ended inside it)")
	}
	return pr, events, nil
}

// cutLast is strings.Cut at the last sep.
func cutLast(s, sep string) (before, after string, found bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// skipReason is a skipped test's message: its last line that is not
// go test's own ("=== RUN", "--- SKIP"), without the file and line.
func skipReason(output string) string {
	lines := strings.Split(strings.TrimRight(output, "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "=== ") || strings.HasPrefix(l, "--- ") {
			continue
		}
		if file, msg, ok := strings.Cut(l, ": "); ok && strings.Contains(file, ".go:") && !strings.Contains(file, " ") {
			return msg
		}
		return l
	}
	return ""
}

// TestPackageResults reads a package's part of a job's output: each test's
// outcome, a skip's reason, a failure's output, the tests that never ran,
// the binary's exit status and how long it ran.
func TestPackageResults(t *testing.T) {
	output := "nft 1.0.6\n" + testsStart + "\n\n" + packageStart + "x/y 10.25\n" + `=== RUN   TestA
--- PASS: TestA (0.10s)
=== RUN   TestB
    b_test.go:12: kernel 6.1.0-56-amd64 lacks NFT_TABLE_F_PERSIST (6.9)
--- SKIP: TestB (0.00s)
=== RUN   TestC
=== RUN   TestC/sub
    c_test.go:3: boom
--- FAIL: TestC/sub (0.20s)
--- FAIL: TestC (0.20s)
FAIL
` + "\n" + packageExit + "1 22.75\n"
	_, tests, _ := strings.Cut(output, testsStart+"\n")
	sections := packageSections(tests)
	sec, ok := sections["x/y"]
	if !ok || sec.start != 10.25 {
		t.Fatalf("sections %+v", sections)
	}
	b := testBinary{pkg: "x/y", tests: []string{"TestA", "TestB", "TestC", "TestD"}}
	pr, _, err := packageResultsOf(t.Context(), b, sec)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Pass != 1 || pr.Skip != 1 || pr.Fail != 1 || pr.ExitCode != 1 || pr.Elapsed != 12.5 || !slices.Equal(pr.Missing, []string{"TestD"}) {
		t.Errorf("results %+v", pr)
	}
	byName := map[string]TestResult{}
	for _, tr := range pr.Tests {
		byName[tr.Name] = tr
	}
	if r := byName["TestB"].Reason; r != "kernel 6.1.0-56-amd64 lacks NFT_TABLE_F_PERSIST (6.9)" {
		t.Errorf("skip reason %q", r)
	}
	if o := byName["TestC/sub"].Output; !strings.Contains(o, "boom") || byName["TestC/sub"].Action != "fail" {
		t.Errorf("TestC/sub: %+v", byName["TestC/sub"])
	}
	// A run that ended inside the binary: no exit status line.
	cut, _, _ := strings.Cut(sec.body, packageExit)
	if _, _, err := packageResultsOf(t.Context(), b, section{body: cut}); err == nil {
		t.Error("no error for output without the exit status line")
	}
}
