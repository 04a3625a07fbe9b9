package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
)

// routeInterface returns the name of the interface this network
// namespace routes to addr through: where a packet from addr arrives, as
// reverse path filtering expects it. It asks rtnetlink (RTM_GETROUTE),
// through the codec the other kernel clients use.
func routeInterface(addr netip.Addr) (string, error) {
	c, err := netlink.Dial(unix.NETLINK_ROUTE, nil)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := nlcodec.Send(c, routeRequest(addr)); err != nil {
		return "", fmt.Errorf("route to %v: %w", addr, err)
	}
	buf := make([]byte, 8192)
	n, err := nlcodec.Receive(c, buf, true)
	if err != nil {
		return "", fmt.Errorf("route to %v: %w", addr, err)
	}
	index, err := routeOutputIndex(buf[:n])
	if err != nil {
		return "", fmt.Errorf("route to %v: %w", addr, err)
	}
	ifi, err := net.InterfaceByIndex(int(index))
	if err != nil {
		return "", err
	}
	return ifi.Name, nil
}

// routeRequest is an RTM_GETROUTE for addr: a netlink header, a struct
// rtmsg (family, dst_len, src_len, tos, table, protocol, scope, type,
// flags) and RTA_DST.
func routeRequest(addr netip.Addr) []byte {
	family, bits := uint8(unix.AF_INET), uint8(32)
	if addr.Is6() {
		family, bits = unix.AF_INET6, 128
	}
	e := nlcodec.Encoder{Buf: make([]byte, nlcodec.HeaderLen, 64)}
	binary.NativeEndian.PutUint16(e.Buf[4:], unix.RTM_GETROUTE)
	binary.NativeEndian.PutUint16(e.Buf[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(e.Buf[8:], 1)
	rtmsg := make([]byte, unix.SizeofRtMsg)
	rtmsg[0], rtmsg[1] = family, bits
	e.Buf = append(e.Buf, rtmsg...)
	e.Attr(unix.RTA_DST, addr.AsSlice())
	binary.NativeEndian.PutUint32(e.Buf, uint32(len(e.Buf)))
	return e.Buf
}

// routeOutputIndex reads the output interface's index (RTA_OIF) from the
// answer to routeRequest.
func routeOutputIndex(b []byte) (uint32, error) {
	var index uint32
	var found bool
	err := nlcodec.Messages(b, func(h nlcodec.Header, payload []byte) error {
		switch {
		case h.Type == unix.NLMSG_ERROR:
			return nlcodec.ParseAck(h.Flags, payload).Err()
		case h.Type != unix.RTM_NEWROUTE || len(payload) < unix.SizeofRtMsg:
			return nil
		}
		var d nlcodec.Decoder
		d.Attrs(payload[unix.SizeofRtMsg:], func(typ uint16, data []byte) {
			if typ == unix.RTA_OIF && len(data) == 4 {
				index, found = binary.NativeEndian.Uint32(data), true
			}
		})
		return d.Err()
	})
	if err == nil && !found {
		err = errors.New("no output interface")
	}
	return index, err
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
