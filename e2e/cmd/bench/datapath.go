package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// nsThread runs functions on one OS thread that has entered a network
// namespace, so that every socket they create belongs to it and no
// namespace switch is part of a timed connection. close switches the thread
// back before releasing it: a thread must not simply end, because the
// processes the bed started carry a parent-death signal (SIGKILL) tied to
// the thread that forked them, which may be this one.
type nsThread struct {
	ns  string
	fns chan func()
}

func newNSThread(ns string) (*nsThread, error) {
	t := &nsThread{ns: ns, fns: make(chan func())}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		errc <- nil
		for f := range t.fns {
			f()
		}
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread ends with the goroutine: better than reusing it in the wrong namespace
	}()
	if err := <-errc; err != nil {
		return nil, fmt.Errorf("enter netns %s: %w", ns, err)
	}
	return t, nil
}

// do runs f on the thread and waits for it.
func (t *nsThread) do(f func()) {
	done := make(chan struct{})
	t.fns <- func() { defer close(done); f() }
	<-done
}

func (t *nsThread) close() { close(t.fns) }

// dialOnce opens a new TCP connection to addr and reads the probe server's
// line ("NAME PEER"). It returns NAME and the time from the start of the
// connect to the arrival of the first bytes. The connection is closed with a
// reset (SO_LINGER 0) so that thousands of them leave no TIME_WAIT behind.
// Call it on an nsThread.
func dialOnce(addr string, timeout time.Duration) (string, time.Duration, error) {
	d := net.Dialer{Timeout: timeout}
	start := time.Now()
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return "", 0, err
	}
	tc := c.(*net.TCPConn)
	defer func() { tc.SetLinger(0); tc.Close() }()
	tc.SetReadDeadline(start.Add(timeout))
	buf := make([]byte, 256)
	n, err := tc.Read(buf)
	elapsed := time.Since(start)
	if n == 0 {
		return "", 0, fmt.Errorf("read: %w", err)
	}
	for !bytes.Contains(buf[:n], []byte("\n")) && n < len(buf) && err == nil {
		var m int
		m, err = tc.Read(buf[n:])
		n += m
	}
	f := strings.Fields(string(buf[:n]))
	if len(f) == 0 {
		return "", 0, fmt.Errorf("empty answer")
	}
	return f[0], elapsed, nil
}

// waitAnswer connects to addr again and again until the server named want
// answers, and returns the time since t0. The pause between attempts grows
// with the time already waited (1% of it, between minPause and 20 ms), so the
// resolution is about 1% and the client does not compete much with the
// proxy for the CPU. failures counts attempts that got no answer at all.
func (t *nsThread) waitAnswer(addr, want string, t0 time.Time, attempt, minPause, limit time.Duration) (lat time.Duration, failures fails, err error) {
	t.do(func() {
		for {
			name, _, derr := dialOnce(addr, attempt)
			now := time.Now()
			if derr == nil && name == want {
				lat = now.Sub(t0)
				return
			}
			if derr != nil {
				failures.add(derr)
			}
			waited := now.Sub(t0)
			if waited > limit {
				err = fmt.Errorf("%s: %s did not answer within %v (last: %q, %v)", addr, want, limit, name, derr)
				return
			}
			time.Sleep(min(max(waited/100, minPause), 20*time.Millisecond))
		}
	})
	return lat, failures, err
}

// firstPacket opens n new connections to each of addrs, alternating
// between them (5 ms apart), and returns per address their
// connect+first-byte times. Alternating makes the addresses (a ClusterIP and
// the pod behind it) share whatever else the machine is doing. Connections
// answered by another server than want, or not at all, count as failures.
func (t *nsThread) firstPacket(addrs []string, want string, n int) (times [][]time.Duration, failures fails) {
	times = make([][]time.Duration, len(addrs))
	t.do(func() {
		for i := 0; i < n; i++ {
			for k, addr := range addrs {
				name, d, err := dialOnce(addr, time.Second)
				if err == nil && name != want {
					err = fmt.Errorf("answered by %s", name)
				}
				if err != nil {
					failures.add(err)
				} else {
					times[k] = append(times[k], d)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
	return times, failures
}

// fails counts connection attempts that got no (right) answer, by kind.
type fails map[string]int

func (f *fails) add(err error) {
	if *f == nil {
		*f = fails{}
	}
	var ne net.Error
	kind := "other"
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		kind = "refused"
	case errors.Is(err, unix.ECONNRESET):
		kind = "reset"
	case errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
		kind = "unreachable"
	case errors.As(err, &ne) && ne.Timeout():
		kind = "timeout"
	case strings.HasPrefix(err.Error(), "answered by"):
		kind = "wrong server"
	}
	(*f)[kind]++
}

func (f fails) total() int {
	n := 0
	for _, v := range f {
		n += v
	}
	return n
}

func (f fails) merge(o fails) fails {
	if f == nil {
		f = fails{}
	}
	for k, v := range o {
		f[k] += v
	}
	return f
}

func (f fails) String() string {
	if f.total() == 0 {
		return "0"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(f)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, f[k]))
	}
	return fmt.Sprintf("%d (%s)", f.total(), strings.Join(parts, ", "))
}

// probed is what probe saw.
type probed struct {
	attempts    int
	failures    fails
	first, last time.Time // when the first and the last failed attempt began (zero: none)
}

// probe connects to addr every pause until stop is closed and reports the
// attempts that got no answer from want.
func (t *nsThread) probe(addr, want string, pause time.Duration, stop <-chan struct{}) probed {
	var p probed
	t.do(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			p.attempts++
			t0 := time.Now()
			name, _, err := dialOnce(addr, time.Second)
			if err == nil && name != want {
				err = fmt.Errorf("answered by %s", name)
			}
			if err != nil {
				p.failures.add(err)
				if p.first.IsZero() {
					p.first = t0
				}
				p.last = t0
			}
			time.Sleep(pause)
		}
	})
	return p
}
