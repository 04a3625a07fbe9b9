// Package nfttest holds rulesets for tests of the nft packages: one with
// every phrase and set shape nftproxy writes, and realistic ones of many
// Services, shaped like what proxier/ruleset builds.
package nfttest

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/nft"
)

// Addr picks the IPv4 or IPv6 form of a test address.
func Addr(f nft.Family, v4, v6 string) netip.Addr {
	if f == nft.IPv6 {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

func Prefix(f nft.Family, v4, v6 string) netip.Prefix {
	if f == nft.IPv6 {
		return netip.MustParsePrefix(v6)
	}
	return netip.MustParsePrefix(v4)
}

// Backends returns n (≤ 16) distinct backend addresses of service number
// svc: 10.128.0.0/10 in IPv4, fd00:244::<svc>:<j> in IPv6.
func Backends(f nft.Family, svc, n int, port uint16) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for j := range n {
		var a netip.Addr
		if f == nft.IPv6 {
			a = netip.MustParseAddr(fmt.Sprintf("fd00:244::%x:%x", svc, j+1))
		} else {
			k := svc*16 + j
			a = netip.AddrFrom4([4]byte{10, byte(128 + k>>16), byte(k >> 8), byte(k)})
		}
		out[j] = netip.AddrPortFrom(a, port)
	}
	return out
}

// TCP and UDP are the protocol datums of set keys.
var (
	TCP = nft.Int(uint32(nft.ProtoTCP))
	UDP = nft.Int(uint32(nft.ProtoUDP))
)

// EveryPhraseRuleset uses every phrase kind and every set shape nftproxy
// writes, with upstream kube-proxy's object names.
func EveryPhraseRuleset(f nft.Family) *nft.Ruleset {
	rs := nft.NewRuleset(f)
	everyPhraseSets(rs, f)
	everyPhraseBaseRules(rs, f)
	everyPhrasePrefixRules(rs, f)
	everyPhraseDNAT(rs, f)
	everyPhraseElements(rs, f)
	return rs
}

// PickMapsRuleset is the pick maps of EveryPhraseRuleset and the chain
// that looks them up: the part of the ruleset that nft releases read
// differently (the numgen field of their keys).
func PickMapsRuleset(f nft.Family) *nft.Ruleset {
	every := EveryPhraseRuleset(f)
	rs := nft.NewRuleset(f)
	rs.AddChain(every.Chains["pick"])
	for _, s := range every.Sets {
		if s.PickProto != 0 {
			rs.AddSet(s)
		}
	}
	return rs
}

// everyPhraseSets adds the sets and maps of every shape but endpoints maps.
func everyPhraseSets(rs *nft.Ruleset, f nft.Family) {
	at := f.AddrType()
	rs.AddSet(&nft.Set{Name: "service-ips", Key: []nft.DataType{at, nft.TypeInetProto, nft.TypeInetService},
		Data: []nft.DataType{nft.TypeVerdict}, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"})
	rs.AddSet(&nft.Set{Name: "service-nodeports", Key: []nft.DataType{nft.TypeInetProto, nft.TypeInetService},
		Data: []nft.DataType{nft.TypeVerdict}, Comment: "NodePort traffic", Counter: true})
	rs.AddSet(&nft.Set{Name: "cluster-ips", Key: []nft.DataType{at}, Comment: "Active ClusterIPs"})
	rs.AddSet(&nft.Set{Name: "nodeport-ips", Key: []nft.DataType{at}})
	rs.AddSet(&nft.Set{Name: "service-traffic", Key: []nft.DataType{at, nft.TypeInetProto, nft.TypeInetService}, Counter: true})
	rs.AddSet(&nft.Set{Name: "hairpin-connections", Key: []nft.DataType{at, at, nft.TypeInetProto, nft.TypeInetService},
		Comment: "service hairpin connections"})
	rs.AddSet(&nft.Set{Name: "affinity-ABC", Key: []nft.DataType{at}, Timeout: 10 * time.Minute, Dynamic: true, Size: 65535})
	rs.AddSet(&nft.Set{Name: "protocols", Key: []nft.DataType{nft.TypeInetProto}, Counter: true, Comment: "counted per protocol"})
}

// everyPhraseBaseRules adds the base chains, the regular ones and their
// rules but those of "prefixes".
func everyPhraseBaseRules(rs *nft.Ruleset, f nft.Family) {
	rs.AddChain(&nft.Chain{Name: "nat-prerouting", Base: &nft.BaseChain{Type: nft.ChainNAT, Hook: nft.HookPrerouting, Priority: nft.PriorityDstNAT}})
	rs.AddChain(&nft.Chain{Name: "nat-output", Base: &nft.BaseChain{Type: nft.ChainNAT, Hook: nft.HookOutput, Priority: nft.PriorityDstNAT}})
	rs.AddChain(&nft.Chain{Name: "nat-postrouting", Base: &nft.BaseChain{Type: nft.ChainNAT, Hook: nft.HookPostrouting, Priority: nft.PrioritySrcNAT}})
	rs.AddChain(&nft.Chain{Name: "filter-forward", Base: &nft.BaseChain{Type: nft.ChainFilter, Hook: nft.HookForward, Priority: nft.PriorityFilter}})
	rs.AddChain(&nft.Chain{Name: "filter-output-pre-dnat", Base: &nft.BaseChain{Type: nft.ChainFilter, Hook: nft.HookOutput, Priority: nft.PriorityPreDstNATFilter}})
	for _, name := range []string{"services", "masquerading", "cluster-ips-check", "prefixes", "svc-a", "svc-b", "svc-c", "traffic"} {
		rs.AddChain(&nft.Chain{Name: name})
	}
	rs.Append("nat-prerouting", nft.Rule{Phrases: []nft.Phrase{nft.Jump("services")}})
	rs.Append("nat-output", nft.Rule{Phrases: []nft.Phrase{nft.Jump("services")}})
	rs.Append("nat-postrouting", nft.Rule{Phrases: []nft.Phrase{nft.Jump("masquerading")}})
	rs.Append("filter-forward", nft.Rule{Phrases: []nft.Phrase{nft.MatchCtStateNew{}, nft.Jump("cluster-ips-check")}})
	rs.Append("cluster-ips-check", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "cluster-ips"}, nft.RejectTCPReset{}}})
	rs.Append("filter-output-pre-dnat", nft.Rule{Phrases: []nft.Phrase{nft.MatchCtStateNew{}, nft.Jump("cluster-ips-check")}})
	rs.Append("nat-output", nft.Rule{Phrases: []nft.Phrase{nft.MatchCtStateNew{}, nft.Jump("prefixes")}})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "cluster-ips"},
		nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: Prefix(f, "10.244.0.0/16", "fd00:244::/64"), Negate: true},
		nft.SetMarkBits{Bits: 0x4000}}, Comment: "masquerade clusterIP traffic from outside cluster"})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{
		nft.VmapLookup{Fields: []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}, Map: "service-ips"}}})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "nodeport-ips"},
		nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDstPort}, Map: "service-nodeports"}}})
	rs.Append("masquerading", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchMarkBits{Mask: 0x4000}, nft.ToggleMarkBits{Bits: 0x4000}, nft.Masquerade{}}})
	rs.Append("masquerading", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchCtStatusDNAT{},
		nft.MatchSet{Fields: []nft.Field{nft.FieldSrcAddr, nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}, Set: "hairpin-connections"},
		nft.Masquerade{}}})
	rs.Append("traffic", nft.Rule{Phrases: []nft.Phrase{nft.MatchCtDirection{Reply: true}, nft.MatchCtStatusDNAT{},
		nft.MatchSet{Fields: []nft.Field{nft.FieldSrcAddr, nft.FieldL4Proto, nft.FieldSrcPort}, Set: "service-traffic"}}})
	rs.Append("traffic", nft.Rule{Phrases: []nft.Phrase{nft.MatchCtDirection{},
		nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}, Set: "service-traffic"}}})
	rs.Append("traffic", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: Prefix(f, "127.0.0.0/8", "::1/128")},
		nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDstPort}, Map: "service-nodeports"}}})
	rs.Append("traffic", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchSet{Fields: []nft.Field{nft.FieldL4Proto}, Set: "protocols"}, nft.Goto("svc-c")}})
	rs.Append("cluster-ips-check", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "cluster-ips"}, nft.Reject{}},
		Comment: "Reject traffic to invalid ports of ClusterIPs"})
	rs.Append("cluster-ips-check", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: Prefix(f, "10.96.0.0/12", "fd00:96::/108")}, nft.Drop()},
		Comment: "Drop traffic to unallocated ClusterIPs"})
}

// everyPhrasePrefixRules adds the rules of "prefixes": every match.
func everyPhrasePrefixRules(rs *nft.Ruleset, f nft.Family) {
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: Prefix(f, "10.0.0.1/32", "fd00::1/128"), Negate: true},
		nft.VerdictPhrase{Verdict: nft.Verdict{Kind: nft.VerdictAccept}}}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: Prefix(f, "10.10.1.0/24", "fd00:10:1::/60")}, nft.Goto("svc-a")}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: Prefix(f, "192.168.0.0/23", "fd00:10:2::/48")},
		nft.MatchSet{Fields: []nft.Field{nft.FieldSrcAddr, nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}, Set: "hairpin-connections", Negate: true},
		nft.VerdictPhrase{Verdict: nft.Verdict{Kind: nft.VerdictReturn}}}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchSet{Fields: []nft.Field{nft.FieldSrcAddr}, Set: "affinity-ABC", Negate: true}, nft.Jump("svc-b")}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{nft.MatchFibLocal{Field: nft.FieldDstAddr},
		nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: Prefix(f, "127.0.0.0/8", "::1/128"), Negate: true},
		nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDstPort}, Map: "service-nodeports"}}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{nft.MatchFibLocal{Field: nft.FieldSrcAddr}, nft.Goto("svc-a")}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{nft.UpdateSet{Field: nft.FieldSrcAddr, Set: "affinity-ABC"}, nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.DNAT{To: Backends(f, 4, 1, 8080)[0]}}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{nft.MatchIifname{Name: "cbr0"}, nft.Goto("svc-a")}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{nft.MatchIifname{Name: "veth", Prefix: true}, nft.Goto("svc-a")}})
	rs.Append("prefixes", nft.Rule{Phrases: []nft.Phrase{nft.MatchIifname{Name: "veth", Prefix: true, Negate: true}, nft.SetMarkBits{Bits: 0x4000}}})
}

// everyPhraseDNAT adds the DNAT cascades and the endpoints maps with their
// DNATMap rules and elements.
func everyPhraseDNAT(rs *nft.Ruleset, f nft.Family) {
	// Cascades of 2, 1 and 12 Backends: the last rule of each is an
	// unguarded DNAT, svc-b has only that one.
	rs.Chains["svc-a"].Rules = DNATCascade(nft.ProtoTCP, Backends(f, 1, 2, 8080))
	rs.Chains["svc-b"].Rules = DNATCascade(nft.ProtoUDP, Backends(f, 2, 1, 53))
	rs.Chains["svc-c"].Rules = DNATCascade(nft.ProtoSCTP, Backends(f, 3, 12, 9999))

	// Shape s: endpoints maps per protocol and a chain of DNATMap rules.
	shardN := uint32(10)
	shard := fmt.Sprintf("shard-%d", shardN)
	epMap := func(proto uint8) string { return fmt.Sprintf("endpoints-%s-%d", nft.ProtoName(proto), shardN) }
	for _, proto := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
		m := rs.AddSet(nft.NewEndpointsMap(f, epMap(proto), proto))
		if proto == nft.ProtoUDP {
			m.Comment = "UDP endpoints of " + shard
			m.Counter = true
		}
	}
	rs.AddChain(&nft.Chain{Name: shard})
	// Slots: TCP's the shard number, UDP's 0 (nft prints no offset), SCTP's
	// the last one.
	slots := map[uint8]uint16{nft.ProtoTCP: uint16(shardN), nft.ProtoUDP: 0, nft.ProtoSCTP: nft.EndpointsSlots - 1}
	for _, proto := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
		rs.Append(shard, nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: proto, Map: epMap(proto), Slot: slots[proto]}}})
	}
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Goto(shard)}})
	for _, e := range nft.EndpointsElements(slots[nft.ProtoTCP], Backends(f, 5, 3, 8080)) {
		rs.AddElement(epMap(nft.ProtoTCP), e)
	}
	for _, e := range nft.EndpointsElements(slots[nft.ProtoUDP], Backends(f, 6, 1, 53)) {
		e.Comment = "default/dns:dns"
		rs.AddElement(epMap(nft.ProtoUDP), e)
	}
	// A single bucket, and the last one alone (its range ends at the
	// last key an end element can name).
	last := uint32(slots[nft.ProtoSCTP]) * nft.EndpointBuckets
	rs.AddElement(epMap(nft.ProtoSCTP), nft.Element{Key: []nft.Datum{nft.Int(last + 7)}, End: last + 7,
		Data: []nft.Datum{nft.Addr(Backends(f, 7, 1, 1)[0].Addr()), nft.Int(1)}})
	rs.AddElement(epMap(nft.ProtoSCTP), nft.Element{Key: []nft.Datum{nft.Int(last + 65535)}, End: last + 65535,
		Data: []nft.Datum{nft.Addr(Backends(f, 7, 2, 2)[1].Addr()), nft.Int(2)}})

	// Pick maps: one per protocol and number of endpoints, one chain of
	// DNATPick rules (the builder gives each its own chain).
	pickVIP := Addr(f, "10.96.0.30", "fd00:96::30")
	picks := []struct {
		proto uint8
		n     uint32
	}{{nft.ProtoTCP, 3}, {nft.ProtoUDP, 1}, {nft.ProtoSCTP, nft.MaxPickEndpoints}}
	rs.AddChain(&nft.Chain{Name: "pick"})
	for _, p := range picks {
		name := fmt.Sprintf("endpoints-%s-n%d", nft.ProtoName(p.proto), p.n)
		m := rs.AddSet(nft.NewPickMap(f, name, p.proto, p.n))
		if p.proto == nft.ProtoUDP {
			m.Comment = "UDP endpoints of Services with one"
			m.Counter = true
		}
		rs.Append("pick", nft.Rule{Phrases: []nft.Phrase{nft.DNATPick{Proto: p.proto, Map: name, Mod: p.n}}})
		eps := Backends(f, 8, int(min(p.n, 3)), 7000+uint16(p.proto))
		for _, e := range nft.PickElements(pickVIP, 80, eps) {
			if p.proto == nft.ProtoUDP {
				e.Comment = "default/pick:dns"
			}
			rs.AddElement(name, e)
		}
	}
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Goto("pick")}})
}

// everyPhraseElements adds the elements of the sets and maps.
func everyPhraseElements(rs *nft.Ruleset, f nft.Family) {
	svcIP := Addr(f, "10.96.0.10", "fd00:96::10")
	svcIP2 := Addr(f, "10.96.0.11", "fd00:96::11")
	rs.AddElement("service-ips", nft.Element{Key: []nft.Datum{nft.Addr(svcIP), TCP, nft.Int(80)},
		Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "svc-a"}, Comment: "default/web:http"})
	rs.AddElement("service-ips", nft.Element{Key: []nft.Datum{nft.Addr(svcIP), UDP, nft.Int(53)},
		Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "svc-b"}})
	rs.AddElement("service-ips", nft.Element{Key: []nft.Datum{nft.Addr(svcIP2), TCP, nft.Int(443)},
		Verdict: &nft.Verdict{Kind: nft.VerdictDrop}, Comment: "default/none:https"})
	rs.AddElement("service-nodeports", nft.Element{Key: []nft.Datum{TCP, nft.Int(30080)},
		Verdict: &nft.Verdict{Kind: nft.VerdictJump, Chain: "svc-c"}})
	rs.AddElement("cluster-ips", nft.Element{Key: []nft.Datum{nft.Addr(svcIP)}})
	rs.AddElement("cluster-ips", nft.Element{Key: []nft.Datum{nft.Addr(svcIP2)}})
	rs.AddElement("nodeport-ips", nft.Element{Key: []nft.Datum{nft.Addr(Addr(f, "10.10.0.58", "fd00:10::58"))}})
	be := Backends(f, 1, 1, 8080)[0]
	rs.AddElement("hairpin-connections", nft.Element{Key: []nft.Datum{nft.Addr(be.Addr()), nft.Addr(be.Addr()), TCP, nft.Int(8080)}})
	rs.AddElement("protocols", nft.Element{Key: []nft.Datum{TCP}})
	rs.AddElement("protocols", nft.Element{Key: []nft.Datum{UDP}})
}

// Service is one Service port of RealisticRuleset.
type Service struct {
	Index     int
	ClusterIP netip.Addr
	Backends  []netip.AddrPort
	NodePort  uint32 // 0: none
}

// Name is the Service port's name, as its chains' comments carry it.
func (s Service) Name() string { return fmt.Sprintf("default/svc-%d/tcp/http", s.Index) }

// Chain is the Service port's chain.
func (s Service) Chain() string {
	return fmt.Sprintf("service-%08X-%s", uint32(s.Index)*2654435761, s.Name())
}

// External is the Service port's chain for traffic from outside.
func (s Service) External() string {
	return fmt.Sprintf("external-%08X-%s", uint32(s.Index)*2654435761, s.Name())
}

// MakeServices returns count Services with nBackends endpoints each.
func MakeServices(f nft.Family, count, nBackends int) []Service {
	out := make([]Service, count)
	for i := range out {
		out[i] = MakeService(f, i, nBackends)
	}
	return out
}

// MakeService returns Service number i. Every 10th has a NodePort; every
// 50th has no endpoints.
func MakeService(f nft.Family, i, nBackends int) Service {
	s := Service{Index: i}
	if f == nft.IPv6 {
		s.ClusterIP = netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", i+10))
	} else {
		k := i + 10
		s.ClusterIP = netip.AddrFrom4([4]byte{10, byte(96 + k>>16), byte(k >> 8), byte(k)})
	}
	if i%50 != 49 {
		s.Backends = Backends(f, i, nBackends, 8080)
	}
	if i%10 == 9 {
		s.NodePort = uint32(30000 + i/10%2768)
	}
	return s
}

// RealisticRuleset has the shape of upstream kube-proxy's nftables table
// (pkg/proxy/nftables in kubernetes v1.36) for the given Services.
func RealisticRuleset(f nft.Family, svcs []Service) *nft.Ruleset {
	rs := nft.NewRuleset(f)
	at := f.AddrType()
	vmap := func(name, comment string, key ...nft.DataType) {
		rs.AddSet(&nft.Set{Name: name, Key: key, Data: []nft.DataType{nft.TypeVerdict}, Comment: comment})
	}
	rs.AddSet(&nft.Set{Name: "cluster-ips", Key: []nft.DataType{at}, Comment: "Active ClusterIPs"})
	rs.AddSet(&nft.Set{Name: "nodeport-ips", Key: []nft.DataType{at}, Comment: "IPs that accept NodePort traffic"})
	rs.AddSet(&nft.Set{Name: "hairpin-connections", Key: []nft.DataType{at, at, nft.TypeInetProto, nft.TypeInetService},
		Comment: "service hairpin connections"})
	vmap("service-ips", "ClusterIP, ExternalIP and LoadBalancer IP traffic", at, nft.TypeInetProto, nft.TypeInetService)
	vmap("service-nodeports", "NodePort traffic", nft.TypeInetProto, nft.TypeInetService)
	vmap("no-endpoint-services", "vmap to drop or reject packets to services with no endpoints",
		at, nft.TypeInetProto, nft.TypeInetService)
	vmap("no-endpoint-nodeports", "vmap to drop or reject packets to service nodeports with no endpoints",
		nft.TypeInetProto, nft.TypeInetService)
	vmap("firewall-ips", "destinations that are subject to LoadBalancerSourceRanges",
		at, nft.TypeInetProto, nft.TypeInetService)

	base := func(name string, t nft.ChainType, h nft.Hook, prio int32, rules ...[]nft.Phrase) {
		rs.AddChain(&nft.Chain{Name: name, Base: &nft.BaseChain{Type: t, Hook: h, Priority: prio}})
		for _, r := range rules {
			rs.Append(name, nft.Rule{Phrases: r})
		}
	}
	newJump := func(chain string) []nft.Phrase { return []nft.Phrase{nft.MatchCtStateNew{}, nft.Jump(chain)} }
	base("filter-prerouting-pre-dnat", nft.ChainFilter, nft.HookPrerouting, nft.PriorityPreDstNATFilter, newJump("firewall-check"))
	base("filter-output-pre-dnat", nft.ChainFilter, nft.HookOutput, nft.PriorityPreDstNATFilter, newJump("firewall-check"))
	base("filter-input", nft.ChainFilter, nft.HookInput, nft.PriorityFilter,
		newJump("nodeport-endpoints-check"), newJump("service-endpoints-check"))
	base("filter-forward", nft.ChainFilter, nft.HookForward, nft.PriorityFilter,
		newJump("service-endpoints-check"), newJump("cluster-ips-check"))
	base("filter-output", nft.ChainFilter, nft.HookOutput, nft.PriorityFilter,
		newJump("service-endpoints-check"), newJump("cluster-ips-check"))
	base("nat-prerouting", nft.ChainNAT, nft.HookPrerouting, nft.PriorityDstNAT, []nft.Phrase{nft.Jump("services")})
	base("nat-output", nft.ChainNAT, nft.HookOutput, nft.PriorityDstNAT, []nft.Phrase{nft.Jump("services")})
	base("nat-postrouting", nft.ChainNAT, nft.HookPostrouting, nft.PrioritySrcNAT, []nft.Phrase{nft.Jump("masquerading")})

	daddr3 := []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}
	port2 := []nft.Field{nft.FieldL4Proto, nft.FieldDstPort}
	chain := func(name string, rules ...nft.Rule) {
		rs.AddChain(&nft.Chain{Name: name, Rules: rules})
	}
	chain("nodeport-endpoints-check", nft.Rule{Phrases: []nft.Phrase{
		nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "nodeport-ips"}, nft.VmapLookup{Fields: port2, Map: "no-endpoint-nodeports"}}})
	chain("service-endpoints-check", nft.Rule{Phrases: []nft.Phrase{nft.VmapLookup{Fields: daddr3, Map: "no-endpoint-services"}}})
	chain("firewall-check", nft.Rule{Phrases: []nft.Phrase{nft.VmapLookup{Fields: daddr3, Map: "firewall-ips"}}})
	chain("services",
		nft.Rule{Phrases: []nft.Phrase{nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "cluster-ips"},
			nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: Prefix(f, "10.128.0.0/10", "fd00:244::/64"), Negate: true},
			nft.SetMarkBits{Bits: 0x4000}}, Comment: "masquerade clusterIP traffic from outside cluster"},
		nft.Rule{Phrases: []nft.Phrase{nft.VmapLookup{Fields: daddr3, Map: "service-ips"}}},
		nft.Rule{Phrases: []nft.Phrase{nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "nodeport-ips"}, nft.VmapLookup{Fields: port2, Map: "service-nodeports"}}})
	chain("masquerading",
		nft.Rule{Phrases: []nft.Phrase{nft.MatchMarkBits{Mask: 0x4000}, nft.ToggleMarkBits{Bits: 0x4000}, nft.Masquerade{}}},
		nft.Rule{Phrases: []nft.Phrase{nft.MatchCtStatusDNAT{}, nft.MatchSet{Fields: []nft.Field{nft.FieldSrcAddr, nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort},
			Set: "hairpin-connections"}, nft.Masquerade{}}})
	chain("cluster-ips-check",
		nft.Rule{Phrases: []nft.Phrase{nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "cluster-ips"}, nft.Reject{}},
			Comment: "Reject traffic to invalid ports of ClusterIPs"},
		nft.Rule{Phrases: []nft.Phrase{nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: Prefix(f, "10.96.0.0/12", "fd00:96::/108")}, nft.Drop()},
			Comment: "Drop traffic to unallocated ClusterIPs"})
	chain("reject-chain", nft.Rule{Phrases: []nft.Phrase{nft.Reject{}}})
	rs.AddElement("nodeport-ips", nft.Element{Key: []nft.Datum{nft.Addr(Addr(f, "10.10.0.58", "fd00:10::58"))}})

	for _, s := range svcs {
		AddService(rs, s)
	}
	return rs
}

// AddService adds one Service's chains and elements.
func AddService(rs *nft.Ruleset, s Service) {
	key := []nft.Datum{nft.Addr(s.ClusterIP), TCP, nft.Int(80)}
	rs.AddElement("cluster-ips", nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP)}})
	if len(s.Backends) == 0 {
		rs.AddElement("no-endpoint-services", nft.Element{Key: key, Comment: s.Name(),
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "reject-chain"}})
		return
	}
	rs.AddChain(&nft.Chain{Name: s.Chain(), Rules: DNATCascade(nft.ProtoTCP, s.Backends)})
	rs.AddElement("service-ips", nft.Element{Key: key, Comment: s.Name(),
		Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: s.Chain()}})
	if s.NodePort != 0 {
		rs.AddChain(&nft.Chain{Name: s.External(), Rules: []nft.Rule{
			{Phrases: []nft.Phrase{nft.SetMarkBits{Bits: 0x4000}}, Comment: "masquerade"},
			{Phrases: []nft.Phrase{nft.Goto(s.Chain())}}}})
		rs.AddElement("service-nodeports", nft.Element{Key: []nft.Datum{TCP, nft.Int(s.NodePort)}, Comment: s.Name(),
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: s.External()}})
	}
}

// DNATCascade picks one of the Backends uniformly at random, as
// proxier/ruleset's DNATCascade writes it:
//
//	meta l4proto tcp numgen random mod 3 0 dnat to 10.244.1.11:8080
//	meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.12:8080
//	meta l4proto tcp dnat to 10.244.1.13:8080
func DNATCascade(proto uint8, Backends []netip.AddrPort) []nft.Rule {
	rules := make([]nft.Rule, len(Backends))
	for i, be := range Backends {
		p := []nft.Phrase{nft.MatchL4Proto{Proto: proto}}
		if left := len(Backends) - i; left > 1 {
			p = append(p, nft.MatchRandom{Mod: uint32(left)})
		}
		rules[i] = nft.Rule{Phrases: append(p, nft.DNAT{To: be})}
	}
	return rules
}
