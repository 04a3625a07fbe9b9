// Package nlsock sets up the netlink sockets nftproxy talks to the kernel
// on: nft's (nf_tables) and conntrack's (ctnetlink).
package nlsock

import (
	"context"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Acks asks for extended ACKs (they name the failing attribute) and
// capped ones (they do not copy a failing, possibly 60 KiB, request back).
func Acks(c *netlink.Conn) error {
	for _, o := range []netlink.ConnOption{netlink.ExtendedAcknowledge, netlink.CapAcknowledge} {
		if err := c.SetOption(o, true); err != nil {
			return fmt.Errorf("netlink socket option %d: %w", o, err)
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
