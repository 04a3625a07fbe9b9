// Package netns gives a kernel test a network namespace of its own: the
// nftables and conntrack tests of nft, conntrack, proxier and cmd/nftproxy
// program the kernel only there, never in the root namespace. It lives
// under internal/ so that unit tests import nothing of e2e/; the e2e
// tests and e2e/cmd/sweep use it from here too.
package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// NS is a fresh, named network namespace.
type NS struct {
	Name string // as in `ip netns list`
	Fd   int    // open on /run/netns/Name until the test ends
}

// Require skips the test unless it runs as root with the tools it names
// (besides `ip`) on the PATH, where the kernel's netfilter netlink sockets
// can be opened.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root")
	}
	if err := netfilterSockets(); err != nil {
		t.Skipf("kernel test: needs NETLINK_NETFILTER sockets: %v", err)
	}
	for _, tool := range append([]string{"ip"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("kernel test: needs %s: %v", tool, err)
		}
	}
}

// netfilterSockets reports whether a NETLINK_NETFILTER socket can be
// opened. Under qemu-user (a test binary of another architecture, run with
// go test -exec qemu-aarch64-static) it cannot: qemu translates only the
// NETLINK_ROUTE, NETLINK_KOBJECT_UEVENT and NETLINK_AUDIT protocols, and
// refuses the others with EPROTONOSUPPORT. Kernel tests of another
// architecture run in a VM of it (e2e/nodes).
func netfilterSockets() error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

// New creates a namespace named <prefix>-<pid>-<random>, removed when the
// test ends (t.Cleanup) or when the test process gets SIGINT or SIGTERM
// (Ctrl-C of `go test`). What a process killed otherwise left behind (a
// panic in another goroutine, SIGKILL, a timeout) is removed by the next
// New in any test process, and by `go run ./e2e/cmd/sweep`: the pid in
// the name tells whose it was. It skips the test unless Require(t,
// tools...) holds.
func New(t testing.TB, prefix string, tools ...string) *NS {
	t.Helper()
	Require(t, tools...)
	once.Do(func() {
		if removed, err := Sweep(); err != nil || len(removed) > 0 {
			t.Logf("netns: removed leftovers %v (errors: %v)", removed, err)
		}
		onSignal()
	})
	name := fmt.Sprintf("%s-%d-%08x", prefix, os.Getpid(), rand.Uint32())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	live.Lock()
	live.names[name] = true
	live.Unlock()
	t.Cleanup(func() {
		live.Lock()
		delete(live.names, name)
		live.Unlock()
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

var (
	once sync.Once
	live = struct {
		sync.Mutex
		names map[string]bool
	}{names: map[string]bool{}}
)

// onSignal deletes this process's namespaces on SIGINT or SIGTERM, then
// exits: without it, Ctrl-C ends the test binary at once, cleanups unrun.
func onSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		live.Lock()
		for name := range live.names {
			exec.Command("ip", "netns", "delete", name).Run()
		}
		live.Unlock()
		os.Exit(128 + int(sig.(syscall.Signal)))
	}()
}

// owned matches the names New gives: nftproxy-…-<pid>-<8 hex digits>.
var owned = regexp.MustCompile(`^nftproxy-[a-z]+-([0-9]+)-[0-9a-f]{8}$`)

// Sweep deletes the namespaces New created in processes that are gone,
// and returns their names.
func Sweep() ([]string, error) {
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		m := owned.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // its process is alive (or the pid is reused: left alone)
		}
		if out, err := exec.Command("ip", "netns", "delete", e.Name()).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ip netns delete %s: %v: %s", e.Name(), err, out))
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
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

// Do runs fn on a thread inside the namespace, then returns the thread to
// its own namespace: sockets fn opens stay in ns.
func (ns *NS) Do(t testing.TB, fn func()) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	if err := unix.Setns(ns.Fd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: it dies with this goroutine instead
		// of running other goroutines in the test namespace.
		t.Fatalf("return to the original namespace: %v", err)
	}
	runtime.UnlockOSThread()
}

// WaitLocalRoutes waits until the kernel routes each of addrs, addresses
// of the namespace's own interfaces, as local. An IPv6 address can be
// bound as soon as it is added, but its local route is installed from a
// workqueue (addrconf's DAD work, nodad or not): until then a packet or a
// connection to it fails with "network is unreachable", which a loaded
// machine showed.
func (ns *NS) WaitLocalRoutes(t testing.TB, addrs ...netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, a := range addrs {
		for {
			out, err := ns.Run("", "ip", "route", "get", a.String())
			if err == nil && strings.HasPrefix(out, "local ") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s has no local route in %s after 10 s: %q, %v", a, ns.Name, out, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
