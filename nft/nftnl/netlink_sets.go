package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"

	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// This file encodes sets, maps and their elements: NEWSET, DELSET,
// NEWSETELEM and DELSETELEM, laid out as nft 1.0.6 writes them.

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
	b.enc.str(unix.NFTA_SET_TABLE, b.table)
	b.enc.str(unix.NFTA_SET_NAME, name)
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
	if s.Endpoints != 0 {
		if err := nft.CheckEndpointsMap(b.family, s); err != nil {
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
	if s.Endpoints != 0 {
		flags |= unix.NFT_SET_INTERVAL
	}
	m := b.begin(unix.NFT_MSG_NEWSET, flagCreate)
	b.enc.str(unix.NFTA_SET_TABLE, b.table)
	b.enc.str(unix.NFTA_SET_NAME, s.Name)
	b.enc.u32(unix.NFTA_SET_FLAGS, flags)
	b.enc.u32(unix.NFTA_SET_KEY_TYPE, typeMagic(s.Key))
	b.enc.u32(unix.NFTA_SET_KEY_LEN, uint32(tupleLen(s.Key)))
	if s.IsVerdictMap() {
		b.enc.u32(unix.NFTA_SET_DATA_TYPE, unix.NFT_DATA_VERDICT)
		b.enc.u32(unix.NFTA_SET_DATA_LEN, 0)
	} else if s.IsMap() {
		b.enc.u32(unix.NFTA_SET_DATA_TYPE, typeMagic(s.Data))
		b.enc.u32(unix.NFTA_SET_DATA_LEN, uint32(tupleLen(s.Data)))
	}
	b.enc.u32(unix.NFTA_SET_ID, id)
	if s.Size > 0 {
		d := b.enc.nest(unix.NFTA_SET_DESC)
		b.enc.u32(unix.NFTA_SET_DESC_SIZE, s.Size)
		b.enc.endNest(d)
	}
	if timeout > 0 {
		b.enc.u64(unix.NFTA_SET_TIMEOUT, uint64(timeout))
	}
	b.enc.attr(unix.NFTA_SET_USERDATA, ud)
	b.end(m)
	b.setIDs[s.Name] = id
	return nil
}

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
		if s.Endpoints != 0 {
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
	b.enc.str(unix.NFTA_SET_ELEM_LIST_TABLE, b.table)
	b.enc.str(unix.NFTA_SET_ELEM_LIST_SET, w.name)
	if w.setID != 0 {
		b.enc.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, w.setID)
	}
	w.list = b.enc.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
}

func (w *elemWriter) add(v elemValue) {
	b := w.b
	if w.n == 0 {
		w.open()
	}
	mark := len(b.enc.b)
	b.element(uint16(w.n+1), v)
	if len(b.enc.b)-w.list > maxElemListLen && w.n > 0 {
		b.enc.b = b.enc.b[:mark] // full: this element opens the next message
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
	w.b.enc.endNest(w.list)
	w.b.end(w.m)
	w.b.elements += w.n
	w.n = 0
}

// element writes one element of a list. libnftnl numbers the list entries
// 1, 2, 3… (the kernel ignores the type); so do we.
func (b *batch) element(idx uint16, v elemValue) {
	el := b.enc.nest(idx)
	if v.intervalEnd {
		b.enc.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	k := b.enc.nest(unix.NFTA_SET_ELEM_KEY)
	b.enc.attr(unix.NFTA_DATA_VALUE, v.key)
	b.enc.endNest(k)
	switch {
	case v.verdict != nil:
		d := b.enc.nest(unix.NFTA_SET_ELEM_DATA)
		b.enc.verdict(*v.verdict)
		b.enc.endNest(d)
	case v.data != nil:
		d := b.enc.nest(unix.NFTA_SET_ELEM_DATA)
		b.enc.attr(unix.NFTA_DATA_VALUE, v.data)
		b.enc.endNest(d)
	}
	if v.comment != nil {
		b.enc.attr(unix.NFTA_SET_ELEM_USERDATA, v.comment)
	}
	b.enc.endNest(el)
}

// elementValue encodes an element of s, in the batch's scratch space.
// Deletions carry only the key. An endpoints map's element is the start
// of its range; rangeEnd its end.
func (b *batch) elementValue(s *nft.Set, e nft.Element, withValue bool) (elemValue, error) {
	var v elemValue
	var err error
	sc := &b.scratch
	if v.key, err = encodeTupleTo(sc.keyB[:0], b.family, s.Key, e.Key, s.Endpoints != 0); err != nil {
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
