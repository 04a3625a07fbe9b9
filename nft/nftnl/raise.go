package nftnl

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file raises a rule's kernel expressions back to the phrases of
// nft/rule.go: the inverse of lower.go, for the tools that read rules from
// the kernel (`nftproxy explain`, `nftproxy diff`). Each phrase is
// recognised by the expressions lowerPhrase writes for it, whether nftproxy
// or nft wrote them (they write the same). The matchers read only the
// attributes that tell phrases apart, because the kernel reports some
// differently from how they were written: nat gains NF_NAT_RANGE_MAP_IPS
// and the registers of the range's end, bitwise gains its op. Expressions
// that are no phrase of ours (a `counter`, a match nftproxy never writes)
// become an nft.Opaque phrase that names them.

// kexpr is one kernel expression: its name and its attributes, undecoded.
type kexpr struct {
	name  string
	attrs map[uint16][]byte
}

// decodeExprs splits NFTA_RULE_EXPRESSIONS into expressions.
func decodeExprs(d *nlcodec.Decoder, exprs []byte) []kexpr {
	var out []kexpr
	d.Attrs(exprs, func(_ uint16, expr []byte) {
		x := kexpr{attrs: map[uint16][]byte{}}
		d.Attrs(expr, func(t uint16, v []byte) {
			switch t {
			case unix.NFTA_EXPR_NAME:
				x.name = nlcodec.String(v)
			case unix.NFTA_EXPR_DATA:
				d.Attrs(v, func(t uint16, v []byte) { x.attrs[t] = v })
			}
		})
		out = append(out, x)
	})
	return out
}

// u32 is a big-endian u32 attribute; absent or malformed reads as none.
func (x kexpr) u32(typ uint16) (uint32, bool) {
	v, ok := x.attrs[typ]
	if !ok || len(v) != 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(v), true
}

// is reports whether attribute typ is present and equals want.
func (x kexpr) is(typ uint16, want uint32) bool {
	v, ok := x.u32(typ)
	return ok && v == want
}

// value is the NFTA_DATA_VALUE inside a data nest (NFTA_CMP_DATA, …).
func (x kexpr) value(typ uint16) []byte {
	var out []byte
	_ = nlcodec.Attrs(x.attrs[typ], func(t uint16, v []byte) {
		if t == unix.NFTA_DATA_VALUE {
			out = v
		}
	})
	return out
}

// raiseRule returns the phrases of a rule's expressions.
func raiseRule(f nft.Family, exprs []kexpr) []nft.Phrase {
	r := raiser{f: f}
	var out []nft.Phrase
	for i := 0; i < len(exprs); {
		p, n := r.phrase(exprs[i:])
		if n == 0 {
			// Consecutive expressions that are no phrase make one Opaque.
			if len(out) > 0 {
				if o, ok := out[len(out)-1].(nft.Opaque); ok {
					out[len(out)-1] = nft.Opaque{Exprs: append(o.Exprs, exprs[i].name)}
					i++
					continue
				}
			}
			p, n = nft.Opaque{Exprs: []string{exprs[i].name}}, 1
		}
		out = append(out, p)
		i += n
	}
	// lowerRule puts a protocol match before a TCP reset; nft lists the
	// reset alone, and so does the rule nftproxy built.
	if len(out) > 1 && out[0] == (nft.MatchL4Proto{Proto: nft.ProtoTCP}) && hasTCPReset(out) {
		out = out[1:]
	}
	return out
}

type raiser struct{ f nft.Family }

// phrase recognises the phrase the expressions at the start of ex were
// lowered from, and returns it with the number of expressions it took (0:
// none). Longer patterns are tried before their prefixes (DNATMap starts
// like MatchL4Proto).
func (r raiser) phrase(ex []kexpr) (nft.Phrase, int) {
	for _, m := range []func([]kexpr) (nft.Phrase, int){
		r.dnatMap, r.dnatPick, r.lookup, r.updateSet, r.prefix, r.l4proto, r.ctBits, r.ctDirection, r.mark,
		r.random, r.dnat, r.fibLocal, r.iifname, r.single,
	} {
		if p, n := m(ex); n > 0 {
			return p, n
		}
	}
	return nil, 0
}

// field recognises the load of a field into reg, as loadField writes it,
// and returns the number of 4-byte slots it fills.
func (r raiser) field(x kexpr, reg uint32) (nft.Field, int, bool) {
	switch x.name {
	case "payload":
		if !x.is(unix.NFTA_PAYLOAD_DREG, reg) {
			return 0, 0, false
		}
		base, _ := x.u32(unix.NFTA_PAYLOAD_BASE)
		off, _ := x.u32(unix.NFTA_PAYLOAD_OFFSET)
		n, _ := x.u32(unix.NFTA_PAYLOAD_LEN)
		addrLen := uint32(r.f.AddrType().Len)
		switch {
		case base == unix.NFT_PAYLOAD_NETWORK_HEADER && n == addrLen && off == addrOffset(r.f, nft.FieldSrcAddr):
			return nft.FieldSrcAddr, int(n / 4), true
		case base == unix.NFT_PAYLOAD_NETWORK_HEADER && n == addrLen && off == addrOffset(r.f, nft.FieldDstAddr):
			return nft.FieldDstAddr, int(n / 4), true
		case base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && off == 2 && n == 2:
			return nft.FieldDstPort, 1, true
		case base == unix.NFT_PAYLOAD_TRANSPORT_HEADER && off == 0 && n == 2:
			return nft.FieldSrcPort, 1, true
		}
	case "meta":
		if x.is(unix.NFTA_META_KEY, unix.NFT_META_L4PROTO) && x.is(unix.NFTA_META_DREG, reg) {
			return nft.FieldL4Proto, 1, true
		}
	}
	return 0, 0, false
}

// lookup: fields loaded into consecutive slots, then a lookup in a set
// (MatchSet) or a verdict map (VmapLookup).
func (r raiser) lookup(ex []kexpr) (nft.Phrase, int) {
	var fields []nft.Field
	i, slot := 0, 0
	for ; i < len(ex); i++ {
		fd, n, ok := r.field(ex[i], slotReg(slot))
		if !ok {
			break
		}
		fields = append(fields, fd)
		slot += n
	}
	if len(fields) == 0 || i == len(ex) || ex[i].name != "lookup" || !ex[i].is(unix.NFTA_LOOKUP_SREG, reg1) {
		return nil, 0
	}
	l := ex[i]
	set := nlcodec.String(l.attrs[unix.NFTA_LOOKUP_SET])
	flags, _ := l.u32(unix.NFTA_LOOKUP_FLAGS)
	if dreg, ok := l.u32(unix.NFTA_LOOKUP_DREG); ok {
		if dreg != unix.NFT_REG_VERDICT || flags != 0 {
			return nil, 0
		}
		return nft.VmapLookup{Fields: fields, Map: set}, i + 1
	}
	return nft.MatchSet{Fields: fields, Set: set, Negate: flags&unix.NFT_LOOKUP_F_INV != 0}, i + 1
}

// updateSet: a field loaded into reg 1, then a dynset update of reg 1.
func (r raiser) updateSet(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 2 || ex[1].name != "dynset" {
		return nil, 0
	}
	fd, _, ok := r.field(ex[0], reg1)
	d := ex[1]
	if !ok || !d.is(unix.NFTA_DYNSET_OP, unix.NFT_DYNSET_OP_UPDATE) || !d.is(unix.NFTA_DYNSET_SREG_KEY, reg1) {
		return nil, 0
	}
	if _, data := d.attrs[unix.NFTA_DYNSET_SREG_DATA]; data {
		return nil, 0
	}
	return nft.UpdateSet{Field: fd, Set: nlcodec.String(d.attrs[unix.NFTA_DYNSET_SET_NAME])}, 2
}

// prefix: the first bytes of an address compared, or the whole address
// masked and compared (see lowerPrefix).
func (r raiser) prefix(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 2 || ex[0].name != "payload" || !ex[0].is(unix.NFTA_PAYLOAD_DREG, reg1) ||
		!ex[0].is(unix.NFTA_PAYLOAD_BASE, unix.NFT_PAYLOAD_NETWORK_HEADER) {
		return nil, 0
	}
	var fd nft.Field
	switch off, _ := ex[0].u32(unix.NFTA_PAYLOAD_OFFSET); off {
	case addrOffset(r.f, nft.FieldSrcAddr):
		fd = nft.FieldSrcAddr
	case addrOffset(r.f, nft.FieldDstAddr):
		fd = nft.FieldDstAddr
	default:
		return nil, 0
	}
	addrLen := r.f.AddrType().Len
	n, _ := ex[0].u32(unix.NFTA_PAYLOAD_LEN)
	if n == 0 || int(n) > addrLen {
		return nil, 0
	}
	bitsLen, used := int(n)*8, 1
	if ex[1].name == "bitwise" {
		mask := ex[1].value(unix.NFTA_BITWISE_MASK)
		ones, ok := prefixOnes(mask)
		if !ok || int(n) != addrLen || len(mask) != addrLen || !isZero(ex[1].value(unix.NFTA_BITWISE_XOR)) ||
			!ex[1].is(unix.NFTA_BITWISE_SREG, reg1) || !ex[1].is(unix.NFTA_BITWISE_DREG, reg1) {
			return nil, 0
		}
		bitsLen, used = ones, 2
	}
	if len(ex) <= used {
		return nil, 0
	}
	neg, data, ok := cmpOn(ex[used], reg1)
	if !ok || len(data) != int(n) {
		return nil, 0
	}
	full := make([]byte, addrLen)
	copy(full, data)
	a, _ := netip.AddrFromSlice(full)
	p, err := a.Prefix(bitsLen)
	if err != nil || p.Addr() != a {
		return nil, 0 // bits outside the mask: not a prefix nft would write
	}
	return nft.MatchPrefix{Field: fd, Prefix: p, Negate: neg}, used + 1
}

// prefixOnes returns the number of leading one bits of a mask whose other
// bits are all zero.
func prefixOnes(mask []byte) (int, bool) {
	ones, done := 0, false
	for _, b := range mask {
		l := bits.LeadingZeros8(^b)
		if done && b != 0 || l < 8 && b<<l != 0 {
			return 0, false
		}
		ones += l
		done = done || l < 8
	}
	return ones, true
}

func isZero(b []byte) bool { return len(bytes.Trim(b, "\x00")) == 0 }

// cmpOn reads a cmp eq or neq of reg.
func cmpOn(x kexpr, reg uint32) (neg bool, data []byte, ok bool) {
	if x.name != "cmp" || !x.is(unix.NFTA_CMP_SREG, reg) {
		return false, nil, false
	}
	switch op, _ := x.u32(unix.NFTA_CMP_OP); op {
	case unix.NFT_CMP_EQ:
	case unix.NFT_CMP_NEQ:
		neg = true
	default:
		return false, nil, false
	}
	return neg, x.value(unix.NFTA_CMP_DATA), true
}

// cmpEq reads a cmp eq of reg 1 with want.
func cmpEq(x kexpr, want []byte) bool {
	neg, data, ok := cmpOn(x, reg1)
	return ok && !neg && bytes.Equal(data, want)
}

func (r raiser) metaLoad(x kexpr, key uint32) bool {
	return x.name == "meta" && x.is(unix.NFTA_META_KEY, key) && x.is(unix.NFTA_META_DREG, reg1)
}

// l4proto: [ meta load l4proto => reg 1 ] [ cmp eq reg 1 <proto> ]
func (r raiser) l4proto(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 2 || !r.metaLoad(ex[0], unix.NFT_META_L4PROTO) {
		return nil, 0
	}
	neg, data, ok := cmpOn(ex[1], reg1)
	if !ok || neg || len(data) != 1 {
		return nil, 0
	}
	return nft.MatchL4Proto{Proto: data[0]}, 2
}

// bitsTest reads [ bitwise reg 1 = ( reg 1 & mask ) ^ 0 ] [ cmp neq reg 1 0 ]
// and returns the mask.
func bitsTest(ex []kexpr) (uint32, bool) {
	if len(ex) < 2 || ex[0].name != "bitwise" || !isZero(ex[0].value(unix.NFTA_BITWISE_XOR)) {
		return 0, false
	}
	mask := ex[0].value(unix.NFTA_BITWISE_MASK)
	neg, data, ok := cmpOn(ex[1], reg1)
	if len(mask) != 4 || !ok || !neg || !bytes.Equal(data, hostU32(0)) {
		return 0, false
	}
	return binary.NativeEndian.Uint32(mask), true
}

// ctBits: ct state new, ct status dnat.
func (r raiser) ctBits(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 3 || ex[0].name != "ct" || !ex[0].is(unix.NFTA_CT_DREG, reg1) {
		return nil, 0
	}
	mask, ok := bitsTest(ex[1:])
	switch {
	case ok && mask == ctStateNew && ex[0].is(unix.NFTA_CT_KEY, unix.NFT_CT_STATE):
		return nft.MatchCtStateNew{}, 3
	case ok && mask == ipsDstNAT && ex[0].is(unix.NFTA_CT_KEY, unix.NFT_CT_STATUS):
		return nft.MatchCtStatusDNAT{}, 3
	}
	return nil, 0
}

// ctDirection: ct direction original, ct direction reply.
func (r raiser) ctDirection(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 2 || ex[0].name != "ct" || !ex[0].is(unix.NFTA_CT_DREG, reg1) || !ex[0].is(unix.NFTA_CT_KEY, unix.NFT_CT_DIRECTION) {
		return nil, 0
	}
	for _, m := range []nft.MatchCtDirection{{}, {Reply: true}} {
		if cmpEq(ex[1], []byte{ctDirection(m)}) {
			return m, 2
		}
	}
	return nil, 0
}

// mark: a test of mark bits (MatchMarkBits) or a change of them
// (SetMarkBits, ToggleMarkBits), see setMark.
func (r raiser) mark(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 3 || !r.metaLoad(ex[0], unix.NFT_META_MARK) {
		return nil, 0
	}
	if mask, ok := bitsTest(ex[1:]); ok {
		return nft.MatchMarkBits{Mask: mask}, 3
	}
	b, set := ex[1], ex[2]
	mask, xor := b.value(unix.NFTA_BITWISE_MASK), b.value(unix.NFTA_BITWISE_XOR)
	if b.name != "bitwise" || len(mask) != 4 || len(xor) != 4 || set.name != "meta" ||
		!set.is(unix.NFTA_META_KEY, unix.NFT_META_MARK) || !set.is(unix.NFTA_META_SREG, reg1) {
		return nil, 0
	}
	m, x := binary.NativeEndian.Uint32(mask), binary.NativeEndian.Uint32(xor)
	switch {
	case m == 0xffffffff && x != 0:
		return nft.ToggleMarkBits{Bits: x}, 3
	case m == ^x:
		return nft.SetMarkBits{Bits: x}, 3
	}
	return nil, 0
}

// random: [ numgen reg 1 = random mod N ] [ cmp eq reg 1 0 ]
func (r raiser) random(ex []kexpr) (nft.Phrase, int) {
	mod, offset, ok := numgen(ex)
	if !ok || offset != 0 || len(ex) < 2 || !cmpEq(ex[1], hostU32(0)) {
		return nil, 0
	}
	return nft.MatchRandom{Mod: mod}, 2
}

func numgen(ex []kexpr) (mod, offset uint32, ok bool) { return numgenTo(ex, reg1) }

// numgenTo is numgen into register dreg.
func numgenTo(ex []kexpr, dreg uint32) (mod, offset uint32, ok bool) {
	if len(ex) == 0 || ex[0].name != "numgen" || !ex[0].is(unix.NFTA_NG_TYPE, unix.NFT_NG_RANDOM) ||
		!ex[0].is(unix.NFTA_NG_DREG, dreg) {
		return 0, 0, false
	}
	mod, ok = ex[0].u32(unix.NFTA_NG_MODULUS)
	offset, _ = ex[0].u32(unix.NFTA_NG_OFFSET)
	return mod, offset, ok
}

// natDNAT reports whether x is a dnat of this family from the registers.
func (r raiser) natDNAT(x kexpr, addrReg, protoReg uint32) bool {
	return x.name == "nat" && x.is(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT) && x.is(unix.NFTA_NAT_FAMILY, uint32(r.f)) &&
		x.is(unix.NFTA_NAT_REG_ADDR_MIN, addrReg) && x.is(unix.NFTA_NAT_REG_PROTO_MIN, protoReg)
}

// dnatMap: see lowerDNATMap.
func (r raiser) dnatMap(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 6 {
		return nil, 0
	}
	proto, n := r.l4proto(ex)
	mod, offset, ok := numgen(ex[2:])
	if n == 0 || !ok || mod != nft.EndpointBuckets || offset%nft.EndpointBuckets != 0 ||
		offset/nft.EndpointBuckets >= nft.EndpointsSlots {
		return nil, 0
	}
	bo, l := ex[3], ex[4]
	if bo.name != "byteorder" || !bo.is(unix.NFTA_BYTEORDER_OP, unix.NFT_BYTEORDER_HTON) ||
		l.name != "lookup" || !l.is(unix.NFTA_LOOKUP_SREG, reg1) || !l.is(unix.NFTA_LOOKUP_DREG, reg1) ||
		!r.natDNAT(ex[5], reg1, slotReg(r.f.AddrType().Len/4)) {
		return nil, 0
	}
	return nft.DNATMap{
		Proto: proto.(nft.MatchL4Proto).Proto,
		Map:   nlcodec.String(l.attrs[unix.NFTA_LOOKUP_SET]),
		Slot:  uint16(offset / nft.EndpointBuckets),
	}, 6
}

// dnatPick: see lowerDNATPick.
func (r raiser) dnatPick(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 7 {
		return nil, 0
	}
	proto, n := r.l4proto(ex)
	a := r.f.AddrType().Len / 4
	if n == 0 {
		return nil, 0
	}
	if fd, _, ok := r.field(ex[2], slotReg(0)); !ok || fd != nft.FieldDstAddr {
		return nil, 0
	}
	if fd, _, ok := r.field(ex[3], slotReg(a)); !ok || fd != nft.FieldDstPort {
		return nil, 0
	}
	mod, offset, ok := numgenTo(ex[4:], slotReg(a+1))
	if !ok || offset != 0 || !nft.PickModOK(mod) {
		return nil, 0
	}
	l := ex[5]
	if l.name != "lookup" || !l.is(unix.NFTA_LOOKUP_SREG, reg1) || !l.is(unix.NFTA_LOOKUP_DREG, reg1) ||
		!r.natDNAT(ex[6], reg1, slotReg(a)) {
		return nil, 0
	}
	return nft.DNATPick{Proto: proto.(nft.MatchL4Proto).Proto, Map: nlcodec.String(l.attrs[unix.NFTA_LOOKUP_SET]), Mod: mod}, 7
}

// dnat: the address and port as immediates, then nat (see lowerDNAT).
func (r raiser) dnat(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 3 || ex[0].name != "immediate" || ex[1].name != "immediate" ||
		!ex[0].is(unix.NFTA_IMMEDIATE_DREG, reg1) || !ex[1].is(unix.NFTA_IMMEDIATE_DREG, reg2) ||
		!r.natDNAT(ex[2], reg1, reg2) {
		return nil, 0
	}
	addr, port := ex[0].value(unix.NFTA_IMMEDIATE_DATA), ex[1].value(unix.NFTA_IMMEDIATE_DATA)
	a, ok := netip.AddrFromSlice(addr)
	if !ok || len(addr) != r.f.AddrType().Len || len(port) != 2 {
		return nil, 0
	}
	return nft.DNAT{To: netip.AddrPortFrom(a, binary.BigEndian.Uint16(port))}, 3
}

// fibLocal: [ fib daddr type => reg 1 ] [ cmp eq reg 1 RTN_LOCAL ]
func (r raiser) fibLocal(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 2 || ex[0].name != "fib" || !ex[0].is(unix.NFTA_FIB_RESULT, unix.NFT_FIB_RESULT_ADDRTYPE) ||
		!ex[0].is(unix.NFTA_FIB_DREG, reg1) || !cmpEq(ex[1], hostU32(unix.RTN_LOCAL)) {
		return nil, 0
	}
	switch flags, _ := ex[0].u32(unix.NFTA_FIB_FLAGS); flags {
	case unix.NFTA_FIB_F_DADDR:
		return nft.MatchFibLocal{Field: nft.FieldDstAddr}, 2
	case unix.NFTA_FIB_F_SADDR:
		return nft.MatchFibLocal{Field: nft.FieldSrcAddr}, 2
	}
	return nil, 0
}

// iifname: a NUL-padded name is exact, a shorter one a prefix (see
// lowerIifname).
func (r raiser) iifname(ex []kexpr) (nft.Phrase, int) {
	if len(ex) < 2 || !r.metaLoad(ex[0], unix.NFT_META_IIFNAME) {
		return nil, 0
	}
	neg, data, ok := cmpOn(ex[1], reg1)
	if !ok || len(data) == 0 {
		return nil, 0
	}
	if len(data) == unix.IFNAMSIZ {
		name := nlcodec.String(data)
		if name == "" || !isZero(data[len(name):]) {
			return nil, 0
		}
		return nft.MatchIifname{Name: name, Negate: neg}, 2
	}
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, 0
	}
	return nft.MatchIifname{Name: string(data), Prefix: true, Negate: neg}, 2
}

// single: the phrases of one expression (masquerade, reject, a verdict).
func (r raiser) single(ex []kexpr) (nft.Phrase, int) {
	x := ex[0]
	switch x.name {
	case "masq":
		if flags, _ := x.u32(unix.NFTA_MASQ_FLAGS); flags == unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY {
			return nft.Masquerade{}, 1
		}
	case "reject":
		code := x.attrs[unix.NFTA_REJECT_ICMP_CODE]
		switch typ, _ := x.u32(unix.NFTA_REJECT_TYPE); {
		case typ == unix.NFT_REJECT_TCP_RST:
			return nft.RejectTCPReset{}, 1
		case typ == unix.NFT_REJECT_ICMP_UNREACH && len(code) == 1 && code[0] == rejectCode(r.f):
			return nft.Reject{}, 1
		}
	case "immediate":
		if !x.is(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT) {
			break
		}
		var d nlcodec.Decoder
		var v nft.Verdict
		d.Attrs(x.attrs[unix.NFTA_IMMEDIATE_DATA], func(t uint16, b []byte) {
			if t == unix.NFTA_DATA_VERDICT {
				v = decodeVerdict(&d, b)
			}
		})
		if d.Err() == nil && v.Kind != "" {
			return nft.VerdictPhrase{Verdict: v}, 1
		}
	}
	return nil, 0
}
