package ruleset

import (
	"maps"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// TestPickMapsFillInTurn: ClusterIP ports with as many endpoints fill a
// pick map up to PickMapElements, then the next; a table read back
// (SeedPicks) keeps each port in its map whatever the order the Services
// are built in, so that a restart changes nothing. Tables that differ only
// in which maps the ports are in have one canonical form (CanonicalSlots).
func TestPickMapsFillInTurn(t *testing.T) {
	perMap := PickMapElements / 5
	st := bigState(perMap + 1) // 5 endpoints each
	rs := Build(testConfig, nft.IPv4, st)
	sizes := map[string]int{}
	for name, s := range rs.Sets {
		if s.PickProto != 0 {
			sizes[name] = s.Elements.Len()
		}
	}
	if want := map[string]int{"endpoints-tcp-n5-0": 5 * perMap, "endpoints-tcp-n5-1": 5}; !maps.Equal(sizes, want) {
		t.Fatalf("pick maps %v, want %v", sizes, want)
	}
	if rs.Chains["pick-tcp-5-1"] == nil {
		t.Fatal("no chain for the second map")
	}

	reversed := slices.Clone(st)
	slices.Reverse(reversed)
	backwards := Build(testConfig, nft.IPv4, reversed)
	if backwards.Dump() == rs.Dump() {
		t.Fatal("built in reverse, the table is the same: the test tests nothing")
	}
	if CanonicalSlots(backwards).Dump() != CanonicalSlots(rs).Dump() {
		t.Error("built in reverse, the canonical form differs")
	}
	moved := slices.Clone(st)
	moved[7].Endpoints = slices.Clone(moved[7].Endpoints)
	moved[7].Endpoints[2] = ap("10.244.9.9:1")
	if CanonicalSlots(Build(testConfig, nft.IPv4, moved)).Dump() == CanonicalSlots(rs).Dump() {
		t.Error("an endpoint change is lost in the canonical form")
	}
	seeded := NewSlots()
	seeded.SeedPicks(nft.IPv4, rs)
	if got := BuildSlots(testConfig, nft.IPv4, reversed, seeded); got.Dump() != rs.Dump() {
		t.Error("built in reverse on the maps read back, the table differs")
	}
	if tx := nft.Diff(rs, BuildSlots(testConfig, nft.IPv4, st[1:], seeded)); tx.Changes() != 1+1+5+5 {
		t.Errorf("a Service gone after the seeding: %d changes, want its ClusterIP, service-ips, hairpin and pick elements", tx.Changes())
	}
}
