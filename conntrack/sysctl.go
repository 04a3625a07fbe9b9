package conntrack

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Sysctls is the conntrack part of kube-proxy's configuration
// (KubeProxyConntrackConfiguration) in kernel terms. A zero value leaves
// the kernel's setting alone, as upstream does.
type Sysctls struct {
	// MaxPerCore × the node's CPUs, at least Min and at most 2²⁰ (upstream
	// caps it so), is nf_conntrack_max; MaxPerCore ≤ 0 leaves it (and
	// Min) alone.
	MaxPerCore int
	Min        int
	// Timeouts, rounded down to seconds.
	TCPEstablishedTimeout time.Duration // nf_conntrack_tcp_timeout_established
	TCPCloseWaitTimeout   time.Duration // nf_conntrack_tcp_timeout_close_wait
	UDPTimeout            time.Duration // nf_conntrack_udp_timeout
	UDPStreamTimeout      time.Duration // nf_conntrack_udp_timeout_stream
	// TCPBeLiberal sets nf_conntrack_tcp_be_liberal to 1; false leaves it.
	TCPBeLiberal bool
}

// maxConntrackMax is upstream's cap on the scaled nf_conntrack_max (1M
// entries), so that a 256-core node does not reserve 8M entries.
const maxConntrackMax = 1 << 20

// SysctlEnv is where ApplySysctls reads and writes; tests point it at a
// temporary directory.
type SysctlEnv struct {
	ProcSys   string // /proc/sys
	SysModule string // /sys/module: nf_conntrack/parameters/hashsize
	NumCPU    int    // the node's CPUs (MachineCPUs)

	// writeFile replaces os.WriteFile in tests, which cannot make a file
	// read-only for root.
	writeFile func(name string, data []byte) error
}

// DefaultSysctlEnv is the real node's.
func DefaultSysctlEnv() SysctlEnv {
	return SysctlEnv{ProcSys: "/proc/sys", SysModule: "/sys/module", NumCPU: MachineCPUs("/sys")}
}

// conntrackMax is nf_conntrack_max for numCPU CPUs, 0 to leave it alone
// (upstream's getConntrackMax).
func (s Sysctls) conntrackMax(numCPU int) int {
	if s.MaxPerCore <= 0 {
		return 0
	}
	scaled := s.MaxPerCore * numCPU
	if scaled > maxConntrackMax {
		return maxConntrackMax
	}
	return max(scaled, s.Min)
}

// ApplySysctls sets the conntrack sysctls s asks for as upstream kube-proxy
// v1.37 does (pkg/proxy/conntrack/sysctls.go): nf_conntrack_max is only
// ever raised (a node whose administrator set a higher limit keeps it); the
// hash table is then grown to nf_conntrack_max/4 buckets when it has fewer,
// whether or not the limit was written (a node booted with the limit set
// but the module's default hash size gets its buckets too); the timeouts
// and liberal TCP are written when they differ from the kernel's value.
//
// A sysctl that is read-only or absent here is not an error: inside a
// network namespace nf_conntrack_max is read-only (it is global) and the
// hash size can only be changed from the initial namespace, so a proxy in
// a test namespace leaves them alone where upstream refuses to start.
// ApplySysctls logs such sysctls once, together, and returns their names.
// Other failures (an invalid value, say) are returned as an error after
// every other sysctl was tried.
func ApplySysctls(s Sysctls, env SysctlEnv) (skipped []string, err error) {
	if env.writeFile == nil {
		env.writeFile = func(name string, data []byte) error { return os.WriteFile(name, data, 0o644) }
	}
	a := &applier{env: env}
	if limit := s.conntrackMax(env.NumCPU); limit > 0 {
		a.raise("nf_conntrack_max", limit)
		a.growHashsize(limit / 4)
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{
		{"nf_conntrack_tcp_timeout_established", s.TCPEstablishedTimeout},
		{"nf_conntrack_tcp_timeout_close_wait", s.TCPCloseWaitTimeout},
		{"nf_conntrack_udp_timeout", s.UDPTimeout},
		{"nf_conntrack_udp_timeout_stream", s.UDPStreamTimeout},
	} {
		if secs := int(t.d / time.Second); secs > 0 {
			a.set(t.name, secs)
		}
	}
	if s.TCPBeLiberal {
		a.set("nf_conntrack_tcp_be_liberal", 1)
	}
	if len(a.skipped) > 0 {
		klog.InfoS("Leaving conntrack sysctls as they are: read-only or absent here (nf_conntrack_max and the hash size belong to the initial network namespace)",
			"sysctls", a.skipped)
	}
	return a.skipped, errors.Join(a.errs...)
}

type applier struct {
	env     SysctlEnv
	skipped []string
	errs    []error
}

// set writes one net/netfilter sysctl unless it already has value.
func (a *applier) set(name string, value int) {
	path := filepath.Join(a.env.ProcSys, "net", "netfilter", name)
	cur, err := readInt(path)
	if err == nil && cur == value {
		return
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		a.errs = append(a.errs, fmt.Errorf("read %s: %w", path, err))
		return
	}
	if err == nil {
		err = a.env.writeFile(path, []byte(strconv.Itoa(value)))
	}
	a.outcome(name, path, value, err)
}

// raise writes one net/netfilter sysctl when the kernel's value is lower
// than value, or cannot be read (upstream writes then too).
func (a *applier) raise(name string, value int) {
	path := filepath.Join(a.env.ProcSys, "net", "netfilter", name)
	cur, err := readInt(path)
	switch {
	case err == nil && cur >= value:
		klog.V(2).InfoS("Leaving conntrack sysctl: not lower than wanted", "path", path, "value", cur, "wanted", value)
		return
	case errors.Is(err, fs.ErrNotExist):
	default:
		err = a.env.writeFile(path, []byte(strconv.Itoa(value)))
	}
	a.outcome(name, path, value, err)
}

// growHashsize sets the hash table's bucket count to buckets if it has
// fewer (upstream: "hashsize is large enough for nf_conntrack_max").
// Upstream refuses to start when it cannot read the parameter; here an
// absent one (nf_conntrack not loaded yet) is skipped and logged like any
// other sysctl that is not there, and a read-only one (a namespace, a
// read-only /sys) likewise.
func (a *applier) growHashsize(buckets int) {
	path := filepath.Join(a.env.SysModule, "nf_conntrack", "parameters", "hashsize")
	cur, err := readInt(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		a.outcome("hashsize", path, buckets, err)
		return
	case err != nil:
		a.errs = append(a.errs, fmt.Errorf("read %s: %w", path, err))
		return
	case cur >= buckets:
		return
	}
	a.outcome("hashsize", path, buckets, a.env.writeFile(path, []byte(strconv.Itoa(buckets))))
}

// outcome records the result of a write.
func (a *applier) outcome(name, path string, value int, err error) {
	switch {
	case err == nil:
		klog.InfoS("Set conntrack sysctl", "path", path, "value", value)
	case skippable(err):
		a.skipped = append(a.skipped, fmt.Sprintf("%s=%d (%v)", name, value, reason(err)))
	default:
		a.errs = append(a.errs, fmt.Errorf("set %s to %d: %w", path, value, err))
	}
}

// skippable errors mean "not ours to set here": absent (nf_conntrack not
// loaded, or an older kernel), read-only (a namespace's global sysctl, a
// read-only /proc or /sys), or refused outside the initial namespace
// (hashsize: EOPNOTSUPP).
func skippable(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) ||
		errors.Is(err, unix.EROFS) || errors.Is(err, unix.EOPNOTSUPP)
}

func reason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// MachineCPUs counts the node's online CPUs from sysRoot/devices/system/
// cpu/online ("0-3,6"), not the CPUs this process may run on: pinned to
// two CPUs of a 64-CPU node, the proxy must still size the table for the
// node (kubernetes#99225; upstream reads the topology from /sys too). It
// falls back to runtime.NumCPU.
func MachineCPUs(sysRoot string) int {
	b, err := os.ReadFile(filepath.Join(sysRoot, "devices", "system", "cpu", "online"))
	if err != nil {
		return runtime.NumCPU()
	}
	n, ok := countCPUList(strings.TrimSpace(string(b)))
	if !ok || n < 1 {
		return runtime.NumCPU()
	}
	return n
}

// countCPUList counts the CPUs of a kernel CPU list such as "0-3,6,8-9".
func countCPUList(list string) (int, bool) {
	n := 0
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, false
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, false
			}
		}
		n += b - a + 1
	}
	return n, true
}
