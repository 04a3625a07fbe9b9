package nft

import (
	"maps"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fullSyncRuleset is a ruleset with every shape a full rewrite meets:
// sets with and without elements, a verdict map, an endpoints map, base
// and regular chains, chains with and without rules, elements shared by
// several fragments.
func fullSyncRuleset(t testing.TB) *Ruleset {
	t.Helper()
	rng := rand.New(rand.NewSource(2))
	ed := NewEditor(IPv4)
	for _, s := range editorSets() {
		ed.AddSet(s)
	}
	ed.AddSet(&Set{Name: "empty", Key: []DataType{TypeIPv4Addr}})
	ed.AddSet(NewEndpointsMap(IPv4, "endpoints-tcp-0", ProtoTCP))
	ed.Replace(nil, &Fragment{Chains: []*Chain{
		{Name: "prerouting", Base: &BaseChain{Type: ChainNAT, Hook: HookPrerouting, Priority: PriorityDstNAT},
			Rules: []Rule{{Phrases: []Phrase{MatchL4Proto{ProtoTCP}}, Comment: "base"}}},
		{Name: "no-rules"},
	}})
	for i := 0; i < 200; i++ {
		fr := svcFragment(i, []int{rng.Intn(30), 30 + rng.Intn(30)})
		var eps []netip.AddrPort
		for j := rng.Intn(4); j > 0; j-- {
			eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 1, byte(rng.Intn(256))}), 8080))
		}
		for _, e := range EndpointsElements(uint16(i), eps) {
			fr.Elements = append(fr.Elements, SetElement{"endpoints-tcp-0", e})
		}
		ed.Replace(nil, fr)
	}
	return ed.Ruleset()
}

// TestFullRewriteIsDiffFromEmpty: FullRewrite, built without changes, is
// exactly OpResetTable followed by what Diff makes from an empty table,
// but that its element ops add every element of their set
// (Op.AllElements), in the order of the set's map, where Diff lists them
// sorted by key.
func TestFullRewriteIsDiffFromEmpty(t *testing.T) {
	desired := fullSyncRuleset(t)
	got := FullRewrite(desired)
	want := Diff(NewRuleset(IPv4), desired)
	want.Ops = append([]Op{{Kind: OpResetTable}}, want.Ops...)
	for i, op := range got.Ops {
		if op.AllElements {
			got.Ops[i].Elements, got.Ops[i].AllElements = slices.Collect(op.AllOf()), false
		}
		slices.SortFunc(got.Ops[i].Elements, func(a, b Element) int {
			return strings.Compare(packKey(a.Key), packKey(b.Key))
		})
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("FullRewrite differs from a diff from an empty table:\n got %d ops %+v\nwant %d ops %+v",
			len(got.Ops), got.Ops, len(want.Ops), want.Ops)
	}
	if len(got.Ops) != cap(got.Ops) {
		t.Errorf("%d ops in a slice of capacity %d: the count is wrong", len(got.Ops), cap(got.Ops))
	}
}

// TestElementKeyIsKeyString: element keys (KeyString, elementKey) are nft's text (tupleText),
// for every data type, in concatenations, and for the odd datums:
// the zero address, an IPv4-mapped and a zoned IPv6 address, an unknown
// protocol, more fields than types.
func TestElementKeyIsKeyString(t *testing.T) {
	types := []DataType{TypeVerdict, TypeInteger, TypeIPv4Addr, TypeIPv6Addr, TypeInetProto, TypeInetService, TypeMark}
	datums := []Datum{
		{}, Int(0), Int(6), Int(17), Int(132), Int(200), Int(65535), Int(1 << 31), Int(^uint32(0)),
		Addr(netip.MustParseAddr("10.96.0.1")), Addr(netip.MustParseAddr("0.0.0.0")),
		Addr(netip.MustParseAddr("fd00::1")), Addr(netip.MustParseAddr("::ffff:10.0.0.1")),
		Addr(netip.MustParseAddr("fe80::1%eth0")), Addr(netip.MustParseAddr("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")),
		{Addr: netip.MustParseAddr("10.0.0.2"), Int: 80},
	}
	rng := rand.New(rand.NewSource(3))
	for n := 0; n < 20000; n++ {
		s := &Set{Name: "s"}
		for i := rng.Intn(5); i > 0; i-- {
			s.Key = append(s.Key, types[rng.Intn(len(types))])
		}
		var key []Datum
		for i := rng.Intn(len(s.Key) + 2); i > 0; i-- {
			key = append(key, datums[rng.Intn(len(datums))])
		}
		if got, want := elementKey(s, key), tupleText(s.Key, key); got != want {
			t.Fatalf("key %v of %s: elementKey %q, nft's text %q", key, s.TypeString(), got, want)
		}
	}
}

// TestEditorCountsHolders: an element held by several fragments stays
// until the last one releases it, and releasing an element nobody holds
// changes nothing.
func TestEditorCountsHolders(t *testing.T) {
	ed := NewEditor(IPv4)
	ed.AddSet(&Set{Name: "ips", Key: []DataType{TypeIPv4Addr}})
	fr := func(b byte) *Fragment {
		return &Fragment{Elements: []SetElement{{"ips", Element{Key: []Datum{Addr(netip.AddrFrom4([4]byte{10, 0, 0, b}))}}}}}
	}
	has := func(key string) bool {
		return ed.Ruleset().Sets["ips"].Elements.Has([]Datum{Addr(netip.MustParseAddr(key))})
	}
	ed.Replace(nil, fr(1))
	ed.Replace(nil, fr(1))
	ed.Replace(nil, fr(1))
	ed.Replace(fr(2), nil) // not held
	ed.Transaction()
	ed.Commit()
	for i := 0; i < 2; i++ {
		ed.Replace(fr(1), nil)
		if !has("10.0.0.1") {
			t.Fatalf("element gone after %d of 3 holders released it", i+1)
		}
		if tx := ed.Transaction(); !tx.Empty() {
			t.Fatalf("%d of 3 holders released an element: %+v", i+1, tx.Ops)
		}
		ed.Commit()
	}
	ed.Replace(fr(1), nil)
	if has("10.0.0.1") {
		t.Fatal("element kept after its last holder released it")
	}
	if tx := ed.Transaction(); tx.Changes() != 1 || tx.Ops[0].Kind != OpDeleteElements {
		t.Fatalf("last holder released an element: %+v", tx.Ops)
	}
	ed.Commit()
	ed.Replace(nil, fr(1))
	if tx := ed.Transaction(); tx.Changes() != 1 || tx.Ops[0].Kind != OpAddElements {
		t.Fatalf("element held again: %+v", tx.Ops)
	}
	if len(ed.shared) != 0 {
		t.Fatalf("holders left counted: %v", ed.shared)
	}
}

// fullSyncBenchRuleset has the sets of 10k Services of one port and five
// endpoints each, as proxier/ruleset builds them (the chains aside).
func fullSyncBenchRuleset() *Ruleset {
	rs := NewRuleset(IPv4)
	ips := rs.AddSet(&Set{Name: "cluster-ips", Key: []DataType{TypeIPv4Addr}})
	vips := rs.AddSet(&Set{Name: "service-ips", Key: []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService},
		Data: []DataType{TypeVerdict}})
	hairpins := rs.AddSet(&Set{Name: "hairpin-connections",
		Key: []DataType{TypeIPv4Addr, TypeIPv4Addr, TypeInetProto, TypeInetService}})
	eps := rs.AddSet(NewEndpointsMap(IPv4, "endpoints-tcp-0", ProtoTCP))
	add := func(s *Set, e Element) { s.Elements.Put(e) }
	for i := range 10000 {
		vip := Addr(netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}))
		add(ips, Element{Key: []Datum{vip}})
		add(vips, Element{Key: []Datum{vip, Int(uint32(ProtoTCP)), Int(80)},
			Verdict: &Verdict{Kind: VerdictGoto, Chain: "service-" + strconv.Itoa(i)}})
		var endpoints []netip.AddrPort
		for j := range 5 {
			ep := netip.AddrFrom4([4]byte{10, 128 + byte(j), byte(i >> 8), byte(i)})
			endpoints = append(endpoints, netip.AddrPortFrom(ep, 8080))
			add(hairpins, Element{Key: []Datum{Addr(ep), Addr(ep), Int(uint32(ProtoTCP)), Int(8080)}})
		}
		for _, e := range EndpointsElements(uint16(i), endpoints) {
			add(eps, e)
		}
	}
	return rs
}

func BenchmarkFullRewrite(b *testing.B) {
	rs := fullSyncBenchRuleset()
	b.ReportAllocs()
	for b.Loop() {
		FullRewrite(rs)
	}
}

// diffAllKeys is Diff as it was before changedKeys: every key of both
// sets, sorted, goes through changes.element.
func diffAllKeys(committed, desired *Ruleset) *Transaction {
	c := newChanges(desired.Family)
	for _, name := range desired.SortedSetNames() {
		if _, ok := committed.Sets[name]; !ok {
			c.newSets = append(c.newSets, desired.Sets[name])
		}
	}
	for _, name := range unionKeys(committed.Chains, desired.Chains) {
		c.chain(committed.Chains[name], desired.Chains[name])
	}
	for _, name := range desired.SortedSetNames() {
		want := desired.Sets[name]
		have := &Elements{}
		if old, ok := committed.Sets[name]; ok {
			have = &old.Elements
		}
		for _, k := range unionKeys(maps.Collect(have.each()), maps.Collect(want.Elements.each())) {
			c.element(want, have.at(k), want.Elements.at(k))
		}
	}
	for _, name := range committed.SortedSetNames() {
		if _, ok := desired.Sets[name]; !ok {
			c.goneSets = append(c.goneSets, committed.Sets[name])
		}
	}
	return c.transaction()
}

// TestDiffSortsOnlyChanges: Diff, which sorts only the keys of elements
// that changed, makes the transaction it made when it sorted every key,
// for elements added, removed, and changed in value, comment or range.
func TestDiffSortsOnlyChanges(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	for round := 0; round < 20; round++ {
		committed := fullSyncRuleset(t)
		desired := fullSyncRuleset(t)
		for _, s := range []*Ruleset{committed, desired} {
			for _, set := range s.Sets {
				for _, e := range slices.Collect(set.Elements.All()) {
					switch rng.Intn(40) {
					case 0:
						set.Elements.Delete(e.Key)
						continue
					case 1:
						e.Comment += "x"
					case 2:
						if e.Verdict != nil {
							e.Verdict = &Verdict{Kind: VerdictGoto, Chain: "other"}
						}
					case 3:
						if len(e.Data) > 0 {
							e.Data = []Datum{e.Data[0], Int(9090)}
						}
					case 4:
						e.End++
					case 5: // equal value, not the same pointer or slice
						if e.Verdict != nil {
							v := *e.Verdict
							e.Verdict = &v
						}
						e.Data = slices.Clone(e.Data)
					}
					set.Elements.Put(e)
				}
			}
		}
		desired.Sets["ips"].Elements.Put(Element{Key: []Datum{Addr(netip.MustParseAddr("10.1.1.1"))}})
		got, want := Diff(committed, desired), diffAllKeys(committed, desired)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: Diff differs from a diff of every key:\n got %+v\nwant %+v", round, got.Ops, want.Ops)
		}
		if got.Changes() == 0 {
			t.Fatalf("round %d: nothing changed", round)
		}
	}
}

// TestSameElementIsSameText: comparing values field by field first
// decides as comparing their text does.
func TestSameElementIsSameText(t *testing.T) {
	a4, b4 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	values := []Element{
		{}, {Verdict: &Verdict{Kind: VerdictDrop}}, {Verdict: &Verdict{Kind: VerdictDrop}},
		{Verdict: &Verdict{Kind: VerdictGoto, Chain: "a"}}, {Verdict: &Verdict{Kind: VerdictGoto, Chain: "b"}},
		{Verdict: &Verdict{Kind: VerdictJump, Chain: "a"}},
		{Data: []Datum{Addr(a4), Int(80)}}, {Data: []Datum{Addr(a4), Int(80)}}, {Data: []Datum{Addr(b4), Int(80)}},
		{Data: []Datum{Addr(a4), Int(81)}}, {Data: []Datum{Addr(a4)}}, {Data: []Datum{}},
		{Data: []Datum{{Addr: a4, Int: 7}, Int(80)}}, // Int unused in an address field: same text
		{Data: []Datum{Addr(a4), Int(80)}, Comment: "c"}, {Data: []Datum{Addr(a4), Int(80)}, End: 3},
	}
	for _, s := range []*Set{
		{Key: []DataType{TypeInteger}, Data: []DataType{TypeIPv4Addr, TypeInetService}},
		{Key: []DataType{TypeIPv4Addr}, Data: []DataType{TypeVerdict}},
	} {
		for _, a := range values {
			for _, b := range values {
				want := a.Comment == b.Comment && a.End == b.End && s.ValueString(a) == s.ValueString(b)
				if got := SameElement(s, a, b); got != want {
					t.Errorf("SameElement(%+v, %+v) = %v, the text says %v", a, b, got, want)
				}
			}
		}
	}
}

// BenchmarkEditorFromLoaded is the Editor's part of a full sync against
// the table read back, unchanged: 10k fragments of about 12 elements each
// are held, then diffed against the loaded sets.
func BenchmarkEditorFromLoaded(b *testing.B) {
	loaded := fullSyncBenchRuleset()
	var frags []*Fragment
	for _, name := range loaded.SortedSetNames() {
		s := loaded.Sets[name]
		i := 0
		for e := range s.Elements.All() {
			if i%10000 == len(frags) {
				frags = append(frags, &Fragment{})
			}
			fr := frags[i%10000]
			fr.Elements = append(fr.Elements, SetElement{name, e})
			i++
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		fresh := loaded.Clone() // the editor takes over its elements
		b.StartTimer()
		ed := NewEditorFrom(IPv4, fresh)
		for _, s := range loaded.Sets {
			ed.AddSet(s)
		}
		for _, fr := range frags {
			ed.Replace(nil, fr)
		}
		if tx := ed.Transaction(); !tx.Empty() {
			b.Fatalf("%d ops", len(tx.Ops))
		}
	}
}
