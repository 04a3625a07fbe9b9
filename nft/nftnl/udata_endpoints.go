package nftnl

import "github.com/nftproxy/nftproxy/nft"

// Typeof userdata (nftables src/expression.c, payload.c, numgen.c:
// *_build_udata): each expression of a concatenation is a TLV numbered by
// its position, holding the expression type and its own TLVs.
const (
	exprPayload = 7  // EXPR_PAYLOAD
	exprNumgen  = 23 // EXPR_NUMGEN

	// nft's enum proto_desc_id (include/proto.h) and header field
	// numbers, as nft 1.0.6 writes them for ip daddr, ip6 daddr and
	// tcp/udp/sctp dport (captured with `nft --debug=mnl`).
	protoDescIP   = 12
	protoDescIP6  = 13
	protoDescTCP  = 8
	protoDescUDP  = 6
	protoDescSCTP = 10
	ipHdrDaddr    = 12 // IPHDR_DADDR
	ip6HdrDaddr   = 9  // IP6HDR_DADDR
	portHdrDport  = 2  // TCPHDR_DPORT, UDPHDR_DPORT, SCTPHDR_DPORT
)

// payloadUdata is a payload expression's typeof TLVs: PAYLOAD_DESC, PAYLOAD_TYPE.
func payloadUdata(desc, field uint32) []byte {
	b := udataU32(nil, udataTypeofExpr, exprPayload)
	return udataTLV(b, udataTypeofData, udataU32(udataU32(nil, 0, desc), 1, field))
}

func daddrUdata(f nft.Family) []byte {
	if f == nft.IPv6 {
		return payloadUdata(protoDescIP6, ip6HdrDaddr)
	}
	return payloadUdata(protoDescIP, ipHdrDaddr)
}

func dportUdata(proto uint8) []byte {
	desc := map[uint8]uint32{nft.ProtoTCP: protoDescTCP, nft.ProtoUDP: protoDescUDP, nft.ProtoSCTP: protoDescSCTP}[proto]
	return payloadUdata(desc, portHdrDport)
}

// numgenUdata: numgen random mod mod offset 0 (NUMGEN_TYPE,
// NUMGEN_MODULUS, NUMGEN_OFFSET).
func numgenUdata(mod uint32) []byte {
	b := udataU32(nil, udataTypeofExpr, exprNumgen)
	d := udataU32(udataU32(udataU32(nil, 0, 1), 1, mod), 2, 0)
	return udataTLV(b, udataTypeofData, d)
}

// concatUdata is the typeof TLVs of a concatenation of expressions.
func concatUdata(exprs ...[]byte) []byte {
	var list []byte
	for i, e := range exprs {
		list = udataTLV(list, byte(i), e)
	}
	return udataTLV(udataU32(nil, udataTypeofExpr, exprConcat), udataTypeofData, list)
}

// endpointsUserdata is the NEWSET userdata nft 1.0.6 writes for an
// endpoints map, without the comment: key byte order host (numgen's), data
// byte order none (a concatenation), the key's and the data's typeof,
// data interval 0.
func endpointsUserdata(f nft.Family, proto uint8) []byte {
	ud := udataU32(nil, udataSetKeyByteorder, byteorderHost)
	ud = udataU32(ud, udataSetDataByteorder, byteorderInvalid)
	ud = udataTLV(ud, udataSetKeyTypeof, numgenUdata(nft.EndpointBuckets))
	ud = udataTLV(ud, udataSetDataTypeof, concatUdata(daddrUdata(f), dportUdata(proto)))
	return udataU32(ud, udataSetDataInterval, 0)
}

// pickUserdata is the NEWSET userdata nft 1.0.6 writes for a pick map,
// without the comment: key and data byte order none (concatenations), the
// key's and the data's typeof, data interval 0.
func pickUserdata(f nft.Family, proto uint8, mod uint32) []byte {
	ud := udataU32(nil, udataSetKeyByteorder, byteorderInvalid)
	ud = udataU32(ud, udataSetDataByteorder, byteorderInvalid)
	ud = udataTLV(ud, udataSetKeyTypeof, concatUdata(daddrUdata(f), dportUdata(proto), numgenUdata(mod)))
	ud = udataTLV(ud, udataSetDataTypeof, concatUdata(daddrUdata(f), dportUdata(proto)))
	return udataU32(ud, udataSetDataInterval, 0)
}
