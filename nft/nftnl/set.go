package nftnl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file writes and reads sets and maps: NEWSET, DELSET, the flush
// of a set, and the set dump, laid out as nft 1.0.6 writes them.

// Flags and attributes golang.org/x/sys/unix does not name
// (include/uapi/linux/netfilter/nf_tables.h, Linux 5.6/5.7+).
const (
	nftSetConcat      = 0x80 // NFT_SET_CONCAT
	nftaSetDescConcat = 2    // NFTA_SET_DESC_CONCAT
	nftaSetFieldLen   = 1    // NFTA_SET_FIELD_LEN
	nftaSetElemKeyEnd = 10   // NFTA_SET_ELEM_KEY_END
)

func (b *batch) delSet(name string) {
	m := b.begin(unix.NFT_MSG_DELSET, 0)
	b.enc.Str(unix.NFTA_SET_TABLE, b.table)
	b.enc.Str(unix.NFTA_SET_NAME, name)
	b.end(m)
	delete(b.setIDs, name)
}

// newSet writes NEWSET with a fresh set ID, which later messages of the
// batch use to find the set. Attribute order and userdata follow nft 1.0.6
// (src/mnl.c mnl_nft_set_add). For a concatenated key nft 1.0.6 sends
// neither the NFT_SET_CONCAT flag nor NFTA_SET_DESC_CONCAT (both only
// matter for interval sets, which pick the pipapo backend), and lists such
// sets fine from the key type and the userdata; so neither do we.
//
// An endpoints map is an interval map with a single integer key: the
// kernel keeps it in an rbtree.
func (b *batch) newSet(s *nft.Set) error {
	if len(s.Key) == 0 {
		return fmt.Errorf("set has no key type")
	}
	if s.EndpointsProto != 0 {
		if err := nft.CheckEndpointsMap(b.family, s); err != nil {
			return err
		}
	}
	if s.PickProto != 0 {
		if err := nft.CheckPickMap(b.family, s); err != nil {
			return err
		}
	}
	ud, err := setUserdata(b.family, s)
	if err != nil {
		return err
	}
	b.lastSetID++
	id := b.lastSetID
	timeout := s.Timeout.Milliseconds()
	var flags uint32
	if s.IsMap() {
		flags |= unix.NFT_SET_MAP
	}
	if timeout > 0 {
		flags |= unix.NFT_SET_TIMEOUT
	}
	if s.Dynamic {
		flags |= unix.NFT_SET_EVAL
	}
	if s.EndpointsProto != 0 {
		flags |= unix.NFT_SET_INTERVAL
	}
	m := b.begin(unix.NFT_MSG_NEWSET, flagCreate)
	b.enc.Str(unix.NFTA_SET_TABLE, b.table)
	b.enc.Str(unix.NFTA_SET_NAME, s.Name)
	b.enc.BE32(unix.NFTA_SET_FLAGS, flags)
	b.enc.BE32(unix.NFTA_SET_KEY_TYPE, setKeyMagic(s))
	b.enc.BE32(unix.NFTA_SET_KEY_LEN, uint32(tupleLen(s.Key)))
	if s.IsVerdictMap() {
		b.enc.BE32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		b.enc.BE32(unix.NFTA_SET_DATA_LEN, 0)
	} else if s.IsMap() {
		b.enc.BE32(unix.NFTA_SET_DATA_TYPE, typeMagic(s.Data))
		b.enc.BE32(unix.NFTA_SET_DATA_LEN, uint32(tupleLen(s.Data)))
	}
	b.enc.BE32(unix.NFTA_SET_ID, id)
	if s.Size > 0 {
		d := b.enc.Nest(unix.NFTA_SET_DESC)
		b.enc.BE32(unix.NFTA_SET_DESC_SIZE, s.Size)
		b.enc.EndNest(d)
	}
	if timeout > 0 {
		b.enc.BE64(unix.NFTA_SET_TIMEOUT, uint64(timeout))
	}
	b.enc.Attr(unix.NFTA_SET_USERDATA, ud)
	if s.Counter {
		b.enc.setCounter()
	}
	b.end(m)
	b.setIDs[s.Name] = id
	return nil
}

// setCounter writes the `counter` of a set's declaration as nft 1.0.6 does
// for a set with one statement: NFTA_SET_EXPR holding a counter expression
// without attributes (its values start at zero), after the userdata. The
// kernel copies it to each element added without expressions of its own.
func (e *encoder) setCounter() {
	x := e.Nest(nftaSetExpr)
	e.Str(unix.NFTA_EXPR_NAME, exprCounter)
	e.EndNest(e.Nest(unix.NFTA_EXPR_DATA))
	e.EndNest(x)
}

// exprCounter is the name of the counter expression (net/netfilter/nft_counter.c).
const exprCounter = "counter"

// flushSet writes DELSETELEM without elements: every element of the set
// is deleted (`nft flush set`, whose attribute order this is).
func (b *batch) flushSet(name string) {
	m := b.begin(unix.NFT_MSG_DELSETELEM, 0)
	b.enc.Str(unix.NFTA_SET_ELEM_LIST_SET, name)
	b.enc.Str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.end(m)
}

// setUserdata is the NEWSET userdata nft 1.0.6 writes for a set declared
// with `type …` (captured with `nft --debug=mnl`):
//
//	key byte order; data byte order (maps); for a concatenated key, a
//	KEY_TYPEOF nest saying "concatenation" with no fields; data interval 0
//	(maps); the comment.
//
// An endpoints map is declared with `typeof` (endpointsUserdata).
func setUserdata(f nft.Family, s *nft.Set) ([]byte, error) {
	var ud []byte
	if s.EndpointsProto != 0 {
		ud = endpointsUserdata(f, s.EndpointsProto)
	} else if s.PickProto != 0 {
		ud = pickUserdata(f, s.PickProto, s.PickMod)
	} else {
		ud = udataU32(nil, udataSetKeyByteorder, byteorder(s.Key))
		if s.IsMap() {
			ud = udataU32(ud, udataSetDataByteorder, byteorder(s.Data))
		}
		if len(s.Key) > 1 {
			var typeof []byte
			typeof = udataU32(typeof, udataTypeofExpr, exprConcat)
			typeof = udataTLV(typeof, udataTypeofData, nil)
			ud = udataTLV(ud, udataSetKeyTypeof, typeof)
		}
		if s.IsMap() {
			ud = udataU32(ud, udataSetDataInterval, 0)
		}
	}
	if s.Comment != "" {
		c, err := udataString(udataSetComment, s.Comment)
		if err != nil {
			return nil, err
		}
		ud = append(ud, c...)
	}
	return ud, nil
}

// byteorder is the byte order nft records for a key or data type: none for
// a concatenation, a verdict or a protocol (one byte: nft 1.0.6's
// inet_protocol_type has none), host order for marks and integers,
// network order otherwise.
func byteorder(ts []nft.DataType) uint32 {
	if len(ts) != 1 {
		return byteorderInvalid
	}
	switch ts[0] {
	case nft.TypeVerdict, nft.TypeInetProto:
		return byteorderInvalid
	case nft.TypeMark, nft.TypeInteger:
		return byteorderHost
	}
	return byteorderBig
}

// setKeyMagic is the key type newSet writes for s (NFTA_SET_KEY_TYPE):
// typeMagic of its key, except in a pick map, whose numgen field is named
// mark (4 bytes, host byte order, printed in hex) where nft 1.0.6 writes
// integer. The kernel keeps the type for userspace and matches on the key's
// bytes and length alone; nft 1.0.6 and later list a pick map from its
// typeof userdata, which they check against the key length only (they
// print and reload it as they always did). nft 0.9.8 (Debian 11) needs the
// type: it sizes a typeof concatenation from the data types of its fields
// (src/expression.c concat_expr_parse_udata, concat_type_alloc), and
// integer has no size, so the typeof key is 8 bytes where the key is 12,
// and nft falls back to the kernel's key type (src/netlink.c
// netlink_delinearize_set, set_udata_key_valid). With integer there it
// splits each element into a zero-length last field and aborts sorting them
// (src/mergesort.c:24, concat_expr_msort_value: Assertion 'ilen > 0'); with
// mark it lists the map as `type ipv4_addr . inet_service . mark :
// ipv4_addr . inet_service`, elements `10.96.0.10 . 80 . 0x00000001 : …`.
// The cost: the kernel refuses to redeclare an existing set with another
// key type (nf_tables_newset, nft_set_is_same: EEXIST), so a later nft's
// listing loads in place of the table (after `delete table`), not on top
// of it. No key type serves both: a later nft derives it from the typeof,
// where numgen is integer, and a typeof naming another type changes what
// the rule's key (numgen's integer) may look up.
func setKeyMagic(s *nft.Set) uint32 {
	if s.PickProto == 0 || len(s.Key) != 3 {
		return typeMagic(s.Key)
	}
	return typeMagic([]nft.DataType{s.Key[0], s.Key[1], nft.TypeMark})
}

// setFlagsKnown are the set flags nftproxy writes (newSet); a set with
// others was written by someone else.
const setFlagsKnown = unix.NFT_SET_MAP | unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL

// NFTA_SET_EXPR and NFTA_SET_EXPRESSIONS (Linux 5.12/5.13) are not in
// golang.org/x/sys/unix.
const (
	nftaSetExpr        = 17
	nftaSetExpressions = 18
)

// setAttrs are the attributes of a NEWSET of a set dump.
type setAttrs struct {
	table, name, desc, ud                     []byte
	flags, keyType, keyLen, dataType, dataLen uint32
	timeout                                   time.Duration
	counter                                   bool // NFTA_SET_EXPR is a counter (setCounter)
	foreign                                   bool // attributes nftproxy never writes
}

func decodeSetAttrs(d *nlcodec.Decoder, attrs []byte) setAttrs {
	var a setAttrs
	d.Attrs(attrs, func(t uint16, data []byte) {
		switch t {
		case unix.NFTA_SET_TABLE:
			a.table = data
		case unix.NFTA_SET_NAME:
			a.name = data
		case unix.NFTA_SET_FLAGS:
			a.flags = d.BE32(data)
		case unix.NFTA_SET_KEY_TYPE:
			a.keyType = d.BE32(data)
		case unix.NFTA_SET_KEY_LEN:
			a.keyLen = d.BE32(data)
		case unix.NFTA_SET_DATA_TYPE:
			a.dataType = d.BE32(data)
		case unix.NFTA_SET_DATA_LEN:
			a.dataLen = d.BE32(data)
		case unix.NFTA_SET_TIMEOUT:
			a.timeout = time.Duration(d.BE64(data)) * time.Millisecond
		case unix.NFTA_SET_DESC:
			a.desc = data
		case unix.NFTA_SET_USERDATA:
			a.ud = data
		case nftaSetExpr:
			if exprName(d, data) == exprCounter {
				a.counter = true
			} else {
				a.foreign = true
			}
		case unix.NFTA_SET_OBJ_TYPE, nftaSetExpressions:
			a.foreign = true
		}
	})
	return a
}

// exprName is the NFTA_EXPR_NAME of an expression's attributes.
func exprName(d *nlcodec.Decoder, attrs []byte) string {
	var name string
	d.Attrs(attrs, func(t uint16, data []byte) {
		if t == unix.NFTA_EXPR_NAME {
			name = nlcodec.String(data)
		}
	})
	return name
}

// ours reports a named set of table nftproxy. An anonymous set belongs to
// the (foreign) rule that uses it and goes with it when its chain is
// rewritten.
func (a *setAttrs) ours() bool {
	return string(nlcodec.StringBytes(a.table)) == nft.TableName && a.flags&unix.NFT_SET_ANONYMOUS == 0
}

// decodeSet decodes a NEWSET of a set dump; nil if it is not a named set
// of our table. A set nftproxy could not have written (flags, types or
// attributes it never uses) comes back with a nil Key: it equals no set
// nftproxy wants.
func decodeSet(d *nlcodec.Decoder, f nft.Family, attrs []byte) *nft.Set {
	a := decodeSetAttrs(d, attrs)
	if !a.ours() {
		return nil
	}
	return a.set(d, f)
}

func (a *setAttrs) set(d *nlcodec.Decoder, f nft.Family) *nft.Set {
	s := &nft.Set{Name: nlcodec.String(a.name), Dynamic: a.flags&unix.NFT_SET_EVAL != 0, Timeout: a.timeout,
		Comment: setComment(a.ud), Counter: a.counter}
	d.Attrs(a.desc, func(t uint16, data []byte) {
		if t == unix.NFTA_SET_DESC_SIZE {
			s.Size = d.BE32(data)
		}
	})
	switch {
	case a.foreign:
	case a.flags&(unix.NFT_SET_INTERVAL|nftSetConcat) != 0:
		// Only an endpoints map has either; the kernel reports no
		// NFT_SET_CONCAT for nft's own concatenated interval sets, but
		// NFTA_SET_DESC_CONCAT, which decodeEndpointsMap refuses.
		a.endpointsMap(d, f, s)
	case a.flags&^setFlagsKnown == 0:
		s.Key, s.Data = a.types()
		a.pickMap(f, s)
	}
	return s
}

// pickMap makes s the pick map the attributes describe, if its types and
// userdata are exactly what newSet writes for one (setKeyMagic: the key's
// last field typed mark). A map whose key type names integer there, as nft
// writes it and earlier nftproxy releases did, is not one: it differs from
// the pick map wanted, so the next transaction writes the table anew, in
// the encoding nft 0.9.8 can list.
func (a *setAttrs) pickMap(f nft.Family, s *nft.Set) {
	if a.flags != unix.NFT_SET_MAP || len(s.Key) != 3 {
		return
	}
	// The modulus is the only field that differs between pick maps of a
	// protocol, at the same place for every protocol: read it there.
	rest := udataWithoutComment(a.ud)
	lo, hi := pickUserdata(f, nft.ProtoTCP, 0), pickUserdata(f, nft.ProtoTCP, 0xffffffff)
	if len(rest) != len(lo) {
		return
	}
	at := 0
	for lo[at] == hi[at] {
		at++
	}
	mod := binary.NativeEndian.Uint32(rest[at:])
	for _, proto := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
		want := nft.NewPickMap(f, s.Name, proto, mod)
		if nft.PickModOK(mod) && bytes.Equal(rest, pickUserdata(f, proto, mod)) &&
			a.keyType == setKeyMagic(want) && a.keyLen == uint32(tupleLen(want.Key)) &&
			reflect.DeepEqual(s.Data, want.Data) {
			s.Key, s.PickProto, s.PickMod = want.Key, proto, mod
			return
		}
	}
}

// udataWithoutComment is a set's userdata without its comment's TLV.
func udataWithoutComment(ud []byte) []byte {
	var rest []byte
	for b := ud; len(b) >= 2 && 2+int(b[1]) <= len(b); b = b[2+int(b[1]):] {
		if b[0] != udataSetComment {
			rest = append(rest, b[:2+int(b[1])]...)
		}
	}
	return rest
}

// types returns the key and data types, or a nil key if they are not
// types nftproxy writes.
func (a *setAttrs) types() (key, data []nft.DataType) {
	key, ok := decodeTypes(a.keyType, a.keyLen)
	if !ok || a.flags&unix.NFT_SET_MAP == 0 {
		return key, nil
	}
	if a.dataType == unix.NFT_DATA_VERDICT {
		return key, []nft.DataType{nft.TypeVerdict}
	}
	if data, ok = decodeTypes(a.dataType, a.dataLen); !ok {
		return nil, nil
	}
	return key, data
}

// endpointsMap makes s the endpoints map the attributes describe, if they
// are exactly what newSet writes for one; else s keeps a nil Key.
func (a *setAttrs) endpointsMap(d *nlcodec.Decoder, f nft.Family, s *nft.Set) {
	if a.flags != unix.NFT_SET_MAP|unix.NFT_SET_INTERVAL {
		return
	}
	concat := false
	d.Attrs(a.desc, func(t uint16, _ []byte) {
		if t == nftaSetDescConcat {
			concat = true
		}
	})
	if concat {
		return
	}
	// The userdata without its comment names the protocol.
	rest := udataWithoutComment(a.ud)
	for _, proto := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
		if !bytes.Equal(rest, endpointsUserdata(f, proto)) {
			continue
		}
		want := nft.NewEndpointsMap(f, s.Name, proto)
		if a.keyType == typeMagic(want.Key) && a.keyLen == uint32(tupleLen(want.Key)) &&
			a.dataType == typeMagic(want.Data) && a.dataLen == uint32(tupleLen(want.Data)) {
			s.Key, s.Data, s.EndpointsProto = want.Key, want.Data, proto
		}
		return
	}
}

// setComment returns the comment of a set's userdata (see setUserdata).
func setComment(ud []byte) string {
	for len(ud) >= 2 && 2+int(ud[1]) <= len(ud) {
		if n := int(ud[1]); ud[0] == udataSetComment && n > 0 {
			return nlcodec.String(ud[2 : 2+n])
		}
		ud = ud[2+int(ud[1]):]
	}
	return ""
}

// knownTypes are the data types a set key or data field may have.
var knownTypes = []nft.DataType{nft.TypeInteger, nft.TypeIPv4Addr, nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeMark}

// decodeTypes inverts typeMagic: one type, or a concatenation of types
// concatTypeBits apiece; ok only if the length matches.
func decodeTypes(magic, length uint32) ([]nft.DataType, bool) {
	var fields []uint32
	for m := magic; m != 0; m >>= concatTypeBits {
		fields = append([]uint32{m & (1<<concatTypeBits - 1)}, fields...)
	}
	if len(fields) == 0 {
		return nil, false
	}
	ts := make([]nft.DataType, len(fields))
	for i, m := range fields {
		found := false
		for _, t := range knownTypes {
			if t.Magic == m {
				ts[i], found = t, true
			}
		}
		if !found {
			return nil, false
		}
	}
	return ts, tupleLen(ts) == int(length)
}
