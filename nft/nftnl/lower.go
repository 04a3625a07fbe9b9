package nftnl

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file lowers the phrases of rule.go to kernel expressions exactly as
// nft 1.0.6 does: same registers, same byte order, same attributes. Each
// function names the nft text it stands for and the bytecode nft writes
// for it (`nft --debug=netlink`); TestNetlinkBytesMatchNft compares the
// messages byte for byte with nft's own. The expressions are written
// straight into the batch (expr.go).

// Registers. nft allocates 4-byte register slots from the start of register
// 1 for each match or statement, and names a slot by its 16-byte register
// (NFT_REG_1…) when it starts one, else by its 4-byte register
// (NFT_REG32_00 + slot): slots 0, 1, 2 → reg 1, 9, 10; slot 4 → reg 2
// (nftables src/netlink_linearize.c, netlink_put_register).
func slotReg(slot int) uint32 {
	if slot%4 == 0 {
		return uint32(unix.NFT_REG_1 + slot/4)
	}
	return uint32(unix.NFT_REG32_00 + slot)
}

const (
	reg1 = unix.NFT_REG_1
	reg2 = unix.NFT_REG_2
)

// Bits tested by MatchCtStateNew and MatchCtStatusDNAT: the ct state bit of
// IP_CT_NEW (NF_CT_STATE_BIT, include/uapi/linux/netfilter/nf_conntrack_common.h)
// and IPS_DST_NAT, the ct status bit of a destination-NATed connection.
const (
	ctStateNew = 1 << (2 + 1)
	ipsDstNAT  = 1 << 5
)

// ctDirection is the value of ct direction MatchCtDirection matches:
// IP_CT_DIR_ORIGINAL (0) or IP_CT_DIR_REPLY (1).
func ctDirection(m nft.MatchCtDirection) byte {
	if m.Reply {
		return 1
	}
	return 0
}

// lowerRule writes the expressions of a rule, inside the rule's
// NFTA_RULE_EXPRESSIONS nest.
func (b *batch) lowerRule(r nft.Rule) error {
	phrases := r.Phrases
	if hasTCPReset(phrases) {
		// nft resolves the reset's protocol dependency by putting the
		// protocol match first in the rule; so do we.
		b.lowerPhrase(nft.MatchL4Proto{Proto: nft.ProtoTCP})
	}
	for _, p := range phrases {
		if err := b.lowerPhrase(p); err != nil {
			return fmt.Errorf("rule %q: %w", r.Text(b.family), err)
		}
	}
	return nil
}

func hasTCPReset(phrases []nft.Phrase) bool {
	for _, p := range phrases {
		if _, ok := p.(nft.RejectTCPReset); ok {
			return true
		}
	}
	return false
}

func (b *batch) lowerPhrase(p nft.Phrase) error {
	e, f := &b.enc, b.family
	switch p := p.(type) {
	case nft.MatchPrefix:
		return lowerPrefix(e, f, p)
	case nft.MatchSet:
		return b.lowerLookup(p.Fields, p.Set, p.Negate, false)
	case nft.VmapLookup:
		return b.lowerLookup(p.Fields, p.Map, false, true)
	case nft.MatchL4Proto:
		// [ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x00000006 ]
		e.metaLoad(unix.NFT_META_L4PROTO, reg1)
		e.cmp(unix.NFT_CMP_EQ, reg1, []byte{p.Proto})
	case nft.MatchCtStateNew:
		// [ ct load state => reg 1 ] [ bitwise reg 1 = ( reg 1 & 0x00000008 ) ^ 0 ] [ cmp neq reg 1 0 ]
		e.ctLoad(unix.NFT_CT_STATE, reg1)
		bitsSet(e, ctStateNew, false)
	case nft.MatchCtStatusDNAT:
		// [ ct load status => reg 1 ] [ bitwise … & 0x00000020 … ] [ cmp neq reg 1 0 ]
		e.ctLoad(unix.NFT_CT_STATUS, reg1)
		bitsSet(e, ipsDstNAT, false)
	case nft.MatchCtDirection:
		// [ ct load direction => reg 1 ] [ cmp eq reg 1 0x00000001 ]
		// (IP_CT_DIR_REPLY; the direction is one byte).
		e.ctLoad(unix.NFT_CT_DIRECTION, reg1)
		e.cmp(unix.NFT_CMP_EQ, reg1, []byte{ctDirection(p)})
	case nft.MatchMarkBits:
		// [ meta load mark => reg 1 ] [ bitwise … & mask … ] [ cmp neq reg 1 0 ]
		e.metaLoad(unix.NFT_META_MARK, reg1)
		bitsSet(e, p.Mask, true)
	case nft.SetMarkBits:
		// mark | bits is (mark & ^bits) ^ bits.
		setMark(e, ^p.Bits, p.Bits)
	case nft.ToggleMarkBits:
		// mark ^ bits is (mark & 0xffffffff) ^ bits.
		setMark(e, 0xffffffff, p.Bits)
	case nft.Masquerade:
		// [ masq flags 0x10 ]
		e.masq(unix.NF_NAT_RANGE_PROTO_RANDOM_FULLY)
	case nft.Reject:
		lowerReject(e, f)
	case nft.RejectTCPReset:
		// [ reject type 1 code 0 ], after the rule's leading
		// [ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x00000006 ]
		// (see lowerRule).
		e.reject(unix.NFT_REJECT_TCP_RST, 0)
	case nft.VerdictPhrase:
		// [ immediate reg 0 jump -> chain ]
		e.immediateVerdict(p.Verdict)
	case nft.MatchRandom:
		// [ numgen reg 1 = random mod N ] [ cmp eq reg 1 0x00000000 ]
		e.numgenRandom(reg1, p.Mod)
		e.cmp(unix.NFT_CMP_EQ, reg1, hostU32(0))
	case nft.DNAT:
		return lowerDNAT(e, f, p)
	case nft.DNATMap:
		return b.lowerDNATMap(p)
	case nft.DNATPick:
		return b.lowerDNATPick(p)
	case nft.MatchFibLocal:
		// [ fib daddr type => reg 1 ] [ cmp eq reg 1 0x00000002 ] (RTN_LOCAL)
		flags := uint32(unix.NFTA_FIB_F_DADDR)
		if p.Field == nft.FieldSrcAddr {
			flags = unix.NFTA_FIB_F_SADDR
		}
		e.fib(flags, unix.NFT_FIB_RESULT_ADDRTYPE, reg1)
		e.cmp(unix.NFT_CMP_EQ, reg1, hostU32(unix.RTN_LOCAL))
	case nft.MatchIifname:
		return lowerIifname(e, p)
	case nft.UpdateSet:
		// [ payload load 4b @ network header + 12 => reg 1 ] [ dynset update reg_key 1 set s ]
		if _, err := loadField(e, f, p.Field, 0); err != nil {
			return err
		}
		e.dynsetUpdate(reg1, p.Set, b.setIDs[p.Set])
	default:
		return fmt.Errorf("phrase %T cannot be lowered", p)
	}
	return nil
}

// hostU32 is a 4-byte value in host byte order, the order of ct state, ct
// status, meta mark and numgen in registers.
func hostU32(v uint32) []byte {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return b[:]
}

// bitsSet tests that the 4-byte host-order value in reg 1 has any of the
// bits set: bitwise (v & bits) ^ 0; cmp neq 0. An explicit `&` (meta mark)
// carries the bitwise op, a flag test (ct state, ct status) does not.
func bitsSet(e *encoder, bits uint32, explicitOp bool) {
	e.bitwise(reg1, reg1, hostU32(bits), hostU32(0), explicitOp)
	e.cmp(unix.NFT_CMP_NEQ, reg1, hostU32(0))
}

// setMark writes meta mark = (meta mark & mask) ^ xor, with the bitwise op
// as nft writes it for an explicit `|` or `^`:
//
//	[ meta load mark => reg 1 ] [ bitwise reg 1 = ( reg 1 & mask ) ^ xor ] [ meta set mark with reg 1 ]
func setMark(e *encoder, mask, xor uint32) {
	e.metaLoad(unix.NFT_META_MARK, reg1)
	e.bitwise(reg1, reg1, hostU32(mask), hostU32(xor), true)
	e.metaSet(unix.NFT_META_MARK, reg1)
}

// lowerReject: nft's plain `reject` in an ip table is ICMP port unreachable
// ([ reject type 0 code 3 ]), in an ip6 table ICMPv6 port unreachable
// ([ reject type 0 code 4 ]); type 0 is NFT_REJECT_ICMP_UNREACH.
func lowerReject(e *encoder, f nft.Family) {
	e.reject(unix.NFT_REJECT_ICMP_UNREACH, rejectCode(f))
}

// rejectCode is the port unreachable code of the family's ICMP.
func rejectCode(f nft.Family) uint8 {
	if f == nft.IPv6 {
		return 4 // ICMPV6_PORT_UNREACH
	}
	return 3 // ICMP_PORT_UNREACH
}

// addrOffset is the offset of the source or destination address in the
// network header: ip saddr @12, daddr @16; ip6 saddr @8, daddr @24.
func addrOffset(f nft.Family, fd nft.Field) uint32 {
	switch {
	case f == nft.IPv4 && fd == nft.FieldSrcAddr:
		return 12
	case f == nft.IPv4:
		return 16
	case fd == nft.FieldSrcAddr:
		return 8
	}
	return 24
}

// loadField loads a field into the register of a slot, and returns the
// number of slots it takes:
//
//	ip daddr      [ payload load 4b @ network header + 16 => reg ]
//	ip6 saddr     [ payload load 16b @ network header + 8 => reg ]
//	meta l4proto  [ meta load l4proto => reg ]
//	th dport      [ payload load 2b @ transport header + 2 => reg ]
//	th sport      [ payload load 2b @ transport header + 0 => reg ]
func loadField(e *encoder, f nft.Family, fd nft.Field, slot int) (int, error) {
	reg := slotReg(slot)
	switch fd {
	case nft.FieldSrcAddr, nft.FieldDstAddr:
		n := uint32(f.AddrType().Len)
		e.payloadLoad(unix.NFT_PAYLOAD_NETWORK_HEADER, addrOffset(f, fd), n, reg)
		return int(n / 4), nil
	case nft.FieldL4Proto:
		e.metaLoad(unix.NFT_META_L4PROTO, reg)
		return 1, nil
	case nft.FieldDstPort:
		e.payloadLoad(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, reg)
		return 1, nil
	case nft.FieldSrcPort:
		e.payloadLoad(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 0, 2, reg)
		return 1, nil
	}
	return 0, fmt.Errorf("unknown field %d", int(fd))
}

// lowerLookup loads the (concatenated) fields into consecutive slots and
// looks them up in a named set, or a verdict map (dreg 0):
//
//	ip daddr . meta l4proto . th dport vmap @service-ips
//	  [ payload load 4b @ network header + 16 => reg 1 ] [ meta load l4proto => reg 9 ]
//	  [ payload load 2b @ transport header + 2 => reg 10 ] [ lookup reg 1 set service-ips dreg 0 ]
//	ip daddr != @cluster-ips
//	  [ payload load 4b @ network header + 16 => reg 1 ] [ lookup reg 1 set cluster-ips 0x1 ]
//
// A set created in the same batch is also named by its set ID, as nft does.
func (b *batch) lowerLookup(fields []nft.Field, set string, negate, vmap bool) error {
	if len(fields) == 0 {
		return fmt.Errorf("lookup in @%s without fields", set)
	}
	slot := 0
	for _, fd := range fields {
		n, err := loadField(&b.enc, b.family, fd, slot)
		if err != nil {
			return err
		}
		slot += n
	}
	b.enc.lookup(reg1, set, b.setIDs[set], vmap, negate)
	return nil
}

// lowerPrefix matches an address against a prefix the way nft does:
//
//	ip daddr 10.96.0.10      [ payload load 4b @ network header + 16 => reg 1 ] [ cmp eq reg 1 0x0a00600a ]
//	ip saddr != 10.244.0.0/16 [ payload load 2b @ network header + 12 => reg 1 ] [ cmp neq reg 1 0x0000f40a ]
//	ip daddr 10.96.0.0/12    [ payload load 4b … ] [ bitwise reg 1 = ( reg 1 & 0x0000f0ff ) ^ 0 ] [ cmp eq reg 1 0x0000600a ]
//
// A byte-aligned prefix loads only its bytes; any other loads the whole
// address and masks it (also in ip6: /60 loads 16 bytes).
func lowerPrefix(e *encoder, f nft.Family, m nft.MatchPrefix) error {
	if m.Field != nft.FieldSrcAddr && m.Field != nft.FieldDstAddr {
		return fmt.Errorf("prefix match on %s", m.Field.Text(f))
	}
	p := m.Prefix.Masked()
	addr, err := addrBytes(f, p.Addr())
	if err != nil {
		return err
	}
	bits := p.Bits()
	if bits <= 0 {
		return fmt.Errorf("prefix %v matches everything; leave the match out", m.Prefix)
	}
	op := uint32(unix.NFT_CMP_EQ)
	if m.Negate {
		op = unix.NFT_CMP_NEQ
	}
	off := addrOffset(f, m.Field)
	if bits%8 == 0 {
		e.payloadLoad(unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(bits/8), reg1)
		e.cmp(op, reg1, addr[:bits/8])
		return nil
	}
	e.payloadLoad(unix.NFT_PAYLOAD_NETWORK_HEADER, off, uint32(len(addr)), reg1)
	e.bitwise(reg1, reg1, prefixMask(len(addr), bits), make([]byte, len(addr)), false)
	e.cmp(op, reg1, addr)
	return nil
}

func prefixMask(n, bits int) []byte {
	mask := make([]byte, n)
	for i := 0; i < bits; i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return mask
}

// lowerDNAT: the backend's address and port as immediates, then nat:
//
//	dnat to 10.244.1.11:8080
//	  [ immediate reg 1 0x0b01f40a ] [ immediate reg 2 0x0000901f ]
//	  [ nat dnat ip addr_min reg 1 proto_min reg 2 flags 0x2 ]
//	dnat to [fd00:244:1::11]:8080
//	  [ immediate reg 1 0x440200fd 0x00000100 0x00000000 0x11000000 ] [ immediate reg 2 0x0000901f ]
//	  [ nat dnat ip6 addr_min reg 1 proto_min reg 2 flags 0x2 ]
//
// flags 0x2 is NF_NAT_RANGE_PROTO_SPECIFIED. The kernel fills in the rest
// itself: reading the rule back, `nft --debug=netlink list` shows
// addr_max reg 1 proto_max reg 2 flags 0x3 (NF_NAT_RANGE_MAP_IPS added),
// in both families; nft 1.0.6 writes only what is above.
func lowerDNAT(e *encoder, f nft.Family, d nft.DNAT) error {
	a := d.To.Addr()
	if !f.Contains(a) {
		return fmt.Errorf("%v is not an %s address", a, f)
	}
	if f == nft.IPv4 {
		a4 := a.As4()
		e.immediate(reg1, a4[:])
	} else {
		a16 := a.As16()
		e.immediate(reg1, a16[:])
	}
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], d.To.Port())
	e.immediate(reg2, port[:])
	e.dnat(uint32(f), reg1, reg2, unix.NF_NAT_RANGE_PROTO_SPECIFIED)
	return nil
}

// lowerDNATMap: the protocol match, then a random bucket of the slot
// (turned to network byte order, as the interval map's keys are), looked
// up in the endpoints map with the endpoint landing in reg 1 (address) and
// the 32-bit register after the address (port), then nat from those
// registers, as nft 1.0.6 writes it:
//
//	meta l4proto tcp dnat ip to numgen random mod 65536 offset 131072 map @endpoints-tcp-0
//	  [ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x00000006 ]
//	  [ numgen reg 1 = random mod 65536 offset 131072 ] [ byteorder reg 1 = hton(reg 1, 4, 4) ]
//	  [ lookup reg 1 set endpoints-tcp-0 dreg 1 ] [ nat dnat ip addr_min reg 1 proto_min reg 9 ]
//
// In ip6 the address takes reg 1 whole: proto_min reg 2. Unlike
// lowerDNAT's, this nat carries no flags.
func (b *batch) lowerDNATMap(d nft.DNATMap) error {
	if !nft.EndpointsProtoOK(d.Proto) {
		return fmt.Errorf("no endpoints map for protocol %s", nft.ProtoName(d.Proto))
	}
	if d.Slot >= nft.EndpointsSlots {
		return fmt.Errorf("endpoints slot %d: want below %d", d.Slot, nft.EndpointsSlots)
	}
	e := &b.enc
	e.metaLoad(unix.NFT_META_L4PROTO, reg1)
	e.cmp(unix.NFT_CMP_EQ, reg1, []byte{d.Proto})
	e.numgenRandomOffset(reg1, nft.EndpointBuckets, uint32(d.Slot)*nft.EndpointBuckets)
	e.byteorderHton(reg1, reg1, 4, 4)
	e.lookupData(reg1, reg1, d.Map, b.setIDs[d.Map])
	e.dnat(uint32(b.family), reg1, slotReg(b.family.AddrType().Len/4), 0)
	return nil
}

// lowerDNATPick: the protocol match, the destination address and port
// and a random number below Mod concatenated from reg 1 on, looked up in
// the pick map with the endpoint landing in reg 1 (address) and the 32-bit
// register after the address (port), then nat from those registers, as
// nft 1.0.6 writes it:
//
//	dnat ip to ip daddr . tcp dport . numgen random mod 2 map @endpoints-tcp-n2
//	  [ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x00000006 ]
//	  [ payload load 4b @ network header + 16 => reg 1 ] [ payload load 2b @ transport header + 2 => reg 9 ]
//	  [ numgen reg 10 = random mod 2 ] [ lookup reg 1 set endpoints-tcp-n2 dreg 1 ]
//	  [ nat dnat ip addr_min reg 1 proto_min reg 9 ]
//
// In ip6 the address takes reg 1 whole: the port reg 2, the number reg 13.
// No byteorder: the map is exact, its keys in the registers' order.
func (b *batch) lowerDNATPick(d nft.DNATPick) error {
	if !nft.EndpointsProtoOK(d.Proto) {
		return fmt.Errorf("no pick map for protocol %s", nft.ProtoName(d.Proto))
	}
	if !nft.PickModOK(d.Mod) {
		return fmt.Errorf("pick of %d endpoints: want 1 to %d", d.Mod, nft.MaxPickEndpoints)
	}
	e := &b.enc
	e.metaLoad(unix.NFT_META_L4PROTO, reg1)
	e.cmp(unix.NFT_CMP_EQ, reg1, []byte{d.Proto})
	a, _ := loadField(e, b.family, nft.FieldDstAddr, 0)
	loadField(e, b.family, nft.FieldDstPort, a)
	e.numgenRandom(slotReg(a+1), d.Mod)
	e.lookupData(reg1, reg1, d.Map, b.setIDs[d.Map])
	e.dnat(uint32(b.family), reg1, slotReg(a), 0)
	return nil
}

// lowerIifname: an exact name is compared with its NUL padding to IFNAMSIZ,
// a prefix (`"veth*"`) with its bytes alone:
//
//	[ meta load iifname => reg 1 ] [ cmp eq reg 1 0x30726263 0x00000000 0x00000000 0x00000000 ]
//	[ meta load iifname => reg 1 ] [ cmp neq reg 1 0x68746576 ]
func lowerIifname(e *encoder, m nft.MatchIifname) error {
	if len(m.Name) == 0 || len(m.Name) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q: want 1 to %d bytes", m.Name, unix.IFNAMSIZ-1)
	}
	data := []byte(m.Name)
	if !m.Prefix {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, m.Name)
	}
	op := uint32(unix.NFT_CMP_EQ)
	if m.Negate {
		op = unix.NFT_CMP_NEQ
	}
	e.metaLoad(unix.NFT_META_IIFNAME, reg1)
	e.cmp(op, reg1, data)
	return nil
}
