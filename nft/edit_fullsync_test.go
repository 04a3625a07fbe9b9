package nft

import (
	"math/rand"
	"net/netip"
	"reflect"
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

// TestFullRewriteIsDiffFromEmpty: fullRewrite, built without changes, is
// exactly OpResetTable followed by what Diff makes from an empty table.
func TestFullRewriteIsDiffFromEmpty(t *testing.T) {
	desired := fullSyncRuleset(t)
	got := fullRewrite(desired)
	want := Diff(NewRuleset(IPv4), desired)
	want.Ops = append([]Op{{Kind: OpResetTable}}, want.Ops...)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("fullRewrite differs from a diff from an empty table:\n got %d ops %+v\nwant %d ops %+v",
			len(got.Ops), got.Ops, len(want.Ops), want.Ops)
	}
	if len(got.Ops) != cap(got.Ops) {
		t.Errorf("%d ops in a slice of capacity %d: the count is wrong", len(got.Ops), cap(got.Ops))
	}
}
