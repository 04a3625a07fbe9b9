package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// The ctnetlink messages nftproxy sends and reads, encoded and decoded by
// hand: the few attributes we need, without an allocation per flow.
// Numbers from include/uapi/linux/netfilter/nfnetlink_conntrack.h.
const (
	ctMsgNew    = 0 // IPCTNL_MSG_CT_NEW: also each entry of a dump
	ctMsgGet    = 1 // IPCTNL_MSG_CT_GET: with NLM_F_DUMP, the table
	ctMsgDelete = 2 // IPCTNL_MSG_CT_DELETE

	// enum ctattr_type
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaTimeout    = 7 // tests only: creating flows
	ctaID         = 12
	ctaZone       = 18
	ctaFilter     = 25 // Linux ≥ 5.8
	ctaStatusMask = 26 // Linux ≥ 5.19: a dump's status filter

	// enum ip_conntrack_status
	ipsSeenReply = 1 << 1
	ipsDstNAT    = 1 << 5

	// enum ctattr_tuple
	ctaTupleIP    = 1
	ctaTupleProto = 2

	// enum ctattr_ip
	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	// enum ctattr_l4proto
	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	// enum ctattr_filter and its flags (CTA_FILTER_FLAG_CTA_PROTO_NUM)
	ctaFilterOrigFlags    = 1
	ctaFilterFlagProtoNum = 1 << 3

	nlmsgHeaderLen = 16 // struct nlmsghdr
	nfgenHeaderLen = 4  // struct nfgenmsg
	nlaHeaderLen   = 4  // struct nlattr
	// nlaTypeMask strips NLA_F_NESTED and NLA_F_NET_BYTEORDER from a type.
	nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
)

func ctType(msg uint16) uint16 { return unix.NFNL_SUBSYS_CTNETLINK<<8 | msg }

func align4(n int) int { return (n + 3) &^ 3 }

// encoder appends netlink messages to one buffer, so that many of them go
// out in a single sendmsg.
type encoder struct {
	b []byte
}

// begin starts a ctnetlink message (nlmsghdr + nfgenmsg) and returns its
// offset for end.
func (e *encoder) begin(msg, flags uint16, seq uint32, family uint8) int {
	start := len(e.b)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0) // length, set by end
	e.b = binary.NativeEndian.AppendUint16(e.b, ctType(msg))
	e.b = binary.NativeEndian.AppendUint16(e.b, flags)
	e.b = binary.NativeEndian.AppendUint32(e.b, seq)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0) // port id: the kernel's
	e.b = append(e.b, family, unix.NFNETLINK_V0, 0, 0)
	return start
}

// end sets the length of the message (or nested attribute) at start.
func (e *encoder) end(start int) {
	binary.NativeEndian.PutUint32(e.b[start:], uint32(len(e.b)-start))
}

// endNest sets the length of the nested attribute at start.
func (e *encoder) endNest(start int) {
	binary.NativeEndian.PutUint16(e.b[start:], uint16(len(e.b)-start))
}

func (e *encoder) attr(typ uint16, data []byte) {
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(nlaHeaderLen+len(data)))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = append(e.b, data...)
	for len(e.b)%4 != 0 {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) u8(typ uint16, v uint8) { e.attr(typ, []byte{v}) }

func (e *encoder) be16(typ uint16, v uint16) {
	e.attr(typ, binary.BigEndian.AppendUint16(nil, v))
}

func (e *encoder) be32(typ uint16, v uint32) {
	e.attr(typ, binary.BigEndian.AppendUint32(nil, v))
}

func (e *encoder) nest(typ uint16) int {
	start := len(e.b)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0)
	binary.NativeEndian.PutUint16(e.b[start+2:], typ|unix.NLA_F_NESTED)
	return start
}

// tuple appends a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY.
func (e *encoder) tuple(typ uint16, proto uint8, t Tuple) {
	nt := e.nest(typ)
	ip := e.nest(ctaTupleIP)
	src, dst := t.Src.Addr().Unmap(), t.Dst.Addr().Unmap()
	if src.Is4() {
		e.attr(ctaIPv4Src, src.AsSlice())
		e.attr(ctaIPv4Dst, dst.AsSlice())
	} else {
		e.attr(ctaIPv6Src, src.AsSlice())
		e.attr(ctaIPv6Dst, dst.AsSlice())
	}
	e.endNest(ip)
	p := e.nest(ctaTupleProto)
	e.u8(ctaProtoNum, proto)
	e.be16(ctaProtoSrcPort, t.Src.Port())
	e.be16(ctaProtoDstPort, t.Dst.Port())
	e.endNest(p)
	e.endNest(nt)
}

// appendDump encodes the request for a dump of one family's table. With
// proto ≠ 0 it asks the kernel to send only flows of that L4 protocol
// (CTA_FILTER, Linux ≥ 5.8, "netfilter: ctnetlink: add kernel side
// filtering for dump"): the kernel still walks the whole table, but does
// not serialize the other flows, which is most of the cost (see
// Netlink.Dump). Older kernels ignore the unknown attribute and send every
// flow; Stale filters by protocol anyway. With unansweredOnly, it also asks
// for only the flows that never saw a reply and were never DNATed
// (CTA_STATUS and CTA_STATUS_MASK, Linux ≥ 5.19): on a busy node, a TCP
// dump then returns a handful of flows instead of every connection.
func (e *encoder) appendDump(seq uint32, family, proto uint8, unansweredOnly bool) {
	m := e.begin(ctMsgGet, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, family)
	if proto != 0 {
		t := e.nest(ctaTupleOrig)
		p := e.nest(ctaTupleProto)
		e.u8(ctaProtoNum, proto)
		e.endNest(p)
		e.endNest(t)
		f := e.nest(ctaFilter)
		e.attr(ctaFilterOrigFlags, binary.NativeEndian.AppendUint32(nil, ctaFilterFlagProtoNum))
		e.endNest(f)
	}
	if unansweredOnly {
		// (status & mask) == 0: never answered, never DNATed. A kernel
		// older than 5.19 ignores both; Stale decides anyway.
		e.be32(ctaStatus, 0)
		e.be32(ctaStatusMask, ipsSeenReply|ipsDstNAT)
	}
	e.end(m)
}

// appendDelete encodes the deletion of one flow, with an ACK requested.
//
// The message always carries the original tuple: a CT_DELETE without a
// tuple flushes the whole table (ctnetlink_del_conntrack), so there is no
// way to call this that could do that.
func (e *encoder) appendDelete(seq uint32, fl Flow) {
	m := e.begin(ctMsgDelete, unix.NLM_F_REQUEST|unix.NLM_F_ACK, seq, familyOf(fl))
	e.tuple(ctaTupleOrig, fl.Proto, fl.Orig)
	if fl.ID != 0 {
		e.be32(ctaID, fl.ID)
	}
	if fl.Zone != 0 {
		e.be16(ctaZone, fl.Zone)
	}
	e.end(m)
}

// attrs walks the netlink attributes of b, calling fn with each type
// (flags masked off) and payload. It stops at the first malformed one.
func attrs(b []byte, fn func(typ uint16, data []byte)) error {
	for len(b) >= nlaHeaderLen {
		l := int(binary.NativeEndian.Uint16(b))
		if l < nlaHeaderLen || l > len(b) {
			return fmt.Errorf("malformed netlink attribute of %d bytes in %d", l, len(b))
		}
		fn(binary.NativeEndian.Uint16(b[2:])&nlaTypeMask, b[nlaHeaderLen:l])
		b = b[min(align4(l), len(b)):]
	}
	return nil
}

var errNoTuple = errors.New("conntrack entry without original or reply tuple")

// parseFlow decodes one entry of a dump (the payload of a CT_NEW message:
// nfgenmsg, then attributes).
func parseFlow(payload []byte) (Flow, error) {
	var fl Flow
	if len(payload) < nfgenHeaderLen {
		return fl, errors.New("short ctnetlink message")
	}
	var haveOrig, haveReply bool
	var perr error
	err := attrs(payload[nfgenHeaderLen:], func(typ uint16, data []byte) {
		var err error
		switch typ {
		case ctaTupleOrig:
			fl.Orig, fl.Proto, err = parseTuple(data)
			haveOrig = err == nil
		case ctaTupleReply:
			fl.Reply, _, err = parseTuple(data)
			haveReply = err == nil
		case ctaStatus:
			if len(data) >= 4 {
				fl.Unanswered = binary.BigEndian.Uint32(data)&ipsSeenReply == 0
			}
		case ctaID:
			if len(data) >= 4 {
				fl.ID = binary.BigEndian.Uint32(data)
			}
		case ctaZone:
			if len(data) >= 2 {
				fl.Zone = binary.BigEndian.Uint16(data)
			}
		}
		if err != nil && perr == nil {
			perr = err
		}
	})
	switch {
	case err != nil:
		return fl, err
	case perr != nil:
		return fl, perr
	case !haveOrig || !haveReply:
		return fl, errNoTuple
	}
	return fl, nil
}

// parseTuple decodes CTA_TUPLE_IP and CTA_TUPLE_PROTO. Ports stay 0 for
// protocols without them (ICMP).
func parseTuple(b []byte) (Tuple, uint8, error) {
	var src, dst netip.Addr
	var sport, dport uint16
	var proto uint8
	err := attrs(b, func(typ uint16, data []byte) {
		switch typ {
		case ctaTupleIP:
			_ = attrs(data, func(typ uint16, data []byte) {
				switch {
				case (typ == ctaIPv4Src || typ == ctaIPv6Src) && validAddrLen(typ, data):
					src, _ = netip.AddrFromSlice(data)
				case (typ == ctaIPv4Dst || typ == ctaIPv6Dst) && validAddrLen(typ, data):
					dst, _ = netip.AddrFromSlice(data)
				}
			})
		case ctaTupleProto:
			_ = attrs(data, func(typ uint16, data []byte) {
				switch {
				case typ == ctaProtoNum && len(data) >= 1:
					proto = data[0]
				case typ == ctaProtoSrcPort && len(data) >= 2:
					sport = binary.BigEndian.Uint16(data)
				case typ == ctaProtoDstPort && len(data) >= 2:
					dport = binary.BigEndian.Uint16(data)
				}
			})
		}
	})
	if err != nil {
		return Tuple{}, 0, err
	}
	if !src.IsValid() || !dst.IsValid() {
		return Tuple{}, 0, errors.New("conntrack tuple without addresses")
	}
	return Tuple{Src: netip.AddrPortFrom(src, sport), Dst: netip.AddrPortFrom(dst, dport)}, proto, nil
}

func validAddrLen(typ uint16, data []byte) bool {
	if typ == ctaIPv4Src || typ == ctaIPv4Dst {
		return len(data) == 4
	}
	return len(data) == 16
}
