package testbed

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` mounts named namespaces.
const netnsDir = "/run/netns"

// Netns is a named network namespace of a bed. Node and Pod embed it, so n.Exec, n.Start
// and n.DialContext run in that node's or pod's namespace.
type Netns struct {
	// NS is the namespace's name, as in `ip netns list` and `ip -n NS`.
	NS  string
	bed *Bed
}

// Exec runs args in the namespace (via `ip netns exec`) and returns its standard output.
// A non-zero exit is an error that includes standard error.
func (n Netns) Exec(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS}, args...)...)
	cmd.Env = n.bed.processEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("in %s: %s: %w: %s", n.NS, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// MustExec is Exec with a minute's timeout that fails the test on an
// error, and otherwise returns standard output.
func (n Netns) MustExec(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := n.Exec(ctx, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return out
}

// Start starts a long-running process in the namespace, logging to a file in the bed's
// log directory. It is killed (with its process group) when the bed is cleaned up.
// Start fails the test if the process cannot be started; call it from the test goroutine.
func (n Netns) Start(args ...string) *Process {
	n.bed.t.Helper()
	p, err := n.bed.startProcess(n.NS, args)
	if err != nil {
		n.bed.t.Fatalf("start %v in %s: %v", args, n.NS, err)
	}
	return p
}

// DialContext dials from inside the namespace; use it as a rest.Config's Dial or an
// http.Transport's DialContext. The address must be an IP literal: name resolution would
// run on other threads, in the root namespace.
func (n Netns) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var conn net.Conn
	err := inNetns(filepath.Join(netnsDir, n.NS), func() error {
		var err error
		conn, err = new(net.Dialer).DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

// inNetns runs fn on an OS thread switched into the namespace at path. A socket belongs to
// the namespace its creating thread was in, and keeps it when the thread switches back.
// fn runs on a fresh goroutine: if the thread cannot be switched back, that goroutine exits
// with the thread still locked, and the Go runtime then terminates the thread instead of
// reusing it in the wrong namespace.
func inNetns(path string, fn func() error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer unix.Close(target)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", path, err)
			return
		}
		fnErr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns back from %s: %w", path, err) // thread dies locked
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// ipBatch runs iproute2 commands (one per line, without the leading "ip") in namespace ns
// with a single `ip -n NS -batch -`, which stops at the first failing line.
func ipBatch(ns string, lines ...string) error {
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -n %s -batch: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// sysctl sets kernel parameters ("net.ipv4.ip_forward=1") inside namespace ns.
func sysctl(ns string, settings ...string) error {
	args := append([]string{"netns", "exec", ns, "sysctl", "-q", "-w"}, settings...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("sysctl in %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// addNetns creates a namespace with loopback up. Duplicate address detection is turned
// off first, so that interfaces created in it later get usable IPv6 addresses at once
// instead of after about a second of "tentative" state.
func addNetns(ns string, settings ...string) error {
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	base := []string{"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"}
	if err := sysctl(ns, append(base, settings...)...); err != nil {
		return err
	}
	return ipBatch(ns, "link set lo up")
}

// waitLinkUp waits until the kernel reports dev in ns as operationally up. Right after
// `ip link set up` a veth can drop packets until the kernel's link watch has activated
// its queueing discipline, which made the first connection of a test flaky.
func waitLinkUp(ns, dev string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", dev).CombinedOutput()
		if err == nil && bytes.Contains(out, []byte(" state UP ")) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s in %s not up after 5s: %s", dev, ns, strings.TrimSpace(string(out)))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
