package nlcodec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// SocketOptions configures Dial.
type SocketOptions struct {
	// NetNSFd is an open file descriptor of the network namespace to talk
	// to; 0 means the current one.
	NetNSFd int
	// Acks asks for extended ACKs (they name the failing attribute and
	// may carry a message) and capped ones (they do not copy a failing,
	// possibly 60 KiB, request back).
	Acks bool
	// RcvBuf and SndBuf, when not 0, are the socket buffer sizes, set with
	// SO_RCVBUFFORCE and SO_SNDBUFFORCE (see SetBuffer).
	RcvBuf, SndBuf int
	// Groups are multicast groups to join (NFNLGRP_*).
	Groups []uint32
}

// Dial opens a NETLINK_NETFILTER socket set up as o says.
func Dial(o SocketOptions) (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: o.NetNSFd})
	if err != nil {
		return nil, err
	}
	if err := setUp(c, o); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func setUp(c *netlink.Conn, o SocketOptions) error {
	if o.Acks {
		for _, opt := range []netlink.ConnOption{netlink.ExtendedAcknowledge, netlink.CapAcknowledge} {
			if err := c.SetOption(opt, true); err != nil {
				return fmt.Errorf("netlink socket option %d: %w", opt, err)
			}
		}
	}
	for _, b := range []struct{ opt, size int }{{unix.SO_RCVBUFFORCE, o.RcvBuf}, {unix.SO_SNDBUFFORCE, o.SndBuf}} {
		if b.size == 0 {
			continue
		}
		if err := SetBuffer(c, b.opt, b.size); err != nil {
			return err
		}
	}
	for _, g := range o.Groups {
		if err := c.JoinGroup(g); err != nil {
			return fmt.Errorf("join netlink group %d: %w", g, err)
		}
	}
	return nil
}

// SetBuffer sets a socket buffer size: opt is SO_RCVBUFFORCE or
// SO_SNDBUFFORCE, which ignore net.core.[rw]mem_max (the caller holds
// CAP_NET_ADMIN).
func SetBuffer(c *netlink.Conn, opt, size int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, size)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt(%d, %d): %w", opt, size, serr)
	}
	return nil
}

// Until is ctx's deadline, or fallback from now if it has none.
func Until(ctx context.Context, fallback time.Duration) time.Time {
	if deadline, ok := ctx.Deadline(); ok {
		return deadline
	}
	return time.Now().Add(fallback)
}

// Deadline applies deadline to c's reads and writes, and makes its reads
// fail at once when ctx is done: a request the kernel is running cannot be
// interrupted, the wait for its replies can. stop removes the latter.
func Deadline(ctx context.Context, c *netlink.Conn, deadline time.Time) (stop func() bool, err error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, err
	}
	return context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Unix(1, 0)) }), nil
}

// Send writes buf (one or more messages: a batch, or many requests) to the
// kernel with one sendmsg. The kernel runs the requests inside it, so their
// replies are queued when it returns.
func Send(c *netlink.Conn, buf []byte) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	werr := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), buf, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return serr != unix.EAGAIN
	})
	if werr != nil {
		return werr
	}
	return serr
}

// ErrTruncated: a datagram was longer than the buffer it was read into;
// its end is lost.
var ErrTruncated = errors.New("netlink datagram truncated")

// Receive reads one datagram into buf and returns its length. With block it
// waits for one until c's deadline; without, it returns EAGAIN when none is
// queued. ENOBUFS means the socket's receive queue overflowed since the
// last read: datagrams were dropped.
func Receive(c *netlink.Conn, buf []byte, block bool) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n, flags int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, flags, _, rerr = unix.Recvmsg(int(fd), buf, nil, unix.MSG_DONTWAIT)
		return !block || rerr != unix.EAGAIN
	}); err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, rerr
	}
	if flags&unix.MSG_TRUNC != 0 {
		return 0, ErrTruncated
	}
	return n, nil
}

// Seqs hands out sequence numbers. Numbers restart at 1 long before uint32
// would wrap (a batch has far fewer than 2³¹ messages); 0 is never used, so
// replies with sequence 0 (notifications) are never taken for ours.
type Seqs struct{ next uint32 }

// Next reserves count numbers and returns the first; Next(0) returns the
// number the next reservation starts at.
func (s *Seqs) Next(count int) uint32 {
	if s.next == 0 || s.next >= 1<<31 {
		s.next = 1
	}
	first := s.next
	s.next += uint32(count)
	return first
}
