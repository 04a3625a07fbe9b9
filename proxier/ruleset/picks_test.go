package ruleset

import (
	"maps"
	"net/netip"
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

// TestPickRoomReused: a port goes into the first pick map of its group
// with room, including room a port released in a full map before it;
// NewMaps hands each new map out once, in order.
func TestPickRoomReused(t *testing.T) {
	const n = nft.MaxPickEndpoints
	perMap := PickMapElements / n
	s := NewSlots()
	port := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}) }
	pick := func(i int) string {
		m, _ := s.Pick(nft.ProtoTCP, n, port(i), 80)
		return m
	}
	for i := range 2*perMap + 1 {
		if got, want := pick(i), PickMapName(nft.ProtoTCP, n, i/perMap); got != want {
			t.Fatalf("port %d in %s, want %s", i, got, want)
		}
	}
	var names []string
	for _, m := range s.NewMaps(nft.IPv4) {
		names = append(names, m.Name)
	}
	if want := []string{PickMapName(nft.ProtoTCP, n, 0), PickMapName(nft.ProtoTCP, n, 1), PickMapName(nft.ProtoTCP, n, 2)}; !slices.Equal(names, want) {
		t.Fatalf("new maps %v, want %v", names, want)
	}
	if again := s.NewMaps(nft.IPv4); len(again) != 0 {
		t.Fatalf("new maps again: %d", len(again))
	}
	s.picks.release(pickHolder{pickGroup{nft.ProtoTCP, n}, port(3), 80})
	if got, want := pick(1000), PickMapName(nft.ProtoTCP, n, 0); got != want {
		t.Errorf("after a release in the first map: %s, want %s", got, want)
	}
	if got, want := pick(1001), PickMapName(nft.ProtoTCP, n, 2); got != want {
		t.Errorf("with the first two maps full: %s, want %s", got, want)
	}
	if got, want := pick(3), PickMapName(nft.ProtoTCP, n, 2); got != want {
		t.Errorf("the released port back: %s, want %s", got, want)
	}
}
