package nftnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
)

// This file encodes and decodes values (element keys and data) and the
// userdata TLVs nft stores with rules, sets and elements.

// Key and data layout (nftables src/datatype.c, src/evaluate.c): a single
// field has its own length; in a concatenation every field is padded to the
// 4-byte register size, and the type number is the field types' numbers
// shifted in 6 bits at a time (TYPE_BITS).
const concatTypeBits = 6

func typeMagic(ts []nft.DataType) uint32 {
	if len(ts) == 1 {
		return ts[0].Magic
	}
	var m uint32
	for _, t := range ts {
		m = m<<concatTypeBits | t.Magic
	}
	return m
}

func pad4(n int) int { return (n + 3) &^ 3 }

func tupleLen(ts []nft.DataType) int {
	if len(ts) == 1 {
		return ts[0].Len
	}
	n := 0
	for _, t := range ts {
		n += pad4(t.Len)
	}
	return n
}

// encodeTuple encodes a key or data value: addresses and ports in network
// byte order, marks and plain integers in host byte order (nft's
// byteorder for these types).
func encodeTuple(f nft.Family, ts []nft.DataType, ds []nft.Datum) ([]byte, error) {
	return encodeTupleOrder(f, ts, ds, false)
}

// encodeKey encodes an element key of s. The keys of an interval map
// (an endpoints map) hold integers in network byte order: nft converts
// every field of an interval concatenation to big endian (the DNATMap
// rule's byteorder hton), so that ranges compare as numbers.
func encodeKey(f nft.Family, s *nft.Set, key []nft.Datum) ([]byte, error) {
	return encodeTupleOrder(f, s.Key, key, s.EndpointsProto != 0)
}

func encodeTupleOrder(f nft.Family, ts []nft.DataType, ds []nft.Datum, intsBigEndian bool) ([]byte, error) {
	return encodeTupleTo(make([]byte, 0, tupleLen(ts)), f, ts, ds, intsBigEndian)
}

// encodeTupleTo is encodeTupleOrder appending to out.
func encodeTupleTo(out []byte, f nft.Family, ts []nft.DataType, ds []nft.Datum, intsBigEndian bool) ([]byte, error) {
	if len(ts) != len(ds) {
		return nil, fmt.Errorf("%d fields for a %d-field type", len(ds), len(ts))
	}
	for i, t := range ts {
		start := len(out)
		var err error
		if intsBigEndian && t == nft.TypeInteger {
			out = binary.BigEndian.AppendUint32(out, ds[i].Int)
		} else if out, err = appendDatum(out, t, ds[i]); err != nil {
			return nil, fmt.Errorf("field %d: %w", i, err)
		}
		if len(ts) > 1 {
			for len(out)-start < pad4(t.Len) {
				out = append(out, 0)
			}
		}
	}
	return out, nil
}

func appendDatum(b []byte, t nft.DataType, d nft.Datum) ([]byte, error) {
	switch t {
	case nft.TypeIPv4Addr:
		if !d.Addr.Is4() {
			return nil, fmt.Errorf("%v is not an IPv4 address", d.Addr)
		}
		a := d.Addr.As4()
		return append(b, a[:]...), nil
	case nft.TypeIPv6Addr:
		if !d.Addr.Is6() || d.Addr.Is4In6() {
			return nil, fmt.Errorf("%v is not an IPv6 address", d.Addr)
		}
		a := d.Addr.As16()
		return append(b, a[:]...), nil
	case nft.TypeInetProto:
		if d.Int > 0xff {
			return nil, fmt.Errorf("%d does not fit inet_proto", d.Int)
		}
		return append(b, byte(d.Int)), nil
	case nft.TypeInetService:
		if d.Int > 0xffff {
			return nil, fmt.Errorf("%d does not fit inet_service", d.Int)
		}
		return binary.BigEndian.AppendUint16(b, uint16(d.Int)), nil
	case nft.TypeMark, nft.TypeInteger:
		return binary.NativeEndian.AppendUint32(b, d.Int), nil
	}
	return nil, fmt.Errorf("cannot encode type %s", t.Name)
}

// decodeTupleOrder inverts encodeTupleOrder, into the space of ds.
func decodeTupleOrder(ds []nft.Datum, f nft.Family, ts []nft.DataType, b []byte, intsBigEndian bool) ([]nft.Datum, error) {
	if len(b) != tupleLen(ts) {
		return nil, fmt.Errorf("%d bytes for a %d-byte value", len(b), tupleLen(ts))
	}
	ds = slices.Grow(ds[:0], len(ts))[:len(ts)]
	clear(ds)
	for i, t := range ts {
		v := b[:t.Len]
		switch t {
		case nft.TypeIPv4Addr:
			ds[i].Addr = netip.AddrFrom4([4]byte(v))
		case nft.TypeIPv6Addr:
			ds[i].Addr = netip.AddrFrom16([16]byte(v))
		case nft.TypeInetProto:
			ds[i].Int = uint32(v[0])
		case nft.TypeInetService:
			ds[i].Int = uint32(binary.BigEndian.Uint16(v))
		case nft.TypeInteger:
			if intsBigEndian {
				ds[i].Int = binary.BigEndian.Uint32(v)
			} else {
				ds[i].Int = binary.NativeEndian.Uint32(v)
			}
		case nft.TypeMark:
			ds[i].Int = binary.NativeEndian.Uint32(v)
		default:
			return nil, fmt.Errorf("cannot decode type %s", t.Name)
		}
		if len(ts) > 1 {
			b = b[pad4(t.Len):]
		} else {
			b = b[t.Len:]
		}
	}
	return ds, nil
}

// addrBytes returns an address in network byte order, 4 or 16 bytes as the
// family wants.
func addrBytes(f nft.Family, a netip.Addr) ([]byte, error) {
	if !f.Contains(a) {
		return nil, fmt.Errorf("%v is not an %s address", a, f)
	}
	if f == nft.IPv4 {
		b := a.As4()
		return b[:], nil
	}
	b := a.As16()
	return b[:], nil
}

// Userdata (libnftnl include/libnftnl/udata.h): a list of TLVs with a one
// byte type and a one byte length.
const (
	udataRuleComment = 0 // NFTNL_UDATA_RULE_COMMENT
	// udataRuleDigest is nftproxy's own: the digest of a chain's rules,
	// on its first rule (digest.go). libnftnl 1.2.4 defines rule userdata
	// types 0 and 1 only, and nft 1.0.6 skips types it does not know
	// (rule_parse_udata_cb), so `nft list` prints the rule as without it
	// (TestTemplatesListBack).
	udataRuleDigest  = 0xc8
	udataElemComment = 0 // NFTNL_UDATA_SET_ELEM_COMMENT

	udataSetKeyByteorder  = 0 // NFTNL_UDATA_SET_KEYBYTEORDER
	udataSetDataByteorder = 1 // NFTNL_UDATA_SET_DATABYTEORDER
	udataSetKeyTypeof     = 3 // NFTNL_UDATA_SET_KEY_TYPEOF
	udataSetDataTypeof    = 4 // NFTNL_UDATA_SET_DATA_TYPEOF
	udataSetDataInterval  = 6 // NFTNL_UDATA_SET_DATA_INTERVAL
	udataSetComment       = 7 // NFTNL_UDATA_SET_COMMENT

	udataTypeofExpr = 0 // NFTNL_UDATA_SET_TYPEOF_EXPR
	udataTypeofData = 1 // NFTNL_UDATA_SET_TYPEOF_DATA

	// nft's enum byteorder (include/datatype.h).
	byteorderInvalid = 0
	byteorderHost    = 1
	byteorderBig     = 2

	// exprConcat is EXPR_CONCAT in nft's enum expr_types (include/expression.h).
	exprConcat = 13
)

func udataTLV(b []byte, typ byte, data []byte) []byte {
	return append(append(b, typ, byte(len(data))), data...)
}

func udataU32(b []byte, typ byte, v uint32) []byte {
	return udataTLV(b, typ, binary.NativeEndian.AppendUint32(nil, v))
}

// udataString is a NUL-terminated string TLV of at most MaxComment bytes.
func udataString(typ byte, s string) ([]byte, error) { return appendUdataString(nil, typ, s) }

// appendUdataString appends udataString's TLV to b.
func appendUdataString(b []byte, typ byte, s string) ([]byte, error) {
	if len(s) > nft.MaxComment {
		return nil, fmt.Errorf("comment %q: longer than %d bytes", s, nft.MaxComment)
	}
	return append(append(append(b, typ, byte(len(s)+1)), s...), 0), nil // udataTLV of s and a NUL
}
