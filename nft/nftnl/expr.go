package nftnl

import (
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// This file writes kernel expressions (net/netfilter/nft_*.c) straight into
// the batch, each an NFTA_LIST_ELEM of the rule's NFTA_RULE_EXPRESSIONS:
// its name, then its attributes in an NFTA_EXPR_DATA nest, in the order
// libnftnl writes them for nft 1.0.6 (src/expr/*.c, checked by
// TestNetlinkBytesMatchNft). Registers, keys, operators and flags are
// big-endian u32 attributes; data values are bytes as given.
//
// Writing the expressions here rather than with google/nftables' expr
// package saves an intermediate value and several allocations per
// expression; with the buffer sized up front (sizeHint), a cold start's
// encoding is several times faster (docs/code-figures.md).

// NFTA_BITWISE_OP (include/uapi/linux/netfilter/nf_tables.h, Linux 5.6+),
// not in x/sys/unix.
const nftaBitwiseOp = 6

// beginExpr starts an expression and returns the offsets for endExpr.
func (e *encoder) beginExpr(name string) (elem, data int) {
	elem = e.Nest(unix.NFTA_LIST_ELEM)
	e.Str(unix.NFTA_EXPR_NAME, name)
	return elem, e.Nest(unix.NFTA_EXPR_DATA)
}

func (e *encoder) endExpr(elem, data int) {
	e.EndNest(data)
	e.EndNest(elem)
}

// value writes a nest (NFTA_CMP_DATA, NFTA_BITWISE_MASK, …) holding one
// NFTA_DATA_VALUE.
func (e *encoder) value(typ uint16, v []byte) {
	n := e.Nest(typ)
	e.Attr(unix.NFTA_DATA_VALUE, v)
	e.EndNest(n)
}

// metaLoad: [ meta load <key> => reg <dreg> ]
func (e *encoder) metaLoad(key, dreg uint32) {
	el, d := e.beginExpr("meta")
	e.BE32(unix.NFTA_META_KEY, key)
	e.BE32(unix.NFTA_META_DREG, dreg)
	e.endExpr(el, d)
}

// metaSet: [ meta set <key> with reg <sreg> ]
func (e *encoder) metaSet(key, sreg uint32) {
	el, d := e.beginExpr("meta")
	e.BE32(unix.NFTA_META_KEY, key)
	e.BE32(unix.NFTA_META_SREG, sreg)
	e.endExpr(el, d)
}

// ctLoad: [ ct load <key> => reg <dreg> ]
func (e *encoder) ctLoad(key, dreg uint32) {
	el, d := e.beginExpr("ct")
	e.BE32(unix.NFTA_CT_KEY, key)
	e.BE32(unix.NFTA_CT_DREG, dreg)
	e.endExpr(el, d)
}

// payloadLoad: [ payload load <n>b @ <base> header + <offset> => reg <dreg> ]
func (e *encoder) payloadLoad(base, offset, n, dreg uint32) {
	el, d := e.beginExpr("payload")
	e.BE32(unix.NFTA_PAYLOAD_DREG, dreg)
	e.BE32(unix.NFTA_PAYLOAD_BASE, base)
	e.BE32(unix.NFTA_PAYLOAD_OFFSET, offset)
	e.BE32(unix.NFTA_PAYLOAD_LEN, n)
	e.endExpr(el, d)
}

// cmp: [ cmp <op> reg <sreg> <data> ]
func (e *encoder) cmp(op, sreg uint32, data []byte) {
	el, d := e.beginExpr("cmp")
	e.BE32(unix.NFTA_CMP_SREG, sreg)
	e.BE32(unix.NFTA_CMP_OP, op)
	e.value(unix.NFTA_CMP_DATA, data)
	e.endExpr(el, d)
}

// bitwise: [ bitwise reg <dreg> = ( reg <sreg> & <mask> ) ^ <xor> ]. nft
// adds NFTA_BITWISE_OP = NFT_BITWISE_BOOL (withOp) for an explicit `&`, `|`
// or `^` on meta mark, not for a flag test (ct state, ct status) or a prefix
// mask; the kernel treats a missing op as the same operation.
func (e *encoder) bitwise(sreg, dreg uint32, mask, xor []byte, withOp bool) {
	el, d := e.beginExpr("bitwise")
	e.BE32(unix.NFTA_BITWISE_SREG, sreg)
	e.BE32(unix.NFTA_BITWISE_DREG, dreg)
	if withOp {
		e.BE32(nftaBitwiseOp, unix.NFT_BITWISE_BOOL)
	}
	e.BE32(unix.NFTA_BITWISE_LEN, uint32(len(mask)))
	e.value(unix.NFTA_BITWISE_MASK, mask)
	e.value(unix.NFTA_BITWISE_XOR, xor)
	e.endExpr(el, d)
}

// lookup: [ lookup reg <sreg> set <set> ], with dreg 0 (the verdict
// register) for a verdict map, and flags 0x1 (NFT_LOOKUP_F_INV) for `!=`.
// setID names a set created in the same batch, 0 for an existing one.
func (e *encoder) lookup(sreg uint32, set string, setID uint32, vmap, invert bool) {
	el, d := e.beginExpr("lookup")
	e.BE32(unix.NFTA_LOOKUP_SREG, sreg)
	if vmap {
		e.BE32(unix.NFTA_LOOKUP_DREG, unix.NFT_REG_VERDICT)
	}
	e.Str(unix.NFTA_LOOKUP_SET, set)
	e.BE32(unix.NFTA_LOOKUP_SET_ID, setID)
	if invert {
		e.BE32(unix.NFTA_LOOKUP_FLAGS, unix.NFT_LOOKUP_F_INV)
	}
	e.endExpr(el, d)
}

// immediate: [ immediate reg <dreg> <data> ]
func (e *encoder) immediate(dreg uint32, data []byte) {
	el, d := e.beginExpr("immediate")
	e.BE32(unix.NFTA_IMMEDIATE_DREG, dreg)
	e.value(unix.NFTA_IMMEDIATE_DATA, data)
	e.endExpr(el, d)
}

// immediateVerdict: [ immediate reg 0 <verdict> [-> <chain>] ]
func (e *encoder) immediateVerdict(v nft.Verdict) {
	el, d := e.beginExpr("immediate")
	e.BE32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
	data := e.Nest(unix.NFTA_IMMEDIATE_DATA)
	e.verdict(v)
	e.EndNest(data)
	e.endExpr(el, d)
}

// verdict writes an NFTA_DATA_VERDICT nest: the code and, for jump and goto,
// the chain.
func (e *encoder) verdict(v nft.Verdict) {
	n := e.Nest(unix.NFTA_DATA_VERDICT)
	e.BE32(unix.NFTA_VERDICT_CODE, verdictCode(v.Kind))
	if v.Chain != "" {
		e.Str(unix.NFTA_VERDICT_CHAIN, v.Chain)
	}
	e.EndNest(n)
}

// numgenRandom: [ numgen reg <dreg> = random mod <mod> ] (offset 0, which
// nft writes too).
func (e *encoder) numgenRandom(dreg, mod uint32) { e.numgenRandomOffset(dreg, mod, 0) }

// numgenRandomOffset: [ numgen reg <dreg> = random mod <mod> offset <offset> ].
func (e *encoder) numgenRandomOffset(dreg, mod, offset uint32) {
	el, d := e.beginExpr("numgen")
	e.BE32(unix.NFTA_NG_DREG, dreg)
	e.BE32(unix.NFTA_NG_MODULUS, mod)
	e.BE32(unix.NFTA_NG_TYPE, unix.NFT_NG_RANDOM)
	e.BE32(unix.NFTA_NG_OFFSET, offset)
	e.endExpr(el, d)
}

// dnat: [ nat dnat <family> addr_min reg <addr> proto_min reg <proto> flags <flags> ],
// without flags if 0.
func (e *encoder) dnat(family, addrReg, protoReg, flags uint32) {
	el, d := e.beginExpr("nat")
	e.BE32(unix.NFTA_NAT_TYPE, unix.NFT_NAT_DNAT)
	e.BE32(unix.NFTA_NAT_FAMILY, family)
	e.BE32(unix.NFTA_NAT_REG_ADDR_MIN, addrReg)
	e.BE32(unix.NFTA_NAT_REG_PROTO_MIN, protoReg)
	if flags != 0 {
		e.BE32(unix.NFTA_NAT_FLAGS, flags)
	}
	e.endExpr(el, d)
}

// lookupData: [ lookup reg <sreg> set <set> dreg <dreg> ], the lookup of a
// data map, whose value lands in dreg.
func (e *encoder) lookupData(sreg, dreg uint32, set string, setID uint32) {
	el, d := e.beginExpr("lookup")
	e.BE32(unix.NFTA_LOOKUP_SREG, sreg)
	e.BE32(unix.NFTA_LOOKUP_DREG, dreg)
	e.Str(unix.NFTA_LOOKUP_SET, set)
	e.BE32(unix.NFTA_LOOKUP_SET_ID, setID)
	e.endExpr(el, d)
}

// byteorderHton: [ byteorder reg <dreg> = hton(reg <sreg>, <size>, <n>) ],
// n bytes of size-byte words from host to network byte order.
func (e *encoder) byteorderHton(sreg, dreg, size, n uint32) {
	el, d := e.beginExpr("byteorder")
	e.BE32(unix.NFTA_BYTEORDER_SREG, sreg)
	e.BE32(unix.NFTA_BYTEORDER_DREG, dreg)
	e.BE32(unix.NFTA_BYTEORDER_OP, unix.NFT_BYTEORDER_HTON)
	e.BE32(unix.NFTA_BYTEORDER_LEN, n)
	e.BE32(unix.NFTA_BYTEORDER_SIZE, size)
	e.endExpr(el, d)
}

// masq: [ masq flags <flags> ]
func (e *encoder) masq(flags uint32) {
	el, d := e.beginExpr("masq")
	e.BE32(unix.NFTA_MASQ_FLAGS, flags)
	e.endExpr(el, d)
}

// reject: [ reject type <typ> code <code> ]; the code is one byte.
func (e *encoder) reject(typ uint32, code uint8) {
	el, d := e.beginExpr("reject")
	e.BE32(unix.NFTA_REJECT_TYPE, typ)
	e.Attr(unix.NFTA_REJECT_ICMP_CODE, []byte{code})
	e.endExpr(el, d)
}

// fib: [ fib <daddr|saddr> <result> => reg <dreg> ]
func (e *encoder) fib(flags, result, dreg uint32) {
	el, d := e.beginExpr("fib")
	e.BE32(unix.NFTA_FIB_FLAGS, flags)
	e.BE32(unix.NFTA_FIB_RESULT, result)
	e.BE32(unix.NFTA_FIB_DREG, dreg)
	e.endExpr(el, d)
}

// dynsetUpdate: [ dynset update reg_key <sreg> set <set> ]
func (e *encoder) dynsetUpdate(sreg uint32, set string, setID uint32) {
	el, d := e.beginExpr("dynset")
	e.BE32(unix.NFTA_DYNSET_SREG_KEY, sreg)
	e.BE32(unix.NFTA_DYNSET_OP, unix.NFT_DYNSET_OP_UPDATE)
	e.Str(unix.NFTA_DYNSET_SET_NAME, set)
	e.BE32(unix.NFTA_DYNSET_SET_ID, setID)
	e.endExpr(el, d)
}
