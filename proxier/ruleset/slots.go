package ruleset

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/nft"
)

// SlotsPerMap is how many slots (one per chain that picks endpoints) an
// endpoints map holds. The kernel's cost of adding or removing an element
// of an interval map grows with the map's size, while creating maps costs
// more the more there are; 64 keeps both small (docs/code-figures.md).
const SlotsPerMap = 64

// Slots assigns endpoints-map slots (nft.DNATMap) to the chains that pick
// endpoints through one: per transport protocol, slot index i is slot
// i % SlotsPerMap of map endpoints-<proto>-<i / SlotsPerMap>. A chain
// keeps its slot while it exists; a released slot is reused only after
// the transaction that empties it (Commit), so that no transaction both
// removes one chain's ranges from a slot and adds another's.
//
// Slots is the builder's only state; it makes ServiceFragment
// deterministic for a chain that already has a slot, which is what lets
// the proxier rebuild a Service's old fragment to replace it.
type Slots struct {
	perMap   int
	byChain  map[string]slotIndex
	used     map[uint8]int        // per protocol: indexes handed out so far (maps exist below it)
	free     map[uint8][]int      // released and committed: reusable, smallest last
	released []slotIndex          // since the last Commit
	shown    map[uint8]int        // per protocol: maps NewMaps returned
	seeded   map[string]bool      // seeded chains no Slot call asked for yet
	held     map[slotIndex]bool   // slots seeded since the last Settle
	names    map[slotIndex]string // map names, one string per map (index: the map's)
	picks    picks                // pick maps (picks.go)
}

type slotIndex struct {
	proto uint8
	index int
}

// NewSlots returns an empty slot table with SlotsPerMap slots per map.
func NewSlots() *Slots { return newSlots(SlotsPerMap) }

func newSlots(perMap int) *Slots {
	return &Slots{perMap: perMap, byChain: map[string]slotIndex{}, used: map[uint8]int{}, free: map[uint8][]int{},
		shown: map[uint8]int{}, seeded: map[string]bool{}, held: map[slotIndex]bool{}, names: map[slotIndex]string{},
		picks: newPicks()}
}

// EndpointsMapName is the name of endpoints map i of a protocol.
func EndpointsMapName(proto uint8, i int) string {
	return fmt.Sprintf("endpoints-%s-%d", nft.ProtoName(proto), i)
}

// Slot returns the endpoints map and slot of a chain that picks endpoints
// of proto, assigning one if it has none.
func (s *Slots) Slot(chain string, proto uint8) (string, uint16) {
	delete(s.seeded, chain)
	si, ok := s.byChain[chain]
	if !ok || si.proto != proto {
		si = slotIndex{proto: proto, index: s.take(proto)}
		s.byChain[chain] = si
	}
	return s.mapName(proto, si.index/s.perMap), uint16(si.index % s.perMap)
}

// mapName is EndpointsMapName, shared by every chain of the map.
func (s *Slots) mapName(proto uint8, i int) string {
	k := slotIndex{proto, i}
	n, ok := s.names[k]
	if !ok {
		n = EndpointsMapName(proto, i)
		s.names[k] = n
	}
	return n
}

func (s *Slots) take(proto uint8) int {
	if f := s.free[proto]; len(f) > 0 {
		i := f[len(f)-1]
		s.free[proto] = f[:len(f)-1]
		return i
	}
	i := s.used[proto]
	s.used[proto]++
	return i
}

// Release gives a chain's slot up, if it has one; it is reused after the
// next Commit.
func (s *Slots) Release(chain string) {
	if si, ok := s.byChain[chain]; ok {
		delete(s.byChain, chain)
		s.released = append(s.released, si)
	}
}

// ReleaseGone releases the slots of the chains of old that now (either
// may be nil) no longer has, or has without an endpoints-map rule (the
// Service switched to session affinity), and the room in pick maps of
// the ClusterIP ports old has there and now has not.
func (s *Slots) ReleaseGone(old, now *nft.Fragment) {
	if old == nil {
		return
	}
	s.picks.releaseGone(old, now)
	for _, c := range old.Chains {
		if _, ok := s.byChain[c.Name]; !ok || usesSlot(now, c.Name) {
			continue
		}
		s.Release(c.Name)
	}
}

// usesSlot reports whether fr has the chain with a DNATMap rule.
func usesSlot(fr *nft.Fragment, name string) bool {
	if fr == nil {
		return false
	}
	for _, c := range fr.Chains {
		if c.Name != name {
			continue
		}
		for _, r := range c.Rules {
			for _, p := range r.Phrases {
				if _, ok := p.(nft.DNATMap); ok {
					return true
				}
			}
		}
	}
	return false
}

// Commit makes the slots released since the last Commit reusable: call it
// once the transaction that removed their chains and ranges is applied.
func (s *Slots) Commit() {
	for _, si := range s.released {
		s.free[si.proto] = append(s.free[si.proto], si.index)
	}
	s.released = s.released[:0]
	for proto, f := range s.free {
		sort.Sort(sort.Reverse(sort.IntSlice(f))) // the smallest is taken first
		s.free[proto] = f
	}
}

// Seed gives chain the slot a table read back from the kernel shows it
// using (nft.LoadedRules.Slots), so that the chain, its rule and its
// ranges stay as they are. It reports false, and assigns nothing, for a
// map name that is not one of ours, a slot beyond the map's, or a slot
// another chain holds. Seed every loaded chain before any Slot call, then
// call Settle.
func (s *Slots) Seed(chain string, es nft.EndpointsSlot) bool {
	proto, m, ok := parseMapName(es.Map)
	if !ok || int(es.Slot) >= s.perMap {
		return false
	}
	si := slotIndex{proto: proto, index: m*s.perMap + int(es.Slot)}
	if s.held[si] {
		return false
	}
	s.held[si] = true
	s.byChain[chain] = si
	s.seeded[chain] = true
	s.used[proto] = max(s.used[proto], si.index+1)
	return true
}

// EndpointsMap returns, empty, endpoints map name as a Slots with
// SlotsPerMap slots per map defines it, and false for a name that is not
// one EndpointsMapName makes.
func EndpointsMap(f nft.Family, name string) (*nft.Set, bool) {
	proto, i, ok := parseMapName(name)
	if !ok {
		return nil, false
	}
	return NewSlots().endpointsMap(f, proto, i), true
}

// parseMapName inverts EndpointsMapName.
func parseMapName(name string) (proto uint8, i int, ok bool) {
	for _, p := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
		rest, found := strings.CutPrefix(name, "endpoints-"+nft.ProtoName(p)+"-")
		if !found {
			continue
		}
		i, err := strconv.Atoi(rest)
		if err != nil || i < 0 || EndpointsMapName(p, i) != name {
			return 0, 0, false
		}
		return p, i, true
	}
	return 0, 0, false
}

// ReleaseUnclaimed releases the slots of seeded chains that no Slot call
// asked for: chains read back that the table no longer has (their ranges
// go with them); and so the room of seeded ClusterIP ports in pick maps
// (SeedPicks). Call it once every fragment of the sync is built.
func (s *Slots) ReleaseUnclaimed() {
	for chain := range s.seeded {
		s.Release(chain)
	}
	clear(s.seeded)
	s.picks.releaseUnclaimed()
}

// Settle makes the slots below each protocol's highest seeded one that no
// chain holds reusable.
func (s *Slots) Settle() {
	for proto, n := range s.used {
		var f []int
		for i := n - 1; i >= 0; i-- {
			if !s.held[slotIndex{proto, i}] {
				f = append(f, i)
			}
		}
		s.free[proto] = f
	}
	clear(s.held)
}

// Maps returns the endpoints maps of family f that hold the slots handed
// out so far, and the pick maps handed out, in name order.
func (s *Slots) Maps(f nft.Family) []*nft.Set {
	var out []*nft.Set
	for _, proto := range []uint8{nft.ProtoSCTP, nft.ProtoTCP, nft.ProtoUDP} {
		for i := range s.maps(proto) {
			out = append(out, s.endpointsMap(f, proto, i))
		}
	}
	for _, sh := range s.picks.all() {
		out = append(out, sh.set(f))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// NewMaps returns the endpoints maps that Maps has and that no earlier
// NewMaps call returned: add them to the table before a fragment that
// uses them.
func (s *Slots) NewMaps(f nft.Family) []*nft.Set {
	var out []*nft.Set
	for _, proto := range []uint8{nft.ProtoSCTP, nft.ProtoTCP, nft.ProtoUDP} {
		for i := s.shown[proto]; i < s.maps(proto); i++ {
			out = append(out, s.endpointsMap(f, proto, i))
		}
		s.shown[proto] = max(s.shown[proto], s.maps(proto))
	}
	for _, sh := range s.picks.takeUnseen() {
		out = append(out, sh.set(f))
	}
	return out
}

func (s *Slots) maps(proto uint8) int { return (s.used[proto] + s.perMap - 1) / s.perMap }

func (s *Slots) endpointsMap(f nft.Family, proto uint8, i int) *nft.Set {
	m := nft.NewEndpointsMap(f, EndpointsMapName(proto, i), proto)
	m.Comment = fmt.Sprintf("%s endpoints: slots of chains %d-%d", nft.ProtoName(proto), i*s.perMap, (i+1)*s.perMap-1)
	return m
}

// CanonicalSlots returns a copy of a table with its endpoints slots
// assigned afresh: per protocol in the order of the chains' names, with
// exactly the maps those need; and its ClusterIP ports put in pick maps
// afresh, in the order of their addresses and ports (canonicalPicks). Two
// tables that differ only in which slots their chains hold and which pick
// maps their ports are in (a table kept up incrementally, where released
// room is reused, and one built at once) compare equal after it. For
// tests and tools.
func CanonicalSlots(rs *nft.Ruleset) *nft.Ruleset {
	out := rs.Clone()
	canonicalPicks(out)
	type user struct {
		chain string
		rule  int
		d     nft.DNATMap
	}
	var users []user
	for name, c := range out.Chains {
		for i, r := range c.Rules {
			if len(r.Phrases) == 1 {
				if d, ok := r.Phrases[0].(nft.DNATMap); ok {
					users = append(users, user{name, i, d})
				}
			}
		}
	}
	sort.Slice(users, func(i, j int) bool { return users[i].chain < users[j].chain })
	endpoints := make([][]netip.AddrPort, len(users))
	comments := make([]string, len(users))
	for i, u := range users {
		endpoints[i] = nft.SlotEndpoints(out.Sets[u.d.Map], u.d.Slot)
		comments[i] = slotComment(out.Sets[u.d.Map], u.d.Slot)
	}
	counters := CountNone
	for name, s := range out.Sets {
		if s.EndpointsProto != 0 {
			if s.Counter {
				counters = CountEndpoints // a proxier counts all its endpoints maps or none
			}
			delete(out.Sets, name)
		}
	}
	slots := NewSlots()
	for i, u := range users {
		m, slot := slots.Slot(u.chain, u.d.Proto)
		c := out.Chains[u.chain]
		rules := append([]nft.Rule(nil), c.Rules...)
		rules[u.rule] = nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: u.d.Proto, Map: m, Slot: slot}}, Comment: rules[u.rule].Comment}
		cc := *c
		cc.Rules = rules
		out.Chains[u.chain] = &cc
		for _, s := range slots.NewMaps(rs.Family) {
			out.AddSet(counters.EndpointsMap(s))
		}
		for _, e := range nft.EndpointsElements(slot, endpoints[i]) {
			e.Comment = comments[i]
			out.AddElement(m, e)
		}
	}
	return out
}

// slotComment is the comment of the elements of an endpoints map's slot
// (they all have the Service port's, or none: see AddEndpointsElements).
func slotComment(s *nft.Set, slot uint16) string {
	if s == nil {
		return ""
	}
	for e := range s.Elements.All() {
		if nft.ElementSlot(e) == uint32(slot) {
			return e.Comment
		}
	}
	return ""
}
