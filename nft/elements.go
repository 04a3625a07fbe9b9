package nft

import (
	"encoding/binary"
	"iter"
	"net/netip"
	"slices"
)

// Elements holds the elements of a set, packed into strings: a map from
// an element's packed key fields to its packed value (data fields,
// verdict, comment, range end; "" for a plain set's element). An Element
// is 80 bytes plus 32 per field: a hairpin connection (two addresses)
// took about 220 bytes in a map of Elements, where packed it takes about
// 60, and a full sync of 100,000 Services of 10 endpoints holds 2.2
// million elements (docs/profiles.md).
//
// The packing keeps every field as it was given (Datum's address and
// integer, but an address's zone), so Get and All return the elements Put
// stored, and encoding errors (an IPv6 address in an IPv4 key) still come
// from Apply. Two elements are the same element if their keys pack to the
// same bytes: the same fields.
//
// The zero value is empty and ready to use. Copying an Elements aliases it:
// use Clone.
type Elements struct {
	m map[string]string
}

// Len returns the number of elements.
func (es *Elements) Len() int { return len(es.m) }

// Get returns the element with this key.
func (es *Elements) Get(key []Datum) (Element, bool) {
	k := packKey(key)
	p, ok := es.m[k]
	if !ok {
		return Element{}, false
	}
	return unpackElement(k, p), true
}

// Has reports whether an element has this key.
func (es *Elements) Has(key []Datum) bool {
	_, ok := es.m[packKey(key)]
	return ok
}

// Put adds e, replacing the element with the same key.
func (es *Elements) Put(e Element) { es.put(packKey(e.Key), packValue(e)) }

// Delete removes the element with this key, if any.
func (es *Elements) Delete(key []Datum) { delete(es.m, packKey(key)) }

// All returns the elements, in no particular order.
func (es *Elements) All() iter.Seq[Element] {
	return func(yield func(Element) bool) {
		for k, p := range es.m {
			if !yield(unpackElement(k, p)) {
				return
			}
		}
	}
}

// Clone returns a copy that does not alias es.
func (es *Elements) Clone() Elements {
	c := Elements{m: make(map[string]string, len(es.m))}
	for k, p := range es.m {
		c.m[k] = p
	}
	return c
}

// reserve makes room for n elements if there are none.
func (es *Elements) reserve(n int) {
	if len(es.m) == 0 && n > 0 {
		es.m = make(map[string]string, n)
	}
}

func (es *Elements) put(k, p string) {
	if es.m == nil {
		es.m = map[string]string{}
	}
	es.m[k] = p
}

// at returns the element of packed key k, or nil.
func (es *Elements) at(k string) *Element {
	p, ok := es.m[k]
	if !ok {
		return nil
	}
	e := unpackElement(k, p)
	return &e
}

// MakeElements returns the elements given, for a Set literal.
func MakeElements(elems ...Element) Elements {
	var es Elements
	for _, e := range elems {
		es.Put(e)
	}
	return es
}

// Field packing: a tag byte, then the field's bytes. The tag holds the
// address length (0: no address) and whether an integer follows.
const (
	packAddr4 = 4
	packAddr6 = 16
	packInt   = 0x80
)

// packKey packs the fields of a key: 5 bytes per IPv4 address, 17 per
// IPv6 address, 5 per integer.
func packKey(ds []Datum) string {
	var buf [64]byte
	return string(appendPacked(buf[:0], ds))
}

func appendPacked(b []byte, ds []Datum) []byte {
	for _, d := range ds {
		tag := byte(0)
		switch {
		case d.Addr.Is4():
			tag = packAddr4
		case d.Addr.IsValid():
			tag = packAddr6
		}
		if d.Int != 0 || tag == 0 {
			tag |= packInt
		}
		b = append(b, tag)
		switch tag &^ packInt {
		case packAddr4:
			a := d.Addr.As4()
			b = append(b, a[:]...)
		case packAddr6:
			a := d.Addr.As16()
			b = append(b, a[:]...)
		}
		if tag&packInt != 0 {
			b = binary.LittleEndian.AppendUint32(b, d.Int)
		}
	}
	return b
}

// unpackFields appends the fields packed in s to dst.
func unpackFields(dst []Datum, s string) []Datum {
	for len(s) > 0 {
		tag := s[0]
		s = s[1:]
		var d Datum
		switch tag &^ packInt {
		case packAddr4:
			var a [4]byte
			copy(a[:], s)
			d.Addr, s = netip.AddrFrom4(a), s[4:]
		case packAddr6:
			var a [16]byte
			copy(a[:], s)
			d.Addr, s = netip.AddrFrom16(a), s[16:]
		}
		if tag&packInt != 0 {
			d.Int, s = le32(s), s[4:]
		}
		dst = append(dst, d)
	}
	return dst
}

// A packed value: a flags byte, then what the flags announce in this
// order: the range end (4 bytes), the verdict (kind and chain, each a
// uvarint length and its bytes), the comment (the same), the data fields
// (the rest, packed as keys are).
const (
	valueEnd = 1 << iota
	valueVerdict
	valueComment
	valueData
)

func packValue(e Element) string {
	var flags byte
	if e.End != 0 {
		flags |= valueEnd
	}
	if e.Verdict != nil {
		flags |= valueVerdict
	}
	if e.Comment != "" {
		flags |= valueComment
	}
	if len(e.Data) > 0 {
		flags |= valueData
	}
	if flags == 0 {
		return ""
	}
	var buf [128]byte
	b := append(buf[:0], flags)
	if e.End != 0 {
		b = binary.LittleEndian.AppendUint32(b, e.End)
	}
	if e.Verdict != nil {
		b = appendString(appendString(b, string(e.Verdict.Kind)), e.Verdict.Chain)
	}
	if e.Comment != "" {
		b = appendString(b, e.Comment)
	}
	return string(appendPacked(b, e.Data))
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// unpacked is an element unpacked into space of its own: Key, Data and
// Verdict point into it.
type unpacked struct {
	Element
	key, data [8]Datum
	verdict   Verdict
}

// unpack unpacks the element of key k and value v into u, whose Element
// then holds it until the next unpack.
func (u *unpacked) unpack(k, v string) {
	u.Element = Element{Key: unpackFields(u.key[:0], k)}
	if v == "" {
		return
	}
	flags, v := v[0], v[1:]
	if flags&valueEnd != 0 {
		u.End, v = le32(v), v[4:]
	}
	if flags&valueVerdict != 0 {
		var kind string
		kind, v = cutString(v)
		u.verdict.Chain, v = cutString(v)
		u.verdict.Kind = VerdictKind(kind)
		u.Verdict = &u.verdict
	}
	if flags&valueComment != 0 {
		u.Comment, v = cutString(v)
	}
	if flags&valueData != 0 {
		u.Data = unpackFields(u.data[:0], v)
	}
}

// cutString cuts a string written by appendString off v.
func cutString(v string) (s, rest string) {
	n, shift, i := 0, 0, 0
	for ; v[i] >= 0x80; i++ {
		n |= int(v[i]&0x7f) << shift
		shift += 7
	}
	n |= int(v[i]) << shift
	v = v[i+1:]
	return v[:n], v[n:]
}

// le32 reads a little-endian uint32 at the start of s.
func le32(s string) uint32 {
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

// unpackElement returns the element of key k and value v, in memory of
// its own.
func unpackElement(k, v string) Element {
	var u unpacked
	u.unpack(k, v)
	e := u.Element
	e.Key = slices.Clone(e.Key)
	if e.Data != nil {
		e.Data = slices.Clone(e.Data)
	}
	if e.Verdict != nil {
		vd := *e.Verdict
		e.Verdict = &vd
	}
	return e
}
