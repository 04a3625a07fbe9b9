package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
)

// dialTimeout bounds one connection attempt and one answer. A refused
// connection is refused at once; only a dropped one takes this long.
const dialTimeout = 5 * time.Second

// reply is an endpoint's answer: its pod's name and the client's address
// as the pod saw it.
type reply struct {
	pod  string
	peer netip.AddrPort
}

func (r reply) String() string { return r.pod + " (saw " + r.peer.String() + ")" }

func parseReply(b []byte) (reply, error) {
	pod, peer, ok := strings.Cut(strings.TrimSpace(string(b)), " ")
	if !ok {
		return reply{}, fmt.Errorf("answer %q: not <pod> <peer>", b)
	}
	ap, err := netip.ParseAddrPort(peer)
	if err != nil {
		return reply{}, fmt.Errorf("answer %q: %w", b, err)
	}
	return reply{pod: pod, peer: ap}, nil
}

// asker makes one connection (or exchange) and returns the answer.
type asker func() (reply, error)

// askTCP connects from ns to to over TCP and reads the answer.
func askTCP(t *testing.T, ns *netns.NS, to netip.AddrPort) asker {
	return func() (reply, error) {
		var c net.Conn
		var err error
		ns.Do(t, func() { c, err = net.DialTimeout("tcp", to.String(), dialTimeout) })
		if err != nil {
			return reply{}, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(dialTimeout))
		b, err := io.ReadAll(c)
		if err != nil {
			return reply{}, err
		}
		return parseReply(b)
	}
}

// dialUDP opens a UDP socket in ns connected to to.
func dialUDP(t *testing.T, ns *netns.NS, to netip.AddrPort) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	var err error
	ns.Do(t, func() { c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to)) })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// askOn sends a datagram on c and reads the answer. An ICMP error for the
// datagram (port unreachable: a REJECT) comes back as ECONNREFUSED.
func askOn(c *net.UDPConn) (reply, error) {
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return reply{}, err
	}
	_ = c.SetReadDeadline(time.Now().Add(dialTimeout))
	b := make([]byte, 1500)
	n, err := c.Read(b)
	if err != nil {
		return reply{}, err
	}
	return parseReply(b[:n])
}

// askUDP sends a datagram to to from a new socket (a new flow) in ns.
func askUDP(t *testing.T, ns *netns.NS, to netip.AddrPort) asker {
	return func() (reply, error) {
		c := dialUDP(t, ns, to)
		defer c.Close()
		return askOn(c)
	}
}

// askSCTP opens an SCTP association from ns to to (IPv4) and reads the
// answer.
func askSCTP(t *testing.T, ns *netns.NS, to netip.AddrPort) asker {
	return func() (reply, error) {
		var fd int
		var err error
		ns.Do(t, func() {
			fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		})
		if err != nil {
			return reply{}, fmt.Errorf("sctp socket: %w", err)
		}
		defer unix.Close(fd)
		deadline := time.Now().Add(dialTimeout)
		err = unix.Connect(fd, &unix.SockaddrInet4{Addr: to.Addr().As4(), Port: int(to.Port())})
		if err != nil && !errors.Is(err, unix.EINPROGRESS) {
			return reply{}, fmt.Errorf("sctp connect %v: %w", to, err)
		}
		if err := pollFd(fd, unix.POLLOUT, deadline); err != nil {
			return reply{}, fmt.Errorf("sctp connect %v: %w", to, err)
		}
		if errno, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || errno != 0 {
			return reply{}, fmt.Errorf("sctp connect %v: %w", to, errors.Join(err, unix.Errno(errno)))
		}
		var answer []byte
		buf := make([]byte, 512)
		for !strings.HasSuffix(string(answer), "\n") {
			if err := pollFd(fd, unix.POLLIN, deadline); err != nil {
				return reply{}, fmt.Errorf("sctp read from %v: %w", to, err)
			}
			n, err := unix.Read(fd, buf)
			if err != nil && !errors.Is(err, unix.EAGAIN) {
				return reply{}, fmt.Errorf("sctp read from %v: %w", to, err)
			}
			if n == 0 && err == nil {
				break
			}
			answer = append(answer, buf[:max(n, 0)]...)
		}
		return parseReply(answer)
	}
}

// pollFd waits until fd is ready for events, or deadline.
func pollFd(fd int, events int16, deadline time.Time) error {
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.ETIMEDOUT
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: events}}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
}

// httpGet sends GET path to to from ns and returns the status code and
// body.
func httpGet(t *testing.T, ns *netns.NS, to netip.AddrPort, path string) (int, string, error) {
	var c net.Conn
	var err error
	ns.Do(t, func() { c, err = net.DialTimeout("tcp", to.String(), dialTimeout) })
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dialTimeout))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, to); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// answered asks up to attempts times, until every pod of want has
// answered, and returns how often each pod answered. It fails the test
// at the first error or at an answer from a pod not in want.
func answered(t *testing.T, what string, attempts int, ask asker, want ...string) map[string]int {
	t.Helper()
	got := askUntil(t, what, attempts, ask, want, func(got map[string]int) bool { return len(got) == len(want) })
	if len(got) < len(want) {
		t.Fatalf("%s: %d attempts answered by %v, want every one of %v", what, attempts, got, want)
	}
	return got
}

// sawClient is ask, failing the test unless the endpoint saw the client's
// own address (no masquerading).
func sawClient(t *testing.T, ask asker, want netip.Addr) asker {
	return func() (reply, error) {
		r, err := ask()
		if err == nil && r.peer.Addr() != want {
			t.Fatalf("%s saw the client as %v, want %v (not masqueraded)", r.pod, r.peer.Addr(), want)
		}
		return r, err
	}
}

// answeredBy asks n times and returns how often each pod answered; it
// fails the test at the first error or at an answer from a pod not in
// want.
func answeredBy(t *testing.T, what string, n int, ask asker, want ...string) map[string]int {
	t.Helper()
	return askUntil(t, what, n, ask, want, func(map[string]int) bool { return false })
}

// askUntil asks up to n times, until done says the answers so far are
// enough, and returns how often each pod answered; it fails the test at
// the first error or at an answer from a pod not in want.
func askUntil(t *testing.T, what string, n int, ask asker, want []string, done func(got map[string]int) bool) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := 0; i < n && !done(got); i++ {
		r, err := ask()
		if err != nil {
			t.Fatalf("%s: attempt %d: %v (answers so far: %v)", what, i+1, err, got)
		}
		if !slices.Contains(want, r.pod) {
			t.Fatalf("%s: answered by %s, want only %v", what, r, want)
		}
		got[r.pod]++
	}
	return got
}

// refused fails the test unless ask is refused (a TCP RST, or an ICMP
// error for UDP): a Service without endpoints rejects, it does not drop.
func refused(t *testing.T, what string, ask asker) {
	t.Helper()
	start := time.Now()
	r, err := ask()
	switch {
	case err == nil:
		t.Errorf("%s: answered by %s, want the connection refused", what, r)
	case !errors.Is(err, syscall.ECONNREFUSED):
		t.Errorf("%s: %v after %v, want the connection refused (a timeout means the packets were dropped)",
			what, err, time.Since(start).Round(time.Millisecond))
	}
}

// eventually calls cond until it returns true, every 50 ms for at most
// smokeTimeout, and fails the test with what and cond's last state if it
// never does.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(smokeTimeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %s", smokeTimeout, what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
