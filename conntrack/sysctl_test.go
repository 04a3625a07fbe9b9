package conntrack

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeProc is a temporary /proc/sys and /sys/module holding the conntrack
// sysctls with the given values ("" leaves a file out).
type fakeProc struct {
	env    SysctlEnv
	writes []string // names written, in order
}

const hashsizeName = "hashsize"

func newFakeProc(t *testing.T, values map[string]string, failWrites map[string]error) *fakeProc {
	t.Helper()
	dir := t.TempDir()
	p := &fakeProc{env: SysctlEnv{ProcSys: filepath.Join(dir, "proc", "sys"), SysModule: filepath.Join(dir, "sys", "module"), NumCPU: 4}}
	for name, v := range values {
		path := p.path(name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p.env.writeFile = func(path string, data []byte) error {
		name := filepath.Base(path)
		if err := failWrites[name]; err != nil {
			return &fs.PathError{Op: "open", Path: path, Err: err}
		}
		p.writes = append(p.writes, name)
		return os.WriteFile(path, data, 0o644)
	}
	return p
}

func (p *fakeProc) path(name string) string {
	if name == hashsizeName {
		return filepath.Join(p.env.SysModule, "nf_conntrack", "parameters", name)
	}
	return filepath.Join(p.env.ProcSys, "net", "netfilter", name)
}

func (p *fakeProc) value(t *testing.T, name string) int {
	t.Helper()
	v, err := readInt(p.path(name))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// kernelDefaults are a kernel's values for the sysctls we set.
func kernelDefaults() map[string]string {
	return map[string]string{
		"nf_conntrack_max":                     "65536",
		hashsizeName:                           "16384",
		"nf_conntrack_tcp_timeout_established": "432000",
		"nf_conntrack_tcp_timeout_close_wait":  "60",
		"nf_conntrack_udp_timeout":             "30",
		"nf_conntrack_udp_timeout_stream":      "120",
		"nf_conntrack_tcp_be_liberal":          "0",
	}
}

// upstreamDefaults is kube-proxy's default configuration plus UDP
// timeouts and liberal TCP.
var upstreamDefaults = Sysctls{
	MaxPerCore: 32768, Min: 131072,
	TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour,
	UDPTimeout: 45 * time.Second, UDPStreamTimeout: 150 * time.Second, TCPBeLiberal: true,
}

func TestApplySysctls(t *testing.T) {
	p := newFakeProc(t, kernelDefaults(), nil)
	skipped, err := ApplySysctls(upstreamDefaults, p.env)
	if err != nil || len(skipped) != 0 {
		t.Fatalf("skipped %v, err %v", skipped, err)
	}
	for name, want := range map[string]int{
		"nf_conntrack_max":                     131072, // 32768 × 4 CPUs
		hashsizeName:                           32768,  // max / 4
		"nf_conntrack_tcp_timeout_established": 86400,
		"nf_conntrack_tcp_timeout_close_wait":  3600,
		"nf_conntrack_udp_timeout":             45,
		"nf_conntrack_udp_timeout_stream":      150,
		"nf_conntrack_tcp_be_liberal":          1,
	} {
		if got := p.value(t, name); got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}

	// Applying again writes nothing: every value is already right.
	p.writes = nil
	if _, err := ApplySysctls(upstreamDefaults, p.env); err != nil || len(p.writes) != 0 {
		t.Errorf("second apply wrote %v, err %v", p.writes, err)
	}
}

func TestApplySysctlsLeavesZeroValuesAlone(t *testing.T) {
	p := newFakeProc(t, kernelDefaults(), nil)
	// --conntrack-max-per-core=0 and zero timeouts: what a proxy in a
	// namespace is told to use upstream.
	if _, err := ApplySysctls(Sysctls{Min: 131072}, p.env); err != nil || len(p.writes) != 0 {
		t.Errorf("wrote %v, err %v", p.writes, err)
	}
}

func TestConntrackMax(t *testing.T) {
	for _, tc := range []struct {
		s      Sysctls
		cpus   int
		want   int
		reason string
	}{
		{Sysctls{MaxPerCore: 32768, Min: 131072}, 2, 131072, "floor"},
		{Sysctls{MaxPerCore: 32768, Min: 131072}, 8, 262144, "scaled"},
		{Sysctls{MaxPerCore: 32768, Min: 131072}, 64, maxConntrackMax, "capped"},
		{Sysctls{MaxPerCore: 0, Min: 131072}, 8, 0, "left alone"},
		{Sysctls{MaxPerCore: -1, Min: 131072}, 8, 0, "left alone"},
	} {
		if got := tc.s.conntrackMax(tc.cpus); got != tc.want {
			t.Errorf("%s: %+v on %d CPUs: %d, want %d", tc.reason, tc.s, tc.cpus, got, tc.want)
		}
	}
}

func TestApplySysctlsHashsize(t *testing.T) {
	t.Run("large enough", func(t *testing.T) {
		vals := kernelDefaults()
		vals[hashsizeName] = "1000000"
		p := newFakeProc(t, vals, nil)
		if _, err := ApplySysctls(Sysctls{MaxPerCore: 32768}, p.env); err != nil {
			t.Fatal(err)
		}
		if got := p.value(t, hashsizeName); got != 1000000 {
			t.Errorf("hashsize shrunk to %d", got)
		}
	})
	t.Run("absent", func(t *testing.T) {
		vals := kernelDefaults()
		delete(vals, hashsizeName)
		p := newFakeProc(t, vals, nil)
		skipped, err := ApplySysctls(Sysctls{MaxPerCore: 32768}, p.env)
		if err != nil || strings.Join(skipped, ",") != "hashsize=32768 (no such file or directory)" {
			t.Errorf("skipped %v, err %v; want the hash size skipped and logged", skipped, err)
		}
	})
}

// TestApplySysctlsNeverLowersMax: as upstream since v1.37, nf_conntrack_max
// is only raised, and the hash size is checked on its own: a node whose
// administrator set a higher limit keeps it and still gets its buckets.
func TestApplySysctlsNeverLowersMax(t *testing.T) {
	for _, tc := range []struct {
		name          string
		max, hashsize string
		wantMax       int
		wantHashsize  int
		wantWrites    string
	}{
		{"lower: raised", "65536", "16384", 131072, 32768, "nf_conntrack_max,hashsize"},
		{"equal: left", "131072", "16384", 131072, 32768, "hashsize"},
		{"higher: left", "262144", "16384", 262144, 32768, "hashsize"},
		{"higher, buckets enough: nothing written", "262144", "65536", 262144, 65536, ""},
		{"unreadable: written", "not a number", "16384", 131072, 32768, "nf_conntrack_max,hashsize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := map[string]string{"nf_conntrack_max": tc.max, hashsizeName: tc.hashsize}
			p := newFakeProc(t, vals, nil)
			if _, err := ApplySysctls(Sysctls{MaxPerCore: 32768, Min: 131072}, p.env); err != nil {
				t.Fatal(err)
			}
			if got := p.value(t, "nf_conntrack_max"); got != tc.wantMax {
				t.Errorf("nf_conntrack_max = %d, want %d", got, tc.wantMax)
			}
			if got := p.value(t, hashsizeName); got != tc.wantHashsize {
				t.Errorf("hashsize = %d, want %d", got, tc.wantHashsize)
			}
			if got := strings.Join(p.writes, ","); got != tc.wantWrites {
				t.Errorf("wrote %q, want %q", got, tc.wantWrites)
			}
		})
	}
}

// TestApplySysctlsReadOnly: what a network namespace looks like. The
// read-only and absent sysctls are skipped, the others set, no error.
func TestApplySysctlsReadOnly(t *testing.T) {
	vals := kernelDefaults()
	delete(vals, "nf_conntrack_udp_timeout_stream")
	p := newFakeProc(t, vals, map[string]error{"nf_conntrack_max": unix.EACCES, "nf_conntrack_tcp_be_liberal": unix.EROFS})
	skipped, err := ApplySysctls(upstreamDefaults, p.env)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"nf_conntrack_max=131072 (permission denied)",
		"nf_conntrack_udp_timeout_stream=150 (no such file or directory)",
		"nf_conntrack_tcp_be_liberal=1 (read-only file system)",
	}
	if strings.Join(skipped, "\n") != strings.Join(want, "\n") {
		t.Errorf("skipped:\n%s\nwant:\n%s", strings.Join(skipped, "\n"), strings.Join(want, "\n"))
	}
	if got := p.value(t, hashsizeName); got != 32768 {
		t.Errorf("hashsize %d, want 32768: it is checked whether or not nf_conntrack_max could be set", got)
	}
	if got := p.value(t, "nf_conntrack_udp_timeout"); got != 45 {
		t.Errorf("udp timeout %d, want 45", got)
	}
}

func TestApplySysctlsOtherErrors(t *testing.T) {
	p := newFakeProc(t, kernelDefaults(), map[string]error{"nf_conntrack_tcp_timeout_close_wait": unix.EINVAL})
	_, err := ApplySysctls(upstreamDefaults, p.env)
	if !errors.Is(err, unix.EINVAL) || !strings.Contains(err.Error(), "nf_conntrack_tcp_timeout_close_wait") {
		t.Errorf("err %v, want EINVAL naming the sysctl", err)
	}
	if got := p.value(t, "nf_conntrack_udp_timeout"); got != 45 {
		t.Errorf("the sysctls after the failure were not set: udp timeout %d", got)
	}
}

func TestCountCPUList(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-3": 4, "0-3,6,8-9": 7, "": -1, "3-1": -1, "a": -1} {
		n, ok := countCPUList(list)
		if !ok {
			n = -1
		}
		if n != want {
			t.Errorf("countCPUList(%q) = %d, want %d", list, n, want)
		}
	}
	if n := MachineCPUs(t.TempDir()); n != runtime.NumCPU() {
		t.Errorf("MachineCPUs without /sys: %d, want runtime.NumCPU %d", n, runtime.NumCPU())
	}
	if n := MachineCPUs("/sys"); n < 1 {
		t.Errorf("MachineCPUs(/sys) = %d", n)
	}
}

// TestApplySysctlsInNamespace applies the sysctls for real, from a thread
// inside a fresh namespace (its /proc/sys/net is the namespace's): the
// per-namespace timeouts are set, nf_conntrack_max and the hash size
// (global, read-only there) are logged and left alone, and nothing fails.
func TestApplySysctlsInNamespace(t *testing.T) {
	ns := newTestNS(t)
	want := upstreamDefaults
	want.MaxPerCore = 1 << 20 // capped at maxConntrackMax
	env := DefaultSysctlEnv()
	// What the node has decides what a namespace's proxy tries to raise:
	// both are global, read-only in the namespace.
	var wantSkipped []string
	if cur, err := readInt(filepath.Join(env.ProcSys, "net", "netfilter", "nf_conntrack_max")); err != nil || cur < maxConntrackMax {
		wantSkipped = append(wantSkipped, "nf_conntrack_max="+strconv.Itoa(maxConntrackMax))
	}
	if cur, err := readInt(filepath.Join(env.SysModule, "nf_conntrack", "parameters", "hashsize")); err != nil || cur < maxConntrackMax/4 {
		wantSkipped = append(wantSkipped, "hashsize="+strconv.Itoa(maxConntrackMax/4))
	}

	var skipped []string
	var applyErr error
	values := map[string]int{}
	done := make(chan error)
	go func() {
		// A thread of its own, never returned to the runtime: it dies
		// with this goroutine, in whatever namespace it is.
		runtime.LockOSThread()
		if err := unix.Setns(ns.Fd, unix.CLONE_NEWNET); err != nil {
			done <- err
			return
		}
		if err := sameNetNS(ns.Fd); err != nil {
			done <- err
			return
		}
		skipped, applyErr = ApplySysctls(want, env)
		for _, name := range []string{"nf_conntrack_max", "nf_conntrack_tcp_timeout_established", "nf_conntrack_tcp_timeout_close_wait",
			"nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream", "nf_conntrack_tcp_be_liberal"} {
			v, err := readInt(filepath.Join(env.ProcSys, "net", "netfilter", name))
			if err != nil {
				done <- err
				return
			}
			values[name] = v
		}
		done <- nil
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if applyErr != nil {
		t.Fatalf("ApplySysctls in a namespace: %v", applyErr)
	}
	if len(skipped) != len(wantSkipped) {
		t.Errorf("skipped %v, want %v", skipped, wantSkipped)
	}
	for i, w := range wantSkipped {
		if i < len(skipped) && !strings.HasPrefix(skipped[i], w+" ") {
			t.Errorf("skipped %v, want %v", skipped, wantSkipped)
		}
	}
	t.Logf("skipped in a namespace: %v", skipped)
	for name, v := range map[string]int{"nf_conntrack_tcp_timeout_established": 86400, "nf_conntrack_tcp_timeout_close_wait": 3600,
		"nf_conntrack_udp_timeout": 45, "nf_conntrack_udp_timeout_stream": 150, "nf_conntrack_tcp_be_liberal": 1} {
		if values[name] != v {
			t.Errorf("%s = %d in the namespace, want %d", name, values[name], v)
		}
	}
}

// sameNetNS checks that the calling thread is in the namespace of fd, so
// that a test never writes the node's own sysctls.
func sameNetNS(fd int) error {
	var want, got unix.Stat_t
	if err := unix.Fstat(fd, &want); err != nil {
		return err
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &got); err != nil {
		return err
	}
	if want.Ino != got.Ino || want.Dev != got.Dev {
		return errors.New("setns did not move the thread into the test namespace")
	}
	return nil
}
