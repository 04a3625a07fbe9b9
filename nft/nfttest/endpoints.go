package nfttest

import (
	"net/netip"

	"github.com/nftproxy/nftproxy/nft"
)

// EndpointsMapName is the name SlotTable gives the endpoints map of a protocol.
func EndpointsMapName(proto uint8) string { return "endpoints-" + nft.ProtoName(proto) }

// SlotTable is a small table of the slot shape: the Services' vmap in
// prerouting, and one endpoints map per protocol.
func SlotTable(f nft.Family) *nft.Ruleset {
	rs := nft.NewRuleset(f)
	rs.AddSet(&nft.Set{Name: "services", Key: []nft.DataType{f.AddrType(), nft.TypeInetProto, nft.TypeInetService}, Data: []nft.DataType{nft.TypeVerdict}})
	rs.AddChain(&nft.Chain{Name: "nat-prerouting", Base: &nft.BaseChain{Type: nft.ChainNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT},
		Rules: []nft.Rule{{Phrases: []nft.Phrase{nft.VmapLookup{Fields: []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}, Map: "services"}}}}})
	for _, proto := range []uint8{nft.ProtoTCP, nft.ProtoUDP} {
		rs.AddSet(nft.NewEndpointsMap(f, EndpointsMapName(proto), proto))
	}
	return rs
}

// AddSlotService adds a Service port's chain (one DNATMap rule on its
// slot), its vmap element and its endpoints' ranges.
func AddSlotService(rs *nft.Ruleset, name string, proto uint8, svc netip.Addr, port uint16, slot uint16, eps []netip.AddrPort) {
	rs.AddChain(&nft.Chain{Name: name, Rules: []nft.Rule{{Phrases: []nft.Phrase{nft.DNATMap{Proto: proto, Map: EndpointsMapName(proto), Slot: slot}}}}})
	rs.AddElement("services", nft.Element{Key: []nft.Datum{nft.Addr(svc), nft.Int(uint32(proto)), nft.Int(uint32(port))},
		Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: name}})
	for _, e := range nft.EndpointsElements(slot, eps) {
		rs.AddElement(EndpointsMapName(proto), e)
	}
}
