package nftnl

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file writes and reads set elements: NEWSETELEM and DELSETELEM,
// encoded straight into the batch, and the element dump, decoded without
// an allocation per element.

// setElements writes NEWSETELEM or DELSETELEM messages for the elements
// of op, as many as needed to keep each element list below
// maxElemListLen. Each element is encoded straight into the batch: a full
// rewrite holds no second copy of its elements.
func (b *batch) setElements(msgType uint16, op *nft.Op) error {
	s := op.Set
	w := elemWriter{b: b, msgType: msgType, name: s.Name, setID: b.setIDs[s.Name]}
	withValue := msgType == unix.NFT_MSG_NEWSETELEM
	var err error
	each := func(e nft.Element) bool {
		var v elemValue
		if v, err = b.elementValue(s, e, withValue); err != nil {
			err = fmt.Errorf("element %s: %w", s.KeyString(e.Key), err)
			return false
		}
		w.add(v)
		if s.EndpointsProto != 0 {
			w.add(rangeEnd(e, b.scratch.end[:0]))
		}
		return true
	}
	if op.AllElements {
		// Scanned: the encoding keeps no field of an element.
		for e := range s.Elements.Scan() {
			if !each(*e) {
				break
			}
		}
	} else {
		for _, e := range op.Elements {
			if !each(e) {
				break
			}
		}
	}
	w.close()
	return err
}

// elemValue is one element, encoded: key and data bytes, or a verdict.
// intervalEnd marks the element that ends a range of an endpoints map.
// The byte slices are the batch's scratch space, valid until the next
// element is encoded.
type elemValue struct {
	key, data   []byte
	verdict     *nft.Verdict
	comment     []byte // element userdata
	intervalEnd bool
}

// elemScratch is the space elements are encoded in before they are
// written into the batch.
type elemScratch struct {
	keyB, dataB, udata []byte
	end                [4]byte
}

// rangeEnd is the element that ends e's range in an endpoints map (an
// rbtree): flags interval-end, keyed by the key after the range, as nft
// writes it. A range that ends where the next starts shares its key with
// that range's start; the kernel tells them apart by the flag.
func rangeEnd(e nft.Element, buf []byte) elemValue {
	return elemValue{key: binary.BigEndian.AppendUint32(buf, e.End+1), intervalEnd: true}
}

// elemWriter writes the element messages of one set, element by element:
// by name, and also by ID for a set created in this batch (setID 0: an
// existing set), as nft does. A message is closed when its list would
// pass maxElemListLen.
type elemWriter struct {
	b          *batch
	msgType    uint16
	name       string
	setID      uint32
	m, list, n int // the open message, its list, its elements (0: none open)
}

func (w *elemWriter) open() {
	b := w.b
	flags := uint16(0)
	if w.msgType == unix.NFT_MSG_NEWSETELEM {
		flags = flagCreate
	}
	w.m = b.begin(w.msgType, flags)
	b.enc.Str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.enc.Str(unix.NFTA_SET_ELEM_LIST_SET, w.name)
	if w.setID != 0 {
		b.enc.BE32(unix.NFTA_SET_ELEM_LIST_SET_ID, w.setID)
	}
	w.list = b.enc.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
}

func (w *elemWriter) add(v elemValue) {
	b := w.b
	if w.n == 0 {
		w.open()
	}
	mark := len(b.enc.Buf)
	b.element(uint16(w.n+1), v)
	if len(b.enc.Buf)-w.list > maxElemListLen && w.n > 0 {
		b.enc.Buf = b.enc.Buf[:mark] // full: this element opens the next message
		w.close()
		w.open()
		b.element(1, v)
	}
	w.n++
}

// close ends the open message, if any.
func (w *elemWriter) close() {
	if w.n == 0 {
		return
	}
	w.b.enc.EndNest(w.list)
	w.b.end(w.m)
	w.b.elements += w.n
	w.n = 0
}

// element writes one element of a list. libnftnl numbers the list entries
// 1, 2, 3… (the kernel ignores the type); so do we.
func (b *batch) element(idx uint16, v elemValue) {
	el := b.enc.Nest(idx)
	if v.intervalEnd {
		b.enc.BE32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	k := b.enc.Nest(unix.NFTA_SET_ELEM_KEY)
	b.enc.Attr(unix.NFTA_DATA_VALUE, v.key)
	b.enc.EndNest(k)
	switch {
	case v.verdict != nil:
		d := b.enc.Nest(unix.NFTA_SET_ELEM_DATA)
		b.enc.verdict(*v.verdict)
		b.enc.EndNest(d)
	case v.data != nil:
		d := b.enc.Nest(unix.NFTA_SET_ELEM_DATA)
		b.enc.Attr(unix.NFTA_DATA_VALUE, v.data)
		b.enc.EndNest(d)
	}
	if v.comment != nil {
		b.enc.Attr(unix.NFTA_SET_ELEM_USERDATA, v.comment)
	}
	b.enc.EndNest(el)
}

// elementValue encodes an element of s, in the batch's scratch space.
// Deletions carry only the key. An endpoints map's element is the start
// of its range; rangeEnd its end.
func (b *batch) elementValue(s *nft.Set, e nft.Element, withValue bool) (elemValue, error) {
	var v elemValue
	var err error
	sc := &b.scratch
	if v.key, err = encodeTupleTo(sc.keyB[:0], b.family, s.Key, e.Key, s.EndpointsProto != 0); err != nil {
		return v, fmt.Errorf("key: %w", err)
	}
	sc.keyB = v.key
	if err := nft.CheckRange(s, e); err != nil {
		return v, err
	}
	if !withValue {
		return v, nil
	}
	switch {
	case s.IsVerdictMap():
		if e.Verdict == nil {
			return v, fmt.Errorf("verdict map element without a verdict")
		}
		v.verdict = e.Verdict
	case s.IsMap():
		if v.data, err = encodeTupleTo(sc.dataB[:0], b.family, s.Data, e.Data, false); err != nil {
			return v, fmt.Errorf("data: %w", err)
		}
		sc.dataB = v.data
	case e.Verdict != nil || len(e.Data) > 0:
		return v, fmt.Errorf("set element with data")
	}
	if e.Comment != "" {
		if v.comment, err = appendUdataString(sc.udata[:0], udataElemComment, e.Comment); err != nil {
			return v, err
		}
		sc.udata = v.comment
	}
	return v, nil
}

// loadElements reads the elements of set s, closing the ranges of an
// endpoints map.
func (n *Netlink) loadElements(f nft.Family, s *nft.Set, g *elementsDigest) error {
	var ends []uint32
	var sc elementScratch
	if err := n.dump(unix.NFT_MSG_GETSETELEM, f, elementsRequest(s), func(attrs []byte) error {
		return decodeElements(f, s, attrs, &ends, &sc, g)
	}); err != nil {
		return fmt.Errorf("dump elements of set %s: %w", s.Name, err)
	}
	if s.EndpointsProto != 0 {
		if err := closeRanges(s, ends); err != nil {
			return fmt.Errorf("elements of set %s: %w", s.Name, err)
		}
	}
	return nil
}

func elementsRequest(s *nft.Set) func(*encoder) {
	return func(e *encoder) {
		e.Str(unix.NFTA_SET_ELEM_LIST_TABLE, nft.TableName)
		e.Str(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
	}
}

// A hash set is dumped in pieces, each of which walks the kernel's hash
// table from its start and skips what earlier pieces sent; when the table
// is resized between two pieces (the kernel grows and shrinks it in the
// background, after the commits that filled or emptied it), the order
// changes and a dump can miss elements, with nothing to say so: no commit
// happened, the generation did not move. Load therefore reads each hash
// set a second time and compares what the two readings hold (checkElements);
// when they differ, it reads the table again. The interval sets (endpoints
// maps) are trees, which are not resized.

// elementsDigest sums, over a set's elements, a hash of each element's key
// and data as the kernel sent them: the same elements give the same sum in
// any order. Counters, which traffic moves between two readings, are left
// out.
type elementsDigest struct {
	count int
	sum   uint64
}

func (g *elementsDigest) add(d *nlcodec.Decoder, elem []byte) {
	h := fnv.New64a()
	d.Attrs(elem, func(t uint16, data []byte) {
		if t == unix.NFTA_SET_ELEM_KEY || t == unix.NFTA_SET_ELEM_DATA {
			h.Write(data)
		}
	})
	g.count++
	g.sum += h.Sum64()
}

// digestElements reads the elements of set s again and digests them.
func (n *Netlink) digestElements(f nft.Family, s *nft.Set) (elementsDigest, error) {
	var g elementsDigest
	err := n.dump(unix.NFT_MSG_GETSETELEM, f, elementsRequest(s), func(attrs []byte) error {
		return walkElements(attrs, func(d *nlcodec.Decoder, elem []byte) error {
			g.add(d, elem)
			return nil
		})
	})
	if err != nil {
		return g, fmt.Errorf("dump elements of set %s: %w", s.Name, err)
	}
	return g, nil
}

// checkElements reads the elements of hash set s again and fails with
// errLoadRaced when they differ from what loadElements read (first).
func (n *Netlink) checkElements(f nft.Family, s *nft.Set, first elementsDigest) error {
	second, err := n.digestElements(f, s)
	if err != nil {
		return err
	}
	if first != second {
		return fmt.Errorf("%w: two readings of set %s differ (%d and %d elements): the kernel resized its hash table meanwhile",
			errLoadRaced, s.Name, first.count, second.count)
	}
	return nil
}

// decodeElements adds the elements of a NEWSETELEM of an element dump to s,
// and digests them into g if it is not nil; in an endpoints map, the keys of the elements that end ranges go to ends
// instead, and the range starts are added with the end openRange, which
// closeRanges replaces.
func decodeElements(f nft.Family, s *nft.Set, attrs []byte, ends *[]uint32, sc *elementScratch, g *elementsDigest) error {
	return walkElements(attrs, func(d *nlcodec.Decoder, elem []byte) error {
		if g != nil {
			g.add(d, elem)
		}
		e, end, err := decodeElement(d, f, s, elem, sc)
		switch {
		case err != nil:
			return err
		case end:
			*ends = append(*ends, e.Key[0].Int)
			return nil
		case s.EndpointsProto != 0:
			e.End = openRange
		}
		s.Elements.Put(e)
		return nil
	})
}

// walkElements calls fn for each element of a NEWSETELEM of an element
// dump, until fn fails.
func walkElements(attrs []byte, fn func(d *nlcodec.Decoder, elem []byte) error) error {
	var d nlcodec.Decoder
	var err error
	d.Attrs(attrs, func(t uint16, list []byte) {
		if t != unix.NFTA_SET_ELEM_LIST_ELEMENTS || err != nil {
			return
		}
		d.Attrs(list, func(_ uint16, elem []byte) {
			if err == nil {
				err = fn(&d, elem)
			}
		})
	})
	if err == nil {
		err = d.Err()
	}
	return err
}

// openRange is the end a range start of an endpoints map has while Load
// reads the map: a placeholder, so that its packed value has room for the
// end closeRanges writes in place.
const openRange = ^uint32(0)

// closeRanges gives each range start of an endpoints map its end: the
// smallest end key above it, less one. Every end must close a range. The
// ends are written into the values in place: there is a range per
// endpoint of every Service, and a packed copy of each would leave as
// garbage in the slab and in the heap.
func closeRanges(s *nft.Set, ends []uint32) error {
	slices.Sort(ends)
	used := 0
	err := s.Elements.SetEnds(func(e *nft.Element) (uint32, error) {
		i, _ := slices.BinarySearch(ends, e.Key[0].Int+1)
		if i == len(ends) {
			return 0, fmt.Errorf("range %s has no end", s.KeyString(e.Key))
		}
		e.End = ends[i] - 1
		used++
		return e.End, nft.CheckRange(s, *e)
	})
	if err != nil {
		return err
	}
	if used != len(ends) {
		return fmt.Errorf("%d range starts, %d ends", used, len(ends))
	}
	return nil
}

// elementScratch is the space decodeElements decodes each element in,
// before the set packs and copies it (Elements.Put): reading a table back
// allocates nothing per element but the set's own growth.
type elementScratch struct {
	key, data [8]nft.Datum
	verdict   nft.Verdict
}

// decodeElement decodes one element into sc, where it stays until the next
// (its comment is a view of attrs); end reports an endpoints map's element
// that ends a range (its Key alone is set).
func decodeElement(d *nlcodec.Decoder, f nft.Family, s *nft.Set, attrs []byte, sc *elementScratch) (e nft.Element, end bool, err error) {
	var key, data, ud []byte
	var flags uint32
	d.Attrs(attrs, func(t uint16, v []byte) {
		switch t {
		case unix.NFTA_SET_ELEM_KEY:
			key = v
		case unix.NFTA_SET_ELEM_FLAGS:
			flags = d.BE32(v)
		case unix.NFTA_SET_ELEM_DATA:
			data = v
		case unix.NFTA_SET_ELEM_USERDATA:
			ud = v
		}
	})
	ints := s.EndpointsProto != 0 // in network byte order, see encodeKey
	if e.Key, err = decodeTupleOrder(sc.key[:0], f, s.Key, dataValue(d, key), ints); err != nil {
		return e, false, fmt.Errorf("element key: %w", err)
	}
	if s.EndpointsProto != 0 && flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
		return e, true, nil
	}
	switch {
	case s.IsVerdictMap():
		d.Attrs(data, func(t uint16, v []byte) {
			if t == unix.NFTA_DATA_VERDICT {
				sc.verdict = decodeVerdict(d, v)
				e.Verdict = &sc.verdict
			}
		})
		if e.Verdict == nil {
			return e, false, fmt.Errorf("element %s: no verdict", s.KeyString(e.Key))
		}
	case s.IsMap():
		if e.Data, err = decodeTupleOrder(sc.data[:0], f, s.Data, dataValue(d, data), false); err != nil {
			return e, false, fmt.Errorf("element %s: data: %w", s.KeyString(e.Key), err)
		}
	}
	for len(ud) >= 2 && 2+int(ud[1]) <= len(ud) {
		if n := int(ud[1]); ud[0] == udataElemComment && n > 0 {
			e.Comment = view(nlcodec.StringBytes(ud[2 : 2+n]))
		}
		ud = ud[2+int(ud[1]):]
	}
	return e, false, nil
}

// dataValue returns NFTA_DATA_VALUE from a struct nft_data nest.
func dataValue(d *nlcodec.Decoder, nest []byte) []byte {
	var v []byte
	d.Attrs(nest, func(t uint16, data []byte) {
		if t == unix.NFTA_DATA_VALUE {
			v = data
		}
	})
	return v
}

// view is a string sharing b's memory: the element's comment while the set
// copies it in (Elements.Put), without a copy of its own.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
