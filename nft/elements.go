package nft

import (
	"encoding/binary"
	"iter"
	"net/netip"
)

// Elements holds the elements of a set, packed: an element's key and data
// fields are kept as bytes, not as Datum slices, and the key bytes index
// the elements. An Element is 80 bytes plus 32 per field; a hairpin
// connection (two addresses) took about 220 bytes, and a full sync of
// 10,000 Services of 5 endpoints held 120,000 such elements, a third of
// the proxier's memory (docs/profiles.md). Packed, it is about 80 bytes.
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
	m map[string]packedElement
}

// packedElement is an element's value: its packed data fields, verdict,
// comment and, in an endpoints map, the end of its range.
type packedElement struct {
	data    string
	verdict *Verdict
	comment string
	end     uint32
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
	c := Elements{m: make(map[string]packedElement, len(es.m))}
	for k, p := range es.m {
		c.m[k] = p
	}
	return c
}

// reserve makes room for n elements if there are none.
func (es *Elements) reserve(n int) {
	if len(es.m) == 0 && n > 0 {
		es.m = make(map[string]packedElement, n)
	}
}

func (es *Elements) put(k string, p packedElement) {
	if es.m == nil {
		es.m = map[string]packedElement{}
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
			d.Addr = netip.AddrFrom4([4]byte([]byte(s[:4])))
			s = s[4:]
		case packAddr6:
			d.Addr = netip.AddrFrom16([16]byte([]byte(s[:16])))
			s = s[16:]
		}
		if tag&packInt != 0 {
			d.Int = binary.LittleEndian.Uint32([]byte(s[:4]))
			s = s[4:]
		}
		dst = append(dst, d)
	}
	return dst
}

func packValue(e Element) packedElement {
	p := packedElement{verdict: e.Verdict, comment: e.Comment, end: e.End}
	if len(e.Data) > 0 {
		var buf [64]byte
		p.data = string(appendPacked(buf[:0], e.Data))
	}
	return p
}

// unpackElement returns the element of key k and value p.
func unpackElement(k string, p packedElement) Element {
	e := Element{Key: unpackFields(nil, k), Verdict: p.verdict, Comment: p.comment, End: p.end}
	if p.data != "" {
		e.Data = unpackFields(nil, p.data)
	}
	return e
}
