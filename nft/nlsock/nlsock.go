// Package nlsock sets up the netlink sockets nftproxy talks to the kernel
// on: nft's (nf_tables) and conntrack's (ctnetlink).
package nlsock

import (
	"fmt"

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
