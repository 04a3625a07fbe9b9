package nft

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"iter"
	"net/netip"
	"slices"
	"strings"
	"unsafe"
)

// Elements holds the elements of a set, packed: an element is a record of
// its packed key fields and its packed value (data fields, verdict,
// comment, range end; nothing for a plain set's element) in one byte
// slab, found through an open-addressing index of the records' offsets
// by hash of the key. Neither holds a pointer, so the garbage collector
// does not scan them. An element here takes a small fraction of what it
// took in a Go map of Elements or of packed strings, and a full sync at
// scale holds millions of them (docs/code-figures.md).
//
// The packing keeps every field as it was given (Datum's address and
// integer, but an address's zone), so Get and All return the elements Put
// stored, and encoding errors (an IPv6 address in an IPv4 key) still come
// from Apply. Two elements are the same element if their keys pack to the
// same bytes: the same fields.
//
// The slab is append-only: a record is never rewritten (an element
// replaced or deleted leaves its record behind until the slab is
// compacted into a new one), so the key and value strings the internal
// methods hand out are views of the slab, valid as long as they are held.
//
// The zero value is empty and ready to use. Copying an Elements aliases it:
// use Clone.
type Elements struct {
	slab    []byte
	index   []uint32 // 0: empty; tombstone; else 1 + the record's offset
	n       int      // elements
	tombs   int      // tombstones in index
	garbage int      // bytes of records no longer indexed
	// marks, while not nil, holds a bit per index slot: the element in
	// that slot was put since startMarking (see Editor, adopting a set
	// read back).
	marks []uint64
	// moved counts the changes that left a record of the slab stale or
	// moved it: a value replaced, an element deleted, the slab rebuilt,
	// a range end written in place. While it stays, the records past an
	// offset are the elements put since, and only those (appended).
	moved int
}

// slabMark is how far the slab of an Elements went at one moment.
type slabMark struct{ off, n, moved int }

func (es *Elements) slabMark() slabMark { return slabMark{len(es.slab), es.n, es.moved} }

// slabStart is the mark before every element: ok is false when the slab
// holds stale records (those of replaced or deleted elements), so that
// its records are not just its elements.
func (es *Elements) slabStart() (m slabMark, ok bool) {
	return slabMark{moved: es.moved}, es.garbage == 0
}

// appended returns the elements put since mark m was taken, read-only: a
// view of the records past it, which later puts do not touch (they append
// beyond it, or build a new slab). The view has no index: it can be
// ranged over (All, Scan), not searched. ok is false when a record was made
// stale or moved since: the records past the mark are then not those
// elements.
func (es *Elements) appended(m slabMark) (Elements, bool) {
	if es.moved != m.moved {
		return Elements{}, false
	}
	return Elements{slab: es.slab[m.off:len(es.slab):len(es.slab)], n: es.n - m.n}, true
}

const tombstone = ^uint32(0)

var elementsSeed = maphash.MakeSeed()

// Len returns the number of elements.
func (es *Elements) Len() int { return es.n }

// Get returns the element with this key.
func (es *Elements) Get(key []Datum) (Element, bool) {
	k := packKey(key)
	v, ok := es.get(k)
	if !ok {
		return Element{}, false
	}
	return unpackElement(k, v), true
}

// Has reports whether an element has this key.
func (es *Elements) Has(key []Datum) bool {
	_, ok := es.get(packKey(key))
	return ok
}

// Put adds e, replacing the element with the same key. It packs e in
// space of its own: put copies the record into the slab.
func (es *Elements) Put(e Element) {
	var kb [64]byte
	var vb [128]byte
	es.put(view(appendPacked(kb[:0], e.Key)), view(appendValue(vb[:0], e)))
}

// Delete removes the element with this key, if any.
func (es *Elements) Delete(key []Datum) { es.del(packKey(key)) }

// All returns the elements, in no particular order.
func (es *Elements) All() iter.Seq[Element] {
	return func(yield func(Element) bool) {
		for k, v := range es.each() {
			if !yield(unpackElement(k, v)) {
				return
			}
		}
	}
}

// Clone returns a copy that does not alias es.
func (es *Elements) Clone() Elements {
	var c Elements
	c.reserve(es.n)
	for k, v := range es.each() {
		c.put(k, v)
	}
	return c
}

// reserve makes room for n elements if there are none.
func (es *Elements) reserve(n int) {
	if es.n == 0 && n > 0 {
		marking := es.marks != nil
		*es = Elements{index: make([]uint32, indexSize(n)), slab: make([]byte, 0, recordRoom*n), moved: es.moved}
		if marking {
			es.startMarking()
		}
	}
}

// recordRoom is the room a reserved slab has per element: a hairpin
// connection's or an endpoint range's record is 17 to 19 bytes.
const recordRoom = 20

// indexSize is the size of an index for n elements: a power of two, at
// most three quarters full.
func indexSize(n int) int {
	size := 8
	for size*3 < n*4 {
		size *= 2
	}
	return size
}

// record returns the key and value of the record at offset o: views of
// the slab.
func (es *Elements) record(o uint32) (k, v string) {
	b := es.slab[o:]
	kl, w := binary.Uvarint(b)
	k, b = view(b[w:w+int(kl)]), b[w+int(kl):]
	vl, w := binary.Uvarint(b)
	return k, view(b[w : w+int(vl)])
}

// view is b as a string, without a copy: the string changes if b's bytes
// do, so it may be held only while they do not (the slab's do only in
// setEnd).
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// find returns the index slot of key k, and whether it holds k; if not,
// the slot to insert k in.
func (es *Elements) find(k string) (int, bool) {
	mask := len(es.index) - 1
	i, free := int(maphash.String(elementsSeed, k))&mask, -1
	for {
		switch e := es.index[i]; e {
		case 0:
			if free < 0 {
				free = i
			}
			return free, false
		case tombstone:
			if free < 0 {
				free = i
			}
		default:
			if rk, _ := es.record(e - 1); rk == k {
				return i, true
			}
		}
		i = (i + 1) & mask
	}
}

// get returns the packed value of packed key k.
func (es *Elements) get(k string) (string, bool) {
	if es.n == 0 {
		return "", false
	}
	i, ok := es.find(k)
	if !ok {
		return "", false
	}
	_, v := es.record(es.index[i] - 1)
	return v, true
}

// put sets the packed value of packed key k. Replacing the value of a
// key does not move the others: it may be done while iterating over each.
func (es *Elements) put(k, v string) { es.upsert(k, v) }

// upsert is put, returning the index slot of k afterwards, whether k was
// there, and its value before (a view of the slab).
func (es *Elements) upsert(k, v string) (i int, existed bool, old string) {
	i = -1
	if es.n > 0 {
		i, existed = es.find(k)
	}
	switch {
	case existed:
		_, old = es.record(es.index[i] - 1)
		if old == v {
			return i, true, old
		}
		es.garbage += recordLen(k, old)
		es.moved++
	case (es.n+es.tombs+1)*4 > len(es.index)*3:
		es.rehash(es.n + 1)
		i, _ = es.find(k)
		es.n++
	default:
		if i < 0 {
			i, _ = es.find(k)
		}
		if es.index[i] == tombstone {
			es.tombs--
		}
		es.n++
	}
	es.store(i, k, v)
	return i, existed, old
}

// Scan yields every element, unpacked into one element it reuses: each is
// valid until the next, and must not be kept. It allocates nothing, for
// encoders that copy each element out at once.
func (es *Elements) Scan() iter.Seq[*Element] {
	return func(yield func(*Element) bool) {
		var u unpacked
		for k, v := range es.each() {
			u.unpack(k, v)
			if !yield(&u.Element) {
				return
			}
		}
	}
}

// ValueBytes is the size of the elements' packed values (comments, data,
// verdicts): what an encoder of all of them must make room for beside
// the keys.
func (es *Elements) ValueBytes() int {
	n := 0
	for _, v := range es.each() {
		n += len(v)
	}
	return n
}

// SetEnds gives every element the range end end returns for it, writing it
// in place: every element must have been put with an End (a placeholder),
// so that its packed value has room for one. Reading a large endpoints map
// back learns the ends last, and a packed copy of every element would be
// garbage in the slab and in the heap.
func (es *Elements) SetEnds(end func(e *Element) (uint32, error)) error {
	var u unpacked
	for k, v := range es.each() {
		u.unpack(k, v)
		e, err := end(&u.Element)
		if err != nil {
			return err
		}
		if !es.setEnd(k, e) {
			return fmt.Errorf("element %v: no room for its range end", u.Key)
		}
	}
	return nil
}

// setEnd sets, in place, the range end of the element of packed key k,
// whose value must have one already: it reports whether it did. Unlike
// every other change, it rewrites bytes of the slab, so a view of that
// value changes with it: Load uses it on a set nothing else holds yet.
func (es *Elements) setEnd(k string, end uint32) bool {
	i, ok := -1, false
	if es.n > 0 {
		i, ok = es.find(k)
	}
	if !ok {
		return false
	}
	_, v := es.record(es.index[i] - 1)
	if len(v) < 5 || v[0]&valueEnd == 0 {
		return false
	}
	// v is a view of the slab: its offset there is where to write.
	at := int(uintptr(unsafe.Pointer(unsafe.StringData(v))) - uintptr(unsafe.Pointer(unsafe.SliceData(es.slab))))
	binary.LittleEndian.PutUint32(es.slab[at+1:], end)
	es.moved++
	return true
}

// startMarking clears every element's mark and starts marking the
// elements put from now on (putMarked).
func (es *Elements) startMarking() { es.marks = make([]uint64, (len(es.index)+63)/64) }

// stopMarking forgets the marks.
func (es *Elements) stopMarking() { es.marks = nil }

func (es *Elements) marked(i int) bool { return es.marks[i/64]&(1<<(i%64)) != 0 }
func (es *Elements) mark(i int)        { es.marks[i/64] |= 1 << (i % 64) }
func (es *Elements) unmark(i int)      { es.marks[i/64] &^= 1 << (i % 64) }

// putMarked is put for an Elements that is marking: it marks the element
// and reports whether the key was there, whether it was marked already,
// and its value before (a view of the slab).
func (es *Elements) putMarked(k, v string) (existed, wasMarked bool, old string) {
	i, existed, old := es.upsert(k, v) // a rehash (new keys only) keeps the marks
	wasMarked = existed && es.marked(i)
	es.mark(i)
	return existed, wasMarked, old
}

// unmarked returns the packed keys of the elements not marked, each a
// string of its own; none when not marking.
func (es *Elements) unmarked() []string {
	if es.marks == nil {
		return nil
	}
	var keys []string
	for i, e := range es.index {
		if e != 0 && e != tombstone && !es.marked(i) {
			k, _ := es.record(e - 1)
			keys = append(keys, strings.Clone(k))
		}
	}
	return keys
}

// store appends the record of k and v to the slab and points index slot i
// at it.
func (es *Elements) store(i int, k, v string) {
	es.index[i] = uint32(len(es.slab)) + 1
	es.slab = appendString(appendString(es.slab, k), v)
}

// del deletes the element of packed key k, if any.
func (es *Elements) del(k string) {
	if es.n == 0 {
		return
	}
	i, ok := es.find(k)
	if !ok {
		return
	}
	rk, v := es.record(es.index[i] - 1)
	es.garbage += recordLen(rk, v)
	es.moved++
	es.index[i] = tombstone
	if es.marks != nil {
		es.unmark(i)
	}
	es.n--
	es.tombs++
	if es.garbage > 64<<10 && es.garbage > len(es.slab)/2 {
		es.rehash(es.n)
	}
}

func recordLen(k, v string) int {
	return uvarintLen(len(k)) + len(k) + uvarintLen(len(v)) + len(v)
}

func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// rehash rebuilds the index for n elements, and the slab without the
// records no longer indexed; a slab without such records stays as it is.
func (es *Elements) rehash(n int) {
	old := *es
	*es = Elements{index: make([]uint32, indexSize(max(n, old.n))),
		slab:  make([]byte, 0, max(len(old.slab)-old.garbage, 0)+recordRoom*max(n-old.n, 0)+64),
		moved: old.moved}
	if old.garbage == 0 && old.marks == nil {
		// Every record is an element: the slab is kept as it is, in the
		// order the elements were put (appended relies on it).
		es.slab = append(es.slab, old.slab...)
		for o := 0; o < len(es.slab); {
			k, v := es.record(uint32(o))
			i, _ := es.find(k)
			es.index[i] = uint32(o) + 1
			es.n++
			o += recordLen(k, v)
		}
		return
	}
	es.moved++
	if old.marks != nil {
		es.startMarking()
	}
	for j, e := range old.index {
		if e == 0 || e == tombstone {
			continue
		}
		k, v := old.record(e - 1)
		i, _ := es.find(k)
		es.store(i, k, v)
		es.n++
		if old.marks != nil && old.marked(j) {
			es.mark(i)
		}
	}
}

// each returns the packed keys and values, in index order (in the order
// they were put, for a view that appended returned). While it runs,
// values may be replaced (put of a key present), but no key added or
// deleted: that may rebuild the index and the slab under it.
func (es *Elements) each() iter.Seq2[string, string] {
	return func(yield func(k, v string) bool) {
		if es.index == nil {
			for o := 0; o < len(es.slab); {
				k, v := es.record(uint32(o))
				if !yield(k, v) {
					return
				}
				o += recordLen(k, v)
			}
			return
		}
		for _, e := range es.index {
			if e != 0 && e != tombstone {
				if !yield(es.record(e - 1)) {
					return
				}
			}
		}
	}
}

// at returns the element of packed key k, or nil.
func (es *Elements) at(k string) *Element {
	v, ok := es.get(k)
	if !ok {
		return nil
	}
	e := unpackElement(k, v)
	return &e
}

// Field packing: a tag byte, then the field's bytes. The tag holds the
// address length (0: no address) and whether an integer follows, as a
// uvarint (a protocol or a small port in one or two bytes).
const (
	packAddr4 = 4
	packAddr6 = 16
	packInt   = 0x80
)

// packKey packs the fields of a key: 5 bytes per IPv4 address, 17 per
// IPv6 address, 2 to 6 per integer.
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
			b = binary.AppendUvarint(b, uint64(d.Int))
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
			var n int
			d.Int, n = uvarint(s)
			s = s[n:]
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
	var buf [128]byte
	return string(appendValue(buf[:0], e))
}

// appendValue appends e's packed value to b.
func appendValue(b []byte, e Element) []byte {
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
		return b
	}
	b = append(b, flags)
	if e.End != 0 {
		b = binary.LittleEndian.AppendUint32(b, e.End)
	}
	if e.Verdict != nil {
		b = appendString(appendString(b, string(e.Verdict.Kind)), e.Verdict.Chain)
	}
	if e.Comment != "" {
		b = appendString(b, e.Comment)
	}
	return appendPacked(b, e.Data)
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
	n, w := uvarint(v)
	v = v[w:]
	return v[:n], v[n:]
}

// uvarint reads a uvarint of at most 32 bits at the start of s: its value
// and length.
func uvarint(s string) (uint32, int) {
	var v uint32
	shift, i := 0, 0
	for ; s[i] >= 0x80; i++ {
		v |= uint32(s[i]&0x7f) << shift
		shift += 7
	}
	return v | uint32(s[i])<<shift, i + 1
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
