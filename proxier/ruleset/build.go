package ruleset

import (
	"net/netip"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Config is what the builder needs besides the model.
type Config struct {
	// ClusterCIDRs of this family: ClusterIP traffic from outside them is
	// masqueraded. Empty: none is.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs of this family: traffic to an unallocated address inside
	// them is dropped.
	ServiceCIDRs []netip.Prefix
	// MasqueradeMark is the mark bit that asks for masquerading (0x4000).
	MasqueradeMark uint32
	// MasqueradeAll masquerades all ClusterIP traffic.
	MasqueradeAll bool
}

var (
	vipProtoPort = []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}
	hairpinKey   = []nft.Field{nft.FieldSrcAddr, nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}
)

// Build returns the complete desired ruleset of a family: the base objects
// and the fragment of the given service ports. The proxier builds the same
// ruleset Service by Service (see proxier.syncFamily); Build is for tests
// and tools.
func Build(cfg Config, f nft.Family, ports []model.ServicePortState) *nft.Ruleset {
	ed := nft.NewEditor(f)
	for _, s := range Sets(f) {
		ed.AddSet(s)
	}
	ed.Replace(nil, Base(cfg, f))
	ed.Replace(nil, ServiceFragment(ports))
	return ed.Ruleset()
}

// Sets are the sets and maps every node has. Their definitions never
// change while nftproxy runs.
func Sets(f nft.Family) []*nft.Set {
	addr := f.AddrType()
	vipKey := []nft.DataType{addr, nft.TypeInetProto, nft.TypeInetService}
	return []*nft.Set{
		{Name: setClusterIPs, Key: []nft.DataType{addr}, Comment: "Active ClusterIPs"},
		{Name: mapServiceIPs, Key: vipKey, Data: []nft.DataType{nft.TypeVerdict}, Comment: "ClusterIP traffic"},
		{Name: mapNoEndpointServices, Key: vipKey, Data: []nft.DataType{nft.TypeVerdict},
			Comment: "services with no endpoints: reject"},
		{Name: setHairpinConnections, Key: []nft.DataType{addr, addr, nft.TypeInetProto, nft.TypeInetService},
			Comment: "endpoint connections to itself through its service"},
	}
}

// Base returns the chains every node has, whatever its Services: the base
// chains hooking into netfilter and the chains they dispatch to.
func Base(cfg Config, f nft.Family) *nft.Fragment {
	fr := &nft.Fragment{}
	base := func(name string, t nft.ChainType, h nft.Hook, prio int32, rules ...nft.Rule) {
		fr.Chains = append(fr.Chains, &nft.Chain{Name: name, Base: &nft.BaseChain{Type: t, Hook: h, Priority: prio}, Rules: rules})
	}
	chain := func(name string, rules ...nft.Rule) {
		fr.Chains = append(fr.Chains, &nft.Chain{Name: name, Rules: rules})
	}
	ctNewJump := func(chain string) nft.Rule {
		return nft.Rule{Phrases: []nft.Phrase{nft.MatchCtStateNew{}, nft.Jump(chain)}}
	}
	base(chainNATPrerouting, nft.ChainNAT, nft.HookPrerouting, nft.PriorityDstNAT, rule(nft.Jump(chainServices)))
	base(chainNATOutput, nft.ChainNAT, nft.HookOutput, nft.PriorityDstNAT, rule(nft.Jump(chainServices)))
	base(chainNATPostrouting, nft.ChainNAT, nft.HookPostrouting, nft.PrioritySrcNAT, rule(nft.Jump(chainMasquerading)))
	base(chainFilterForward, nft.ChainFilter, nft.HookForward, nft.PriorityFilter,
		ctNewJump(chainServiceEndpointCheck), ctNewJump(chainClusterIPsCheck))
	base(chainFilterOutput, nft.ChainFilter, nft.HookOutput, nft.PriorityFilter,
		ctNewJump(chainServiceEndpointCheck), ctNewJump(chainClusterIPsCheck))
	base(chainFilterInput, nft.ChainFilter, nft.HookInput, nft.PriorityFilter,
		ctNewJump(chainServiceEndpointCheck))

	chain(chainServices, servicesRules(cfg)...)
	chain(chainMasquerading,
		rule(nft.MatchMarkBits{Mask: cfg.MasqueradeMark}, nft.ToggleMarkBits{Bits: cfg.MasqueradeMark}, nft.Masquerade{}),
		rule(nft.MatchCtStatusDNAT{}, nft.MatchSet{Fields: hairpinKey, Set: setHairpinConnections}, nft.Masquerade{}))
	chain(chainServiceEndpointCheck, rule(nft.VmapLookup{Fields: vipProtoPort, Map: mapNoEndpointServices}))
	toClusterIP := nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: setClusterIPs}
	check := []nft.Rule{
		{Phrases: []nft.Phrase{toClusterIP, nft.RejectTCPReset{}}, Comment: "reject traffic to invalid ports of ClusterIPs"},
		{Phrases: []nft.Phrase{toClusterIP, nft.Reject{}}, Comment: "reject traffic to invalid ports of ClusterIPs"},
	}
	for _, p := range cfg.ServiceCIDRs {
		check = append(check, nft.Rule{
			Phrases: []nft.Phrase{nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: p}, nft.Drop()},
			Comment: "drop traffic to unallocated ClusterIPs",
		})
	}
	chain(chainClusterIPsCheck, check...)
	// TCP gets a reset, other protocols an ICMP error: see nft.RejectTCPReset.
	chain(chainReject, rule(nft.RejectTCPReset{}), rule(nft.Reject{}))
	return fr
}

// servicesRules mark ClusterIP traffic for masquerading, then dispatch.
func servicesRules(cfg Config) []nft.Rule {
	var rules []nft.Rule
	toClusterIP := nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: setClusterIPs}
	mark := nft.SetMarkBits{Bits: cfg.MasqueradeMark}
	switch {
	case cfg.MasqueradeAll:
		rules = append(rules, nft.Rule{Phrases: []nft.Phrase{toClusterIP, mark},
			Comment: "masquerade all clusterIP traffic"})
	default:
		for _, c := range cfg.ClusterCIDRs {
			rules = append(rules, nft.Rule{
				Phrases: []nft.Phrase{toClusterIP, nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: c, Negate: true}, mark},
				Comment: "masquerade clusterIP traffic from outside the cluster",
			})
		}
	}
	return append(rules, rule(nft.VmapLookup{Fields: vipProtoPort, Map: mapServiceIPs}))
}

// ServiceFragment is what the ports of one Service (in one family) need:
// the ClusterIP, and per port either a chain that DNATs to the endpoints
// (dispatched from service-ips) or a reject (no-endpoint-services).
func ServiceFragment(ports []model.ServicePortState) *nft.Fragment {
	fr := &nft.Fragment{}
	add := func(set string, e nft.Element) {
		fr.Elements = append(fr.Elements, nft.SetElement{Set: set, Element: e})
	}
	for i := range ports {
		sp := &ports[i]
		add(setClusterIPs, nft.Element{Key: []nft.Datum{nft.Addr(sp.ClusterIP)}})
		key := []nft.Datum{nft.Addr(sp.ClusterIP), nft.Int(uint32(sp.Name.Protocol)), nft.Int(uint32(sp.Port))}
		comment := sp.Name.String()
		if len(sp.Endpoints) == 0 {
			add(mapNoEndpointServices, nft.Element{Key: key, Comment: comment,
				Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: chainReject}})
			continue
		}
		chain := ServiceChainName(sp.Name)
		fr.Chains = append(fr.Chains, &nft.Chain{Name: chain, Rules: dnatCascade(sp.Name.Protocol, sp.Endpoints)})
		add(mapServiceIPs, nft.Element{Key: key, Comment: comment,
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: chain}})
		for _, ep := range sp.Endpoints {
			add(setHairpinConnections, nft.Element{Key: []nft.Datum{
				nft.Addr(ep.Addr()), nft.Addr(ep.Addr()), nft.Int(uint32(sp.Name.Protocol)), nft.Int(uint32(ep.Port())),
			}})
		}
	}
	return fr
}

// dnatCascade picks one of n endpoints uniformly at random per connection:
//
//	meta l4proto tcp numgen random mod 3 0 dnat to 10.244.1.11:8080
//	meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.12:8080
//	meta l4proto tcp dnat to 10.244.1.13:8080
//
// Rule i is taken with probability 1/(n-i) once the rules before it were
// not, so every endpoint gets 1/n. Upstream kube-proxy writes one rule with
// `numgen random mod n map { … }` instead, but each such anonymous map costs
// the kernel a walk of the whole transaction (and of the table's set list)
// when it is bound: a 10,000-Service cold start took 21 s in the kernel that
// way and 0.63 s as cascades (nft.TestNetlinkColdStart10k). New connections
// walk at most n short rules; established ones never enter the chain.
func dnatCascade(proto uint8, endpoints []netip.AddrPort) []nft.Rule {
	rules := make([]nft.Rule, len(endpoints))
	for i, ep := range endpoints {
		p := []nft.Phrase{nft.MatchL4Proto{Proto: proto}}
		if left := len(endpoints) - i; left > 1 {
			p = append(p, nft.MatchRandom{Mod: uint32(left)})
		}
		rules[i] = nft.Rule{Phrases: append(p, nft.DNAT{To: ep})}
	}
	return rules
}

func rule(p ...nft.Phrase) nft.Rule { return nft.Rule{Phrases: p} }
