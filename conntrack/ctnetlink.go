package conntrack

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
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
)

func ctType(msg uint16) uint16 { return unix.NFNL_SUBSYS_CTNETLINK<<8 | msg }

// encoder appends ctnetlink messages to one buffer, so that many of them
// go out in a single sendmsg.
type encoder struct{ nlcodec.Encoder }

// begin starts a ctnetlink message and returns its offset for EndMsg.
func (e *encoder) begin(msg, flags uint16, seq uint32, family uint8) int {
	return e.BeginMsg(ctType(msg), flags, seq, family, 0)
}

// tuple appends a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY.
func (e *encoder) tuple(typ uint16, proto uint8, t Tuple) {
	nt := e.Nest(typ)
	ip := e.Nest(ctaTupleIP)
	src, dst := t.Src.Addr().Unmap(), t.Dst.Addr().Unmap()
	if src.Is4() {
		e.Attr(ctaIPv4Src, src.AsSlice())
		e.Attr(ctaIPv4Dst, dst.AsSlice())
	} else {
		e.Attr(ctaIPv6Src, src.AsSlice())
		e.Attr(ctaIPv6Dst, dst.AsSlice())
	}
	e.EndNest(ip)
	p := e.Nest(ctaTupleProto)
	e.U8(ctaProtoNum, proto)
	e.BE16(ctaProtoSrcPort, t.Src.Port())
	e.BE16(ctaProtoDstPort, t.Dst.Port())
	e.EndNest(p)
	e.EndNest(nt)
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
		t := e.Nest(ctaTupleOrig)
		p := e.Nest(ctaTupleProto)
		e.U8(ctaProtoNum, proto)
		e.EndNest(p)
		e.EndNest(t)
		f := e.Nest(ctaFilter)
		e.U32(ctaFilterOrigFlags, ctaFilterFlagProtoNum)
		e.EndNest(f)
	}
	if unansweredOnly {
		// (status & mask) == 0: never answered, never DNATed. A kernel
		// older than 5.19 ignores both; Stale decides anyway.
		e.BE32(ctaStatus, 0)
		e.BE32(ctaStatusMask, ipsSeenReply|ipsDstNAT)
	}
	e.EndMsg(m)
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
		e.BE32(ctaID, fl.ID)
	}
	if fl.Zone != 0 {
		e.BE16(ctaZone, fl.Zone)
	}
	e.EndMsg(m)
}

var errNoTuple = errors.New("conntrack entry without original or reply tuple")

// parseFlow decodes one entry of a dump (the payload of a CT_NEW message:
// nfgenmsg, then attributes).
func parseFlow(payload []byte) (Flow, error) {
	var fl Flow
	if len(payload) < nlcodec.GenHeaderLen {
		return fl, errors.New("short ctnetlink message")
	}
	var haveOrig, haveReply bool
	var d nlcodec.Decoder
	d.Attrs(payload[nlcodec.GenHeaderLen:], func(typ uint16, data []byte) {
		switch typ {
		case ctaTupleOrig:
			fl.Orig, fl.Proto, haveOrig = parseTuple(&d, data)
		case ctaTupleReply:
			fl.Reply, _, haveReply = parseTuple(&d, data)
		case ctaStatus:
			fl.Unanswered = d.BE32(data)&ipsSeenReply == 0
		case ctaID:
			fl.ID = d.BE32(data)
		case ctaZone:
			fl.Zone = d.BE16(data)
		}
	})
	switch {
	case d.Err() != nil:
		return fl, d.Err()
	case !haveOrig || !haveReply:
		return fl, errNoTuple
	}
	return fl, nil
}

var errNoAddrs = errors.New("conntrack tuple without addresses")

// parseTuple decodes CTA_TUPLE_IP and CTA_TUPLE_PROTO; ok if the tuple has
// both addresses. Ports stay 0 for protocols without them (ICMP).
func parseTuple(d *nlcodec.Decoder, b []byte) (t Tuple, proto uint8, ok bool) {
	var src, dst netip.Addr
	var sport, dport uint16
	d.Attrs(b, func(typ uint16, data []byte) {
		switch typ {
		case ctaTupleIP:
			d.Attrs(data, func(typ uint16, data []byte) {
				switch typ {
				case ctaIPv4Src, ctaIPv6Src:
					src = parseAddr(d, typ, data)
				case ctaIPv4Dst, ctaIPv6Dst:
					dst = parseAddr(d, typ, data)
				}
			})
		case ctaTupleProto:
			d.Attrs(data, func(typ uint16, data []byte) {
				switch typ {
				case ctaProtoNum:
					proto = d.U8(data)
				case ctaProtoSrcPort:
					sport = d.BE16(data)
				case ctaProtoDstPort:
					dport = d.BE16(data)
				}
			})
		}
	})
	if !src.IsValid() || !dst.IsValid() {
		d.Fail(errNoAddrs)
		return Tuple{}, 0, false
	}
	return Tuple{Src: netip.AddrPortFrom(src, sport), Dst: netip.AddrPortFrom(dst, dport)}, proto, true
}

// parseAddr decodes CTA_IP_V4_* (4 bytes) or CTA_IP_V6_* (16 bytes).
func parseAddr(d *nlcodec.Decoder, typ uint16, data []byte) netip.Addr {
	n := 16
	if typ == ctaIPv4Src || typ == ctaIPv4Dst {
		n = 4
	}
	if len(data) != n {
		d.Fail(fmt.Errorf("%w: conntrack address of %d bytes", nlcodec.ErrMalformed, len(data)))
		return netip.Addr{}
	}
	a, _ := netip.AddrFromSlice(data)
	return a
}
