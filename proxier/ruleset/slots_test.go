package ruleset

import (
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft"
)

type slotOf struct {
	m    string
	slot uint16
}

func slot(s *Slots, chain string, proto uint8) slotOf {
	m, sl := s.Slot(chain, proto)
	return slotOf{m, sl}
}

func TestSlots(t *testing.T) {
	s := newSlots(2)
	tcp, udp := nft.ProtoTCP, nft.ProtoUDP
	for _, tc := range []struct {
		chain string
		proto uint8
		want  slotOf
	}{
		{"a", tcp, slotOf{"endpoints-tcp-0", 0}},
		{"b", tcp, slotOf{"endpoints-tcp-0", 1}},
		{"c", tcp, slotOf{"endpoints-tcp-1", 0}}, // the next map
		{"a", tcp, slotOf{"endpoints-tcp-0", 0}}, // kept
		{"d", udp, slotOf{"endpoints-udp-0", 0}}, // protocols count apart
	} {
		if got := slot(s, tc.chain, tc.proto); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.chain, got, tc.want)
		}
	}
	if got := len(s.NewMaps(nft.IPv4)); got != 3 {
		t.Errorf("%d new maps, want 3", got)
	}
	if got := len(s.NewMaps(nft.IPv4)); got != 0 {
		t.Errorf("%d new maps again, want 0", got)
	}

	// A released slot is reused only after Commit, smallest first.
	s.Release("b")
	s.Release("a")
	s.Release("nope")
	if got := slot(s, "e", tcp); got != (slotOf{"endpoints-tcp-1", 1}) {
		t.Errorf("before Commit: e got %v, want a new slot", got)
	}
	s.Commit()
	if got := slot(s, "f", tcp); got != (slotOf{"endpoints-tcp-0", 0}) {
		t.Errorf("after Commit: f got %v, want a's", got)
	}
	if got := slot(s, "g", tcp); got != (slotOf{"endpoints-tcp-0", 1}) {
		t.Errorf("after Commit: g got %v, want b's", got)
	}
	if got := slot(s, "h", tcp); got != (slotOf{"endpoints-tcp-2", 0}) {
		t.Errorf("h got %v, want a new map", got)
	}
}

// TestSlotsSeed: slots read back are kept; holes below them are reused;
// what cannot be ours is refused; seeded chains nobody asks for give their
// slot up.
func TestSlotsSeed(t *testing.T) {
	s := newSlots(4)
	for _, tc := range []struct {
		chain string
		es    nft.EndpointsSlot
		ok    bool
	}{
		{"a", nft.EndpointsSlot{Map: "endpoints-tcp-1", Slot: 2}, true}, // index 6
		{"b", nft.EndpointsSlot{Map: "endpoints-tcp-0", Slot: 1}, true},
		{"c", nft.EndpointsSlot{Map: "endpoints-tcp-0", Slot: 1}, false}, // b's
		{"d", nft.EndpointsSlot{Map: "endpoints-tcp-0", Slot: 4}, false}, // beyond the map
		{"e", nft.EndpointsSlot{Map: "endpoints-icmp-0", Slot: 0}, false},
		{"f", nft.EndpointsSlot{Map: "endpoints-tcp-01", Slot: 0}, false},
		{"g", nft.EndpointsSlot{Map: "other", Slot: 0}, false},
		{"h", nft.EndpointsSlot{Map: "endpoints-udp-0", Slot: 3}, true},
	} {
		if got := s.Seed(tc.chain, tc.es); got != tc.ok {
			t.Errorf("Seed(%s, %v) = %v, want %v", tc.chain, tc.es, got, tc.ok)
		}
	}
	s.Settle()
	tcp := nft.ProtoTCP
	if got := slot(s, "a", tcp); got != (slotOf{"endpoints-tcp-1", 2}) {
		t.Errorf("a: %v, want its seeded slot", got)
	}
	// Free below the highest seeded index (6): 0, 2, 3, 4, 5 in order.
	for _, want := range []slotOf{{"endpoints-tcp-0", 0}, {"endpoints-tcp-0", 2}, {"endpoints-tcp-0", 3},
		{"endpoints-tcp-1", 0}, {"endpoints-tcp-1", 1}, {"endpoints-tcp-1", 3}} {
		if got := slot(s, "new-"+want.m+string(rune('0'+want.slot)), tcp); got != want {
			t.Errorf("new chain got %v, want %v", got, want)
		}
	}
	// b and h were never asked for.
	s.ReleaseUnclaimed()
	s.Commit()
	if got := slot(s, "later", tcp); got != (slotOf{"endpoints-tcp-0", 1}) {
		t.Errorf("later: %v, want b's slot", got)
	}
	if got := slot(s, "later-udp", nft.ProtoUDP); got != (slotOf{"endpoints-udp-0", 0}) {
		t.Errorf("later-udp: %v", got)
	}
}

// TestCanonicalSlots: two tables that differ only in their chains' slots
// compare equal after CanonicalSlots, and not if an endpoint differs.
func TestCanonicalSlots(t *testing.T) {
	st := bigState(5)
	a := Build(testConfig, nft.IPv4, st)
	slots := NewSlots()
	slots.Slot("x", nft.ProtoTCP) // shifts every slot by one
	b := BuildSlots(testConfig, nft.IPv4, st, slots)
	if a.Dump() == b.Dump() {
		t.Fatal("the two builds are equal: the test tests nothing")
	}
	if CanonicalSlots(a).Dump() != CanonicalSlots(b).Dump() {
		t.Errorf("canonical forms differ:\n%s\n%s", CanonicalSlots(a).Dump(), CanonicalSlots(b).Dump())
	}
	st[2].Endpoints[1] = netip.MustParseAddrPort("10.244.9.9:1")
	c := Build(testConfig, nft.IPv4, st)
	if CanonicalSlots(a).Dump() == CanonicalSlots(c).Dump() {
		t.Error("an endpoint change is lost in the canonical form")
	}
}

// TestReleaseGone: a chain that goes, or stops picking through its slot
// (session affinity), gives the slot up; one that stays keeps it.
func TestReleaseGone(t *testing.T) {
	st := bigState(3)
	for i := range st { // a ClusterIP alone picks through a pick map, not a slot
		st[i].ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})}
	}
	slots := NewSlots()
	old := ServiceFragment(testConfig, st, slots)
	st[1].AffinityTimeout = 3 * time.Hour
	now := ServiceFragment(testConfig, st[1:], slots) // st[0] gone, st[1] sticky, st[2] as it was
	slots.ReleaseGone(old, now)
	slots.Commit()
	var got []slotOf
	for i := range 3 {
		got = append(got, slot(slots, "new-"+strconv.Itoa(i), nft.ProtoTCP))
	}
	want := []slotOf{{"endpoints-tcp-0", 0}, {"endpoints-tcp-0", 1}, {"endpoints-tcp-0", 3}}
	if !slices.Equal(got, want) {
		t.Errorf("slots after the release: %v, want %v", got, want)
	}
}
