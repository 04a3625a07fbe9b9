// Package nlcodec is the netlink codec every kernel client of nftproxy
// speaks: nft/nftnl (nf_tables), conntrack (ctnetlink), nft/nftnl's socket
// lister (sock_diag) and the route lookup of cmd/nftproxy (rtnetlink). It
// holds what they share and nothing of any subsystem:
// socket set-up, sequence numbers, a message and attribute encoder that
// appends to the caller's buffer, an attribute decoder that reports
// malformed input, a message walker and the parsing of ACKs and errors
// (include/uapi/linux/netlink.h, netfilter/nfnetlink.h).
//
// Attribute types are given as the subsystem's uapi header numbers them;
// byte orders are in the method names (BE32: big-endian, as nf_tables and
// ctnetlink want their integers; U32: host order).
package nlcodec

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

const (
	HeaderLen    = 16 // struct nlmsghdr
	GenHeaderLen = 4  // struct nfgenmsg, first in every nfnetlink payload
	AttrLen      = 4  // struct nlattr
	// MaxAttrLen is the largest attribute: nla_len is a u16, so a nest
	// (an element list) must stay below it; a message has no such limit.
	MaxAttrLen = 0xffff
	// attrTypeMask strips NLA_F_NESTED and NLA_F_NET_BYTEORDER from a type.
	attrTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
)

// Align rounds n up to netlink's 4-byte alignment (NLMSG_ALIGN, NLA_ALIGN).
func Align(n int) int { return (n + 3) &^ 3 }

// Encoder appends netlink messages and attributes to Buf, so that many
// messages go out in one sendmsg. Buf is the caller's: it may be allocated
// off the heap, and read or cut back between messages. An attribute too
// long for netlink is not written; the first such error is kept (Err).
type Encoder struct {
	Buf []byte
	err error
}

// Err returns the first encoding error.
func (e *Encoder) Err() error { return e.err }

// SetErr records err unless an error was recorded already.
func (e *Encoder) SetErr(err error) {
	if e.err == nil {
		e.err = err
	}
}

// BeginMsg starts a message with an nfgenmsg header (family, version 0,
// res_id big-endian) and returns its offset for EndMsg. typ is the full
// nlmsg_type: subsystem<<8 | message, or NFNL_MSG_BATCH_*.
func (e *Encoder) BeginMsg(typ, flags uint16, seq uint32, family uint8, resID uint16) int {
	start := len(e.Buf)
	e.Buf = binary.NativeEndian.AppendUint32(e.Buf, 0) // nlmsg_len, set by EndMsg
	e.Buf = binary.NativeEndian.AppendUint16(e.Buf, typ)
	e.Buf = binary.NativeEndian.AppendUint16(e.Buf, flags)
	e.Buf = binary.NativeEndian.AppendUint32(e.Buf, seq)
	e.Buf = binary.NativeEndian.AppendUint32(e.Buf, 0) // nlmsg_pid: 0 = to the kernel
	e.Buf = append(e.Buf, family, unix.NFNETLINK_V0)
	e.Buf = binary.BigEndian.AppendUint16(e.Buf, resID)
	return start
}

// EndMsg sets the length of the message started at start.
func (e *Encoder) EndMsg(start int) {
	binary.NativeEndian.PutUint32(e.Buf[start:], uint32(len(e.Buf)-start))
}

// Pad pads Buf to the 4-byte alignment.
func (e *Encoder) Pad() {
	for len(e.Buf)%4 != 0 {
		e.Buf = append(e.Buf, 0)
	}
}

// AttrHeader writes the header of an attribute of n bytes, which the
// caller then appends (and pads); false, and an error recorded, if they do
// not fit an attribute.
func (e *Encoder) AttrHeader(typ uint16, n int) bool {
	if n+AttrLen > MaxAttrLen {
		e.SetErr(fmt.Errorf("attribute %d: %d bytes is too long for netlink", typ, n))
		return false
	}
	e.Buf = binary.NativeEndian.AppendUint16(e.Buf, uint16(n+AttrLen))
	e.Buf = binary.NativeEndian.AppendUint16(e.Buf, typ)
	return true
}

// Attr writes an attribute holding data.
func (e *Encoder) Attr(typ uint16, data []byte) {
	if e.AttrHeader(typ, len(data)) {
		e.Buf = append(e.Buf, data...)
		e.Pad()
	}
}

// Str writes a NUL-terminated string attribute (NLA_NUL_STRING).
func (e *Encoder) Str(typ uint16, s string) {
	if e.AttrHeader(typ, len(s)+1) {
		e.Buf = append(append(e.Buf, s...), 0)
		e.Pad()
	}
}

// U8 writes a one-byte attribute.
func (e *Encoder) U8(typ uint16, v uint8) {
	e.AttrHeader(typ, 1)
	e.Buf = append(e.Buf, v, 0, 0, 0)
}

// BE16 writes a big-endian u16 attribute.
func (e *Encoder) BE16(typ uint16, v uint16) {
	e.AttrHeader(typ, 2)
	e.Buf = append(binary.BigEndian.AppendUint16(e.Buf, v), 0, 0)
}

// BE32 writes a big-endian u32 attribute.
func (e *Encoder) BE32(typ uint16, v uint32) {
	e.AttrHeader(typ, 4)
	e.Buf = binary.BigEndian.AppendUint32(e.Buf, v)
}

// U32 writes a u32 attribute in host byte order.
func (e *Encoder) U32(typ uint16, v uint32) {
	e.AttrHeader(typ, 4)
	e.Buf = binary.NativeEndian.AppendUint32(e.Buf, v)
}

// BE64 writes a big-endian u64 attribute.
func (e *Encoder) BE64(typ uint16, v uint64) {
	e.AttrHeader(typ, 8)
	e.Buf = binary.BigEndian.AppendUint64(e.Buf, v)
}

// Nest starts a nested attribute (with NLA_F_NESTED, as nft and the kernel
// set it) and returns its offset for EndNest.
func (e *Encoder) Nest(typ uint16) int {
	start := len(e.Buf)
	e.Buf = binary.NativeEndian.AppendUint16(e.Buf, 0)
	e.Buf = binary.NativeEndian.AppendUint16(e.Buf, typ|unix.NLA_F_NESTED)
	return start
}

// EndNest sets the length of the nest started at start, or records an
// error if it is too long for an attribute.
func (e *Encoder) EndNest(start int) {
	n := len(e.Buf) - start
	if n > MaxAttrLen {
		e.SetErr(fmt.Errorf("nested attribute: %d bytes is too long for netlink", n))
		return
	}
	binary.NativeEndian.PutUint16(e.Buf[start:], uint16(n))
}
