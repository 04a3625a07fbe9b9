package ruleset

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/nftproxy/nftproxy/nft"
)

// PickMapElements bounds a pick map's elements: the ClusterIP ports with
// N endpoints fill a map with room for PickMapElements/N of them, then
// the next. The kernel lists a hash map in pieces, each of which walks
// the map from its start, so that reading a map back (a restart) costs
// the square of its size; the cost of changing an element does not grow
// with it (docs/code-figures.md).
const PickMapElements = 4096

// pickGroup is the pick maps of a protocol and number of endpoints.
type pickGroup struct {
	proto uint8
	n     int
}

// capacity is how many ClusterIP ports a pick map of g holds.
func (g pickGroup) capacity() int { return max(1, PickMapElements/g.n) }

// compare orders groups by protocol, then number of endpoints.
func (g pickGroup) compare(o pickGroup) int {
	return cmp.Or(cmp.Compare(g.proto, o.proto), cmp.Compare(g.n, o.n))
}

// pickHolder is a ClusterIP port with room in a pick map of its group.
// A Service whose number of endpoints changes holds room in two groups
// until its old fragment is released (ReleaseGone): the proxier rebuilds
// that fragment after building the new one.
type pickHolder struct {
	group pickGroup
	addr  netip.Addr
	port  uint16
}

// pickShard is one pick map of a group and the chain of its DNATPick rule.
type pickShard struct {
	group    pickGroup
	i        int // index in its group
	m, chain string
	holders  int
}

func (sh *pickShard) set(f nft.Family) *nft.Set {
	m := nft.NewPickMap(f, sh.m, sh.group.proto, uint32(sh.group.n))
	m.Comment = fmt.Sprintf("%s ClusterIPs with %d endpoints", nft.ProtoName(sh.group.proto), sh.group.n)
	if sh.group.n == 1 {
		m.Comment = nft.ProtoName(sh.group.proto) + " ClusterIPs with 1 endpoint"
	}
	return m
}

// picks assigns ClusterIP ports to pick maps. A port keeps its map while
// it holds room there, so that a change of its endpoints that keeps their
// number is element work in that map only.
type picks struct {
	shards    map[pickGroup][]*pickShard // by index; nil where none is
	byMap     map[string]*pickShard
	held      map[pickHolder]*pickShard
	unclaimed map[pickHolder]bool // seeded, not asked for since
	changed   bool                // maps added or dropped since UpdatePicks
	// room is, per group, an index below which no map has room: Pick
	// looks for room from there, not from the first map of hundreds.
	room map[pickGroup]int
	// unseen are the maps added since Slots.NewMaps last returned them:
	// a sync asks for new maps after every Service.
	unseen []*pickShard
}

func newPicks() picks {
	return picks{shards: map[pickGroup][]*pickShard{}, byMap: map[string]*pickShard{},
		held: map[pickHolder]*pickShard{}, unclaimed: map[pickHolder]bool{}, room: map[pickGroup]int{}}
}

// PickMapName is the name of pick map i of the ClusterIP ports of a
// protocol with n endpoints.
func PickMapName(proto uint8, n, i int) string {
	return fmt.Sprintf("endpoints-%s-n%d-%d", nft.ProtoName(proto), n, i)
}

// PickChainName is the name of the chain of the DNATPick rule on pick map
// i of a protocol with n endpoints.
func PickChainName(proto uint8, n, i int) string {
	return fmt.Sprintf("pick-%s-%d-%d", nft.ProtoName(proto), n, i)
}

// parsePickMapName inverts PickMapName.
func parsePickMapName(name string) (g pickGroup, i int, ok bool) {
	for _, p := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
		rest, found := strings.CutPrefix(name, "endpoints-"+nft.ProtoName(p)+"-n")
		if !found {
			continue
		}
		ns, is, found := strings.Cut(rest, "-")
		n, err1 := strconv.Atoi(ns)
		i, err2 := strconv.Atoi(is)
		if !found || err1 != nil || err2 != nil || n < 1 || n > nft.MaxPickEndpoints || i < 0 ||
			PickMapName(p, n, i) != name {
			return pickGroup{}, 0, false
		}
		return pickGroup{p, n}, i, true
	}
	return pickGroup{}, 0, false
}

// Pick returns the pick map and the chain that send connections to
// ClusterIP port addr:port of proto to one of its n endpoints
// (1 ≤ n ≤ nft.MaxPickEndpoints): the map the port holds room in, else the
// first of its group with room, created if none has.
func (s *Slots) Pick(proto uint8, n int, addr netip.Addr, port uint16) (m, chain string) {
	p := &s.picks
	h := pickHolder{pickGroup{proto, n}, addr, port}
	delete(p.unclaimed, h)
	if sh := p.held[h]; sh != nil {
		return sh.m, sh.chain
	}
	shards := p.shards[h.group]
	i := min(p.room[h.group], len(shards))
	for i < len(shards) && shards[i] != nil && shards[i].holders >= h.group.capacity() {
		i++
	}
	p.room[h.group] = i
	if i == len(shards) {
		shards = append(shards, nil)
		p.shards[h.group] = shards
	}
	sh := shards[i]
	if sh == nil {
		sh = p.add(h.group, i)
	}
	sh.holders++
	p.held[h] = sh
	return sh.m, sh.chain
}

// add creates shard i of group g.
func (p *picks) add(g pickGroup, i int) *pickShard {
	sh := &pickShard{group: g, i: i, m: PickMapName(g.proto, g.n, i), chain: PickChainName(g.proto, g.n, i)}
	for len(p.shards[g]) <= i {
		p.shards[g] = append(p.shards[g], nil)
	}
	p.shards[g][i] = sh
	p.byMap[sh.m] = sh
	p.changed = true
	p.unseen = append(p.unseen, sh)
	return sh
}

func (p *picks) release(h pickHolder) {
	if sh := p.held[h]; sh != nil {
		sh.holders--
		delete(p.held, h)
		p.room[sh.group] = min(p.room[sh.group], sh.i)
	}
}

// takeUnseen returns the maps added since it was last called that are
// still there, by protocol, number of endpoints and index.
func (p *picks) takeUnseen() []*pickShard {
	out := slices.DeleteFunc(p.unseen, func(sh *pickShard) bool { return p.byMap[sh.m] != sh })
	p.unseen = nil
	slices.SortFunc(out, func(a, b *pickShard) int { return cmp.Or(a.group.compare(b.group), cmp.Compare(a.i, b.i)) })
	return out
}

// releaseGone releases the room of the ClusterIP ports that have pick
// elements in old and none in the same map in now (either may be nil).
func (p *picks) releaseGone(old, now *nft.Fragment) {
	kept := p.holdersIn(now)
	for _, h := range p.holdersIn(old) {
		if !slices.Contains(kept, h) {
			p.release(h)
		}
	}
}

// holdersIn returns the ClusterIP ports with pick elements in fr (their
// first endpoint's element), with their map's group.
func (p *picks) holdersIn(fr *nft.Fragment) []pickHolder {
	if fr == nil {
		return nil
	}
	var out []pickHolder
	for _, se := range fr.Elements {
		sh, k := p.byMap[se.Set], se.Element.Key
		if sh != nil && len(k) == 3 && k[2].Int == 0 {
			out = append(out, pickHolder{sh.group, k[0].Addr, uint16(k[1].Int)})
		}
	}
	return out
}

// releaseUnclaimed releases the room of the seeded ports no Pick asked for.
func (p *picks) releaseUnclaimed() {
	for h := range p.unclaimed {
		p.release(h)
	}
	clear(p.unclaimed)
}

// SeedPicks takes over the pick maps of a table read back from the
// kernel: each ClusterIP port keeps the map it has elements in, so that
// neither its elements nor its service-ips element change. Maps whose
// names or definitions are not ours are left out (the editor removes
// them). Seed before any Pick; the ports no Pick asks for are released
// by ReleaseUnclaimed.
func (s *Slots) SeedPicks(f nft.Family, loaded *nft.Ruleset) {
	p := &s.picks
	for _, name := range slices.Sorted(maps.Keys(loaded.Sets)) {
		ls := loaded.Sets[name]
		g, i, ok := parsePickMapName(name)
		if !ok || ls.PickProto != g.proto || ls.PickMod != uint32(g.n) || nft.CheckPickMap(f, ls) != nil {
			continue
		}
		sh := p.add(g, i)
		for e := range ls.Elements.Scan() { // nothing is kept of an element
			if len(e.Key) != 3 || e.Key[2].Int != 0 {
				continue
			}
			h := pickHolder{g, e.Key[0].Addr, uint16(e.Key[1].Int)}
			if p.held[h] != nil {
				continue // in two maps: the first keeps it
			}
			sh.holders++
			p.held[h] = sh
			p.unclaimed[h] = true
		}
	}
}

// dropEmpty forgets the pick maps without elements in rs (the table
// being built) and returns them. The elements judge, not the count of
// ports holding room: two Services may share a ClusterIP port (the API
// server does not allocate one twice, but its objects may say so), and
// the first of them to go releases the room the other still uses.
func (p *picks) dropEmpty(f nft.Family, rs *nft.Ruleset) []*nft.Set {
	var out []*nft.Set
	for _, sh := range p.all() {
		if m := rs.Sets[sh.m]; m != nil && m.Elements.Len() > 0 {
			continue
		}
		out = append(out, sh.set(f))
		p.changed = true
		shards := p.shards[sh.group]
		shards[sh.i] = nil
		p.room[sh.group] = min(p.room[sh.group], sh.i)
		for len(shards) > 0 && shards[len(shards)-1] == nil {
			shards = shards[:len(shards)-1]
		}
		if len(shards) == 0 {
			delete(p.shards, sh.group)
			delete(p.room, sh.group)
		} else {
			p.shards[sh.group] = shards
		}
		delete(p.byMap, sh.m)
		if sh.holders > 0 {
			maps.DeleteFunc(p.held, func(_ pickHolder, in *pickShard) bool { return in == sh })
		}
	}
	return out
}

// all returns the pick maps, by protocol, number of endpoints and index.
func (p *picks) all() []*pickShard {
	groups := slices.SortedFunc(maps.Keys(p.shards), pickGroup.compare)
	var out []*pickShard
	for _, g := range groups {
		for _, sh := range p.shards[g] {
			if sh != nil {
				out = append(out, sh)
			}
		}
	}
	return out
}

// UpdatePicks brings the pick maps and their chains in ed up to date
// once a sync's Service fragments are in: it removes the maps left
// without elements, with their chains, and adds the
// chains of the maps handed out since. prev is what it returned last time
// (nil for a new editor); it returns the chains now in ed. A table kept up
// incrementally so has the pick maps a fresh build has.
func (s *Slots) UpdatePicks(f nft.Family, ed *nft.Editor, prev *nft.Fragment) *nft.Fragment {
	if gone := s.picks.dropEmpty(f, ed.Ruleset()); len(gone) > 0 {
		ed.Replace(&nft.Fragment{Sets: gone}, nil)
	}
	if prev != nil && !s.picks.changed {
		return prev // the editor would compare every chain to find none changed
	}
	s.picks.changed = false
	chains := s.PickChains()
	ed.Replace(prev, chains)
	return chains
}

// PickChains returns the chains of the pick maps, one DNATPick rule each.
func (s *Slots) PickChains() *nft.Fragment {
	fr := &nft.Fragment{}
	for _, sh := range s.picks.all() {
		fr.Chains = append(fr.Chains, &nft.Chain{Name: sh.chain,
			Rules: []nft.Rule{rule(nft.DNATPick{Proto: sh.group.proto, Map: sh.m, Mod: uint32(sh.group.n)})}})
	}
	return fr
}

// canonicalPicks puts the ClusterIP ports of rs's pick maps into maps
// afresh, in the order of their protocols, numbers of endpoints,
// addresses and ports, and points their service-ips elements at the new
// maps' chains (see CanonicalSlots).
func canonicalPicks(rs *nft.Ruleset) {
	type port struct {
		h        pickHolder
		elems    []nft.Element
		m, chain string // afresh
	}
	ports := map[pickHolder]*port{}
	oldChains := map[string]bool{}
	counters := CountNone
	for name, set := range rs.Sets {
		g, i, ok := parsePickMapName(name)
		if !ok || set.PickProto == 0 {
			continue
		}
		if set.Counter {
			counters = CountEndpoints // a proxier counts all its endpoints maps or none
		}
		for e := range set.Elements.All() {
			h := pickHolder{g, e.Key[0].Addr, uint16(e.Key[1].Int)}
			if ports[h] == nil {
				ports[h] = &port{h: h}
			}
			ports[h].elems = append(ports[h].elems, e)
		}
		delete(rs.Sets, name)
		delete(rs.Chains, PickChainName(g.proto, g.n, i))
		oldChains[PickChainName(g.proto, g.n, i)] = true
	}
	if len(oldChains) == 0 {
		return
	}
	order := slices.SortedFunc(maps.Values(ports), func(a, b *port) int {
		return cmp.Or(a.h.group.compare(b.h.group), a.h.addr.Compare(b.h.addr), cmp.Compare(a.h.port, b.h.port))
	})
	slots := NewSlots()
	for _, p := range order {
		p.m, p.chain = slots.Pick(p.h.group.proto, p.h.group.n, p.h.addr, p.h.port)
	}
	for _, m := range slots.Maps(rs.Family) {
		rs.AddSet(counters.EndpointsMap(m))
	}
	for _, p := range order {
		for _, e := range p.elems {
			rs.AddElement(p.m, e)
		}
	}
	for _, c := range slots.PickChains().Chains {
		rs.Chains[c.Name] = c
	}
	dispatch := rs.Sets[mapServiceIPs]
	if dispatch == nil {
		return
	}
	type frontend struct {
		proto uint32
		addr  netip.Addr
		port  uint16
	}
	holders := make(map[frontend]pickHolder, len(ports))
	for h := range ports {
		holders[frontend{uint32(h.group.proto), h.addr, h.port}] = h
	}
	var moved []nft.Element
	for e := range dispatch.Elements.All() {
		if e.Verdict == nil || !oldChains[e.Verdict.Chain] {
			continue
		}
		if h, ok := holders[frontend{e.Key[1].Int, e.Key[0].Addr, uint16(e.Key[2].Int)}]; ok {
			e.Verdict = gotoChain(ports[h].chain)
			moved = append(moved, e)
		}
	}
	for _, e := range moved {
		dispatch.Elements.Put(e)
	}
}
