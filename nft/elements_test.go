package nft

import (
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestElementsKeepWhatWasPut: every field of an element comes back from
// Get and All as it was put: addresses of both families (and IPv4-mapped
// IPv6), the zero address, a datum with both an address and an integer,
// verdicts, long comments, range ends, data.
func TestElementsKeepWhatWasPut(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")
	mapped := netip.MustParseAddr("::ffff:10.0.0.1")
	elems := []Element{
		{Key: []Datum{Addr(v4)}},
		{Key: []Datum{Addr(v6)}},
		{Key: []Datum{Addr(mapped)}},
		{Key: []Datum{{}}},
		{Key: []Datum{{Addr: v4, Int: 7}}},
		{Key: []Datum{Int(1 << 31)}},
		{Key: []Datum{Addr(v4), Addr(v4), Int(6), Int(8080)}},
		{Key: []Datum{Addr(v6), Int(17), Int(53)}, Verdict: &Verdict{Kind: VerdictGoto, Chain: "service-ABC-ns/svc:dns"},
			Comment: "ns/svc:dns"},
		{Key: []Datum{Addr(v4), Int(6), Int(80)}, Verdict: &Verdict{Kind: VerdictDrop}},
		{Key: []Datum{Addr(v4), Int(6), Int(81)}, Verdict: &Verdict{Kind: "verdict(-7)"}, Comment: strings.Repeat("c", 300)},
		{Key: []Datum{Int(131072)}, End: 163839, Data: []Datum{Addr(v4), Int(8080)}},
		{Key: []Datum{Int(1)}, Data: []Datum{Addr(v6), Int(0)}},
		{Key: []Datum{Int(5)}, Data: []Datum{}, Comment: "x"},
	}
	var es Elements
	for _, e := range elems {
		es.Put(e)
	}
	if es.Len() != len(elems) {
		t.Fatalf("%d elements, want %d", es.Len(), len(elems))
	}
	for _, e := range elems {
		got, ok := es.Get(e.Key)
		want := e
		if len(want.Data) == 0 {
			want.Data = nil
		}
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("Get(%v) = %+v, %v; want %+v", e.Key, got, ok, want)
		}
	}
	n := 0
	for e := range es.All() {
		n++
		if !slices.ContainsFunc(elems, func(w Element) bool { return reflect.DeepEqual(w.Key, e.Key) }) {
			t.Errorf("All returned %+v, never put", e)
		}
	}
	if n != len(elems) {
		t.Errorf("All returned %d elements", n)
	}
	c := es.Clone()
	es.Delete(elems[0].Key)
	if es.Has(elems[0].Key) || !c.Has(elems[0].Key) || es.Len() != len(elems)-1 {
		t.Error("Delete: wrong element removed, or the clone aliases the original")
	}
	es.Put(Element{Key: elems[1].Key, Comment: "new"})
	if got, _ := es.Get(elems[1].Key); got.Comment != "new" || es.Len() != len(elems)-1 {
		t.Errorf("Put of an existing key: %+v, %d elements", got, es.Len())
	}
}

// TestElementsAgainstMap: random puts, replacements and deletes (enough
// to grow the index, fill it with tombstones and compact the slab) leave
// the same elements as a Go map given the same operations, also when
// values are replaced while iterating.
func TestElementsAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	var es Elements
	want := map[string]Element{}
	key := func(i int) []Datum {
		return []Datum{Addr(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})), Int(uint32(i))}
	}
	check := func(step int) {
		t.Helper()
		if es.Len() != len(want) {
			t.Fatalf("step %d: %d elements, want %d", step, es.Len(), len(want))
		}
		n := 0
		for e := range es.All() {
			n++
			if w, ok := want[packKey(e.Key)]; !ok || !reflect.DeepEqual(w, e) {
				t.Fatalf("step %d: element %+v, want %+v", step, e, w)
			}
		}
		if n != len(want) {
			t.Fatalf("step %d: All gave %d elements", step, n)
		}
	}
	for step := range 60000 {
		i := rng.Intn(3000)
		switch op := rng.Intn(10); {
		case op < 5:
			e := Element{Key: key(i), Comment: strconv.Itoa(rng.Intn(3))}
			es.Put(e)
			want[packKey(e.Key)] = e
		case op < 9:
			es.Delete(key(i))
			delete(want, packKey(key(i)))
		default:
			if es.Has(key(i)) != (want[packKey(key(i))].Key != nil) {
				t.Fatalf("step %d: Has(%d) wrong", step, i)
			}
		}
		if step%5000 == 0 {
			check(step)
		}
	}
	check(-1)
	if es.garbage > 64<<10 && es.garbage > len(es.slab)/2 {
		t.Errorf("slab of %d bytes, %d of them garbage: never compacted", len(es.slab), es.garbage)
	}
	for k, v := range es.each() { // replace values while iterating
		e := unpackElement(k, v)
		e.Comment = "iterated"
		es.put(k, packValue(e))
		want[k] = e
	}
	check(-2)
}

// TestElementsSetEnd: setEnd rewrites the range end of an element that has
// one, in place, and leaves every other element, and elements without an
// end, as they were.
func TestElementsSetEnd(t *testing.T) {
	var es Elements
	ep := []Datum{Addr(netip.MustParseAddr("10.244.0.1")), Int(8080)}
	for i := range uint32(100) {
		es.Put(Element{Key: []Datum{Int(10 * i)}, End: ^uint32(0), Data: ep, Comment: "c"})
	}
	es.Put(Element{Key: []Datum{Int(5)}, Data: ep})
	slab := len(es.slab)
	for i := range uint32(100) {
		if !es.setEnd(packKey([]Datum{Int(10 * i)}), 10*i+9) {
			t.Fatalf("setEnd(%d) failed", 10*i)
		}
	}
	if es.setEnd(packKey([]Datum{Int(5)}), 7) || es.setEnd(packKey([]Datum{Int(3)}), 7) {
		t.Error("setEnd on an element without an end, or on no element, reported success")
	}
	if len(es.slab) != slab || es.Len() != 101 {
		t.Errorf("slab %d → %d bytes, %d elements", slab, len(es.slab), es.Len())
	}
	for i := range uint32(100) {
		e, ok := es.Get([]Datum{Int(10 * i)})
		if !ok || e.End != 10*i+9 || e.Comment != "c" || !slices.Equal(e.Data, ep) {
			t.Errorf("element %d: %+v", 10*i, e)
		}
	}
	if e, _ := es.Get([]Datum{Int(5)}); e.End != 0 || !slices.Equal(e.Data, ep) {
		t.Errorf("element without an end: %+v", e)
	}
}

// TestElementsMarksSurviveRehash: marks stay with their elements while the
// index grows and tombstones come and go, and unmarked names exactly the
// elements not put since startMarking.
func TestElementsMarksSurviveRehash(t *testing.T) {
	key := func(i int) string { return packKey([]Datum{Int(uint32(i))}) }
	var es Elements
	for i := range 10 {
		es.put(key(i), "")
	}
	es.startMarking()
	if got := len(es.unmarked()); got != 10 {
		t.Fatalf("%d unmarked after startMarking, want 10", got)
	}
	for i := 5; i < 2000; i++ { // 0-4 stay unmarked; the index grows many times
		existed, marked, _ := es.putMarked(key(i), "")
		if existed != (i < 10) || marked {
			t.Fatalf("put %d: existed %v marked %v", i, existed, marked)
		}
	}
	if existed, marked, _ := es.putMarked(key(7), "x"); !existed || !marked {
		t.Fatalf("second put of 7: existed %v marked %v", existed, marked)
	}
	for i := 1000; i < 1900; i++ { // tombstones, and a compaction
		es.del(key(i))
	}
	es.putMarked(key(1500), "")
	got := map[string]bool{}
	for _, k := range es.unmarked() {
		got[k] = true
	}
	if len(got) != 5 {
		t.Fatalf("%d unmarked, want 5 (0-4)", len(got))
	}
	for i := range 5 {
		if !got[key(i)] {
			t.Errorf("element %d not unmarked", i)
		}
	}
	if es.Len() != 2000-900+1 {
		t.Errorf("%d elements", es.Len())
	}
}

// TestElementsAppended: the elements put after a mark are the records past
// it, in the order they were put, through the index growing (rehash) and
// untouched by later puts; a replaced or deleted element ends that.
func TestElementsAppended(t *testing.T) {
	el := func(i int) Element {
		return Element{Key: []Datum{Addr(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}))}, Comment: strconv.Itoa(i)}
	}
	var es Elements
	for i := range 10 {
		es.Put(el(i))
	}
	m := es.slabMark()
	for i := 10; i < 1000; i++ { // the index grows several times
		es.Put(el(i))
	}
	es.Put(el(5)) // the same element again: nothing new
	put, ok := es.appended(m)
	if !ok {
		t.Fatal("appended refused after puts of new keys only")
	}
	var got []string
	for e := range put.All() {
		got = append(got, e.Comment)
	}
	if len(got) != 990 || put.Len() != 990 || got[0] != "10" || got[989] != "999" {
		t.Fatalf("appended %d elements (Len %d), %v … %v; want 10 … 999", len(got), put.Len(), got[:1], got[len(got)-1:])
	}
	m2 := es.slabMark()
	for i := 1000; i < 3000; i++ {
		es.Put(el(i))
	}
	if again, _ := es.appended(m); again.Len() != 2990 || put.Len() != 990 {
		t.Fatalf("views of %d and %d elements, want 2990 and an unchanged 990", again.Len(), put.Len())
	}
	n := 0
	for range put.All() {
		n++
	}
	if n != 990 {
		t.Fatalf("a view yields %d elements after later puts, want 990", n)
	}
	changed := el(7)
	changed.Comment = "seven"
	es.Put(changed)
	if _, ok := es.appended(m2); ok {
		t.Fatal("appended accepted after a value was replaced")
	}
	var fresh Elements
	fresh.Put(el(1))
	m3 := fresh.slabMark()
	fresh.Delete(el(1).Key)
	if _, ok := fresh.appended(m3); ok {
		t.Fatal("appended accepted after a delete")
	}
}
