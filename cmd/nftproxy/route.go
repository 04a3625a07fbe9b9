package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// routeInterface returns the name of the interface this network
// namespace routes to addr through: where a packet from addr arrives, as
// reverse path filtering expects it.
func routeInterface(addr netip.Addr) (string, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return "", err
	}
	defer c.Close()
	family, bits := uint8(unix.AF_INET), uint8(32)
	if addr.Is6() {
		family, bits = unix.AF_INET6, 128
	}
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(unix.RTA_DST, addr.AsSlice())
	attrs, err := ae.Encode()
	if err != nil {
		return "", err
	}
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags (u32).
	rtmsg := make([]byte, unix.SizeofRtMsg)
	rtmsg[0], rtmsg[1] = family, bits
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETROUTE, Flags: netlink.Request},
		Data:   append(rtmsg, attrs...),
	})
	if err != nil {
		return "", fmt.Errorf("route to %v: %w", addr, err)
	}
	for _, m := range msgs {
		if len(m.Data) < unix.SizeofRtMsg {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[unix.SizeofRtMsg:])
		if err != nil {
			return "", err
		}
		for ad.Next() {
			if ad.Type() == unix.RTA_OIF && len(ad.Bytes()) == 4 {
				ifi, err := net.InterfaceByIndex(int(binary.NativeEndian.Uint32(ad.Bytes())))
				if err != nil {
					return "", err
				}
				return ifi.Name, nil
			}
		}
	}
	return "", fmt.Errorf("route to %v: no output interface", addr)
}

// localAddrs are the addresses of this network namespace's interfaces.
func localAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}
