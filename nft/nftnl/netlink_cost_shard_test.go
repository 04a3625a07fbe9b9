package nftnl

// The slot shape nftproxy writes (endpoints maps of ruleset.SlotsPerMap
// slots, one DNATMap rule per Service chain): what a cold start, an
// endpoint change, a new Service and one plain element cost the kernel.

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
	"github.com/nftproxy/nftproxy/proxier/ruleset"

	"fmt"
	"net/netip"
	"testing"
	"time"
)

func BenchmarkKernelSlotShape(b *testing.B) { benchBeds(b, slotShapeBed) }

// shapeSProtos are the protocols with endpoints maps in every shard.
func shapeSProtos() []uint8 { return []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} }

// shapeSRuleset is the table of BenchmarkKernelSlotShape: realisticRuleset's
// shared part, endpoints maps of perMap slots each, and per Service a
// chain with one DNATMap rule on its slot, reached through service-ips.
func shapeSRuleset(f nft.Family, perMap int, svcs []nfttest.Service) *nft.Ruleset {
	rs := nfttest.RealisticRuleset(f, nil)
	for m := range (len(svcs)+perMap-1)/perMap + 1 {
		for _, proto := range shapeSProtos() {
			rs.AddSet(nft.NewEndpointsMap(f, slotMapName(proto, m), proto))
		}
	}
	for _, s := range svcs {
		addShapeSService(rs, perMap, s)
	}
	return rs
}

func slotMapName(proto uint8, i int) string {
	return fmt.Sprintf("endpoints-%s-%d", nft.ProtoName(proto), i)
}

// slotOf is the endpoints map and slot of Service s.
func slotOf(perMap int, s nfttest.Service) (string, uint16) {
	return slotMapName(nft.ProtoTCP, s.Index/perMap), uint16(s.Index % perMap)
}

// addShapeSService adds one Service: its chain, ClusterIP, service-ips
// element, ranges and hairpin elements.
func addShapeSService(rs *nft.Ruleset, perMap int, s nfttest.Service) {
	rs.AddElement("cluster-ips", nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP)}})
	if len(s.Backends) == 0 {
		rs.AddElement("no-endpoint-services", nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)}, Comment: s.Name(),
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "reject-chain"}})
		return
	}
	m, slot := slotOf(perMap, s)
	rs.AddChain(&nft.Chain{Name: s.Chain(), Rules: []nft.Rule{{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoTCP, Map: m, Slot: slot}}}}})
	rs.AddElement("service-ips", nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)}, Comment: s.Name(),
		Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: s.Chain()}})
	for _, e := range nft.EndpointsElements(slot, s.Backends) {
		rs.AddElement(m, e)
	}
	for _, e := range costHairpin(s.Backends) {
		rs.AddElement("hairpin-connections", e)
	}
}

// slotShapeBed writes the slot shape's table of sz in one batch.
func slotShapeBed(b *testing.B, sz benchSize) *costBed {
	f := nft.IPv4
	n := newTestNS(b).netlink(b)
	svcs := nfttest.MakeServices(f, sz.services, sz.endpoints)
	rs := shapeSRuleset(f, ruleset.SlotsPerMap, svcs)
	cold, err := costTx(n, nft.Diff(nil, rs))
	if err != nil {
		b.Fatal(err)
	}
	bed := &costBed{build: []costPhase{{"cold", cold}}}
	tx := func(ops ...nft.Op) func() (time.Duration, error) {
		return func() (time.Duration, error) { return costTx(n, &nft.Transaction{Family: f, Ops: ops}) }
	}
	k := len(svcs) / 2
	if len(svcs[k].Backends) == 0 {
		k++
	}
	sk := svcs[k]
	mName, slot := slotOf(ruleset.SlotsPerMap, sk)
	m, hp := rs.Sets[mName], rs.Sets["hairpin-connections"]
	change := func(from, to []netip.AddrPort) func() (time.Duration, error) {
		return tx(nft.Op{Kind: nft.OpDeleteElements, Set: m, Elements: nft.EndpointsElements(slot, from)},
			nft.Op{Kind: nft.OpDeleteElements, Set: hp, Elements: costHairpin(from)},
			nft.Op{Kind: nft.OpAddElements, Set: m, Elements: nft.EndpointsElements(slot, to)},
			nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: costHairpin(to)})
	}
	alt := costAltBackends(k, sz.endpoints)
	more := append(costAltBackends(k, sz.endpoints+1)[:1:1], sk.Backends...)
	// A new Service in the last map's next free slot: chain, rule,
	// service-ips and cluster-ips elements, ranges (the vmap element's goto
	// makes the kernel validate the table).
	ns1 := nfttest.MakeService(f, len(svcs), sz.endpoints)
	for len(ns1.Backends) == 0 {
		ns1 = nfttest.MakeService(f, ns1.Index+1, sz.endpoints)
	}
	withNew := rs.Clone()
	addShapeSService(withNew, ruleset.SlotsPerMap, ns1)
	hpElem := nft.Element{Key: []nft.Datum{nft.Addr(sk.Backends[0].Addr()), nft.Addr(sk.Backends[0].Addr()), nfttest.TCP, nft.Int(9999)}}
	bed.changes = []costChange{
		{"endpoint-change", change(sk.Backends, alt), change(alt, sk.Backends)},
		{fmt.Sprintf("scale-up-%d", sz.endpoints+1), change(sk.Backends, more), change(more, sk.Backends)},
		{"new-service", tx(nft.Diff(rs, withNew).Ops...), tx(nft.Diff(withNew, rs).Ops...)},
		{"hairpin-element", tx(nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: []nft.Element{hpElem}}),
			tx(nft.Op{Kind: nft.OpDeleteElements, Set: hp, Elements: []nft.Element{hpElem}})},
	}
	return bed
}
