package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// dialOptions are the flags of `probe dial`.
type dialOptions struct {
	proto      string
	addr       netip.AddrPort
	timeout    time.Duration
	sourcePort int
}

// dialMain makes --count attempts and prints one line per attempt.
func dialMain(args []string) error {
	fs := flag.NewFlagSet("dial", flag.ExitOnError)
	proto := fs.String("proto", "tcp", "tcp, udp or sctp")
	addr := fs.String("addr", "", "HOST:PORT to dial; HOST must be an IP address (required)")
	timeout := fs.Duration("timeout", time.Second, "how long to wait for each answer")
	count := fs.Int("count", 1, "number of separate attempts, each from a new source port")
	interval := fs.Duration("interval", 0, "pause between attempts")
	sourcePort := fs.Int("source-port", 0, "fixed local port (0: let the kernel choose)")
	fs.Parse(args)
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	o := dialOptions{proto: *proto, addr: ap, timeout: *timeout, sourcePort: *sourcePort}
	var attempt func(dialOptions) string
	switch *proto {
	case "tcp":
		attempt = dialTCP
	case "udp":
		attempt = dialUDP
	case "sctp":
		attempt = dialSCTP
	default:
		return fmt.Errorf("--proto %q: want tcp, udp or sctp", *proto)
	}
	for i := range *count {
		if i > 0 && *interval > 0 {
			time.Sleep(*interval)
		}
		fmt.Println(attempt(o))
	}
	return nil
}

// reuseAddr lets --source-port be reused by consecutive attempts.
func reuseAddr(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	})
	return errors.Join(err, serr)
}

// dialTCP connects with raw syscalls rather than net.Dialer so that it can enable
// IP(V6)_RECVERR and read ICMP errors from the error queue while the connect is pending.
// Without that, an ICMP port unreachable that arrives while connect() still holds the
// socket lock (a fast local path: ~always over IPv6 here) is kept only as a "soft" error,
// and the connection is refused only after the SYN retransmission a second later.
func dialTCP(o dialOptions) string {
	dst := o.addr.Addr().Unmap()
	family, level, recvErr := unix.AF_INET, unix.IPPROTO_IP, unix.IP_RECVERR
	if dst.Is6() {
		family, level, recvErr = unix.AF_INET6, unix.IPPROTO_IPV6, unix.IPV6_RECVERR
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return classify(err)
	}
	f := os.NewFile(uintptr(fd), "tcp")
	defer f.Close()
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return classify(err)
	}
	if err := unix.SetsockoptInt(fd, level, recvErr, 1); err != nil {
		return classify(err)
	}
	if o.sourcePort != 0 {
		local := sockaddr(netip.IPv4Unspecified())
		if dst.Is6() {
			local = sockaddr(netip.IPv6Unspecified())
		}
		setPort(local, o.sourcePort)
		if err := unix.Bind(fd, local); err != nil {
			return classify(err)
		}
		// Close with a reset: if this side closed first it would hold the 4-tuple in
		// TIME_WAIT, and the next attempt from the same port would fail with
		// EADDRNOTAVAIL (a race with the server's close).
		if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0}); err != nil {
			return classify(err)
		}
	}
	remote := sockaddr(dst)
	setPort(remote, int(o.addr.Port()))
	deadline := time.Now().Add(o.timeout)
	if err := unix.Connect(fd, remote); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		return classify(err)
	}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return "timeout"
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(pfd, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return classify(err)
		}
		if pfd[0].Revents == 0 {
			continue
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return classify(err)
		}
		if soErr != 0 {
			return classify(unix.Errno(soErr))
		}
		if pfd[0].Revents&unix.POLLERR != 0 {
			if err := queuedError(fd); err != nil {
				return classify(err)
			}
			continue
		}
		break // writable without error: connected
	}
	c, err := net.FileConn(f)
	if err != nil {
		return classify(err)
	}
	defer c.Close()
	c.SetReadDeadline(deadline)
	return readLine(c)
}

// queuedError reads one error from the socket's error queue (filled by IP(V6)_RECVERR).
func queuedError(fd int) error {
	oob := make([]byte, 512)
	_, oobn, _, _, err := unix.Recvmsg(fd, nil, oob, unix.MSG_ERRQUEUE)
	if err != nil {
		return nil // nothing queued
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return err
	}
	for _, m := range msgs {
		isErr := (m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_RECVERR) ||
			(m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_RECVERR)
		if !isErr || len(m.Data) < 4 {
			continue
		}
		// sock_extended_err.ee_errno. Only errors that end a connection attempt count;
		// e.g. EMSGSIZE (fragmentation needed) does not.
		switch errno := unix.Errno(binary.NativeEndian.Uint32(m.Data)); errno {
		case unix.ECONNREFUSED, unix.EHOSTUNREACH, unix.ENETUNREACH:
			return errno
		}
	}
	return nil
}

func setPort(sa unix.Sockaddr, port int) {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		sa.Port = port
	case *unix.SockaddrInet6:
		sa.Port = port
	}
}

func dialUDP(o dialOptions) string {
	d := net.Dialer{Control: reuseAddr}
	if o.sourcePort != 0 {
		d.LocalAddr = &net.UDPAddr{Port: o.sourcePort}
	}
	c, err := d.Dial("udp", o.addr.String())
	if err != nil {
		return classify(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(o.timeout))
	if _, err := c.Write([]byte("probe\n")); err != nil {
		return classify(err)
	}
	return readLine(c)
}

// readLine reads the server's reply line, or classifies why there is none.
func readLine(c net.Conn) string {
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && line == "" {
		return classify(err)
	}
	return strings.TrimSpace(line)
}

// classify turns an error into one of the words tests match on.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, unix.ECONNREFUSED):
		return "refused"
	case errors.Is(err, unix.EHOSTUNREACH), errors.Is(err, unix.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, unix.ECONNRESET):
		return "reset"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "error: " + err.Error()
}
