package ruleset

import (
	"net/netip"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Config is what the builder needs besides the model.
type Config struct {
	// LocalTraffic tells traffic from this node's pods from other traffic.
	// ClusterIP traffic from elsewhere is masqueraded; pod traffic to an
	// externalTrafficPolicy: Local Service short-circuits to all endpoints.
	LocalTraffic LocalDetector
	// ServiceCIDRs of this family: traffic to an unallocated address inside
	// them is dropped.
	ServiceCIDRs []netip.Prefix
	// NodePorts says on which destination addresses NodePorts are open.
	NodePorts NodePortAddresses
	// MasqueradeMark is the mark bit that asks for masquerading (0x4000).
	MasqueradeMark uint32
	// MasqueradeAll masquerades all ClusterIP traffic.
	MasqueradeAll bool
	// Counters says which dispatch maps count new connections
	// (--service-traffic-metrics).
	Counters Counters
	// LocalhostNodePorts says which NodePorts refuse connections to a
	// loopback address (KubeProxyNFTablesLocalhostNodePorts).
	LocalhostNodePorts LocalhostNodePorts
}

// LocalhostNodePorts is what becomes of a connection from the node to a
// NodePort on a loopback address (127.0.0.0/8, ::1), which the kernel's
// rules never DNAT (see NodePortAddresses). Without the feature gate
// KubeProxyNFTablesLocalhostNodePorts nothing does: Reject is empty, the
// table has none of the objects below, and the connection reaches whatever
// listens on the port. With it, NodePorts of the protocols in Reject
// refuse it, TCP with a reset as all of nftproxy's refusals (see
// nft.RejectTCPReset), and count it per protocol; a NodePort of another
// protocol (TCP, when --nodeport-addresses names the family's loopback
// and proxier/localnodeport serves it in userspace) is left alone:
//
//	map localhost-nodeport-reject-ports { type inet_proto . inet_service : verdict; … }
//	set localhost-nodeport-rejected { type inet_proto; counter; elements = { tcp, udp, sctp } }
//	chain nodeport-endpoints-check { …; ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports }
//	chain localhost-nodeport-reject { meta l4proto @localhost-nodeport-rejected goto reject-chain }
//	element localhost-nodeport-reject-ports { tcp . 30080 comment "default/web:http" : goto localhost-nodeport-reject }
//
// nodeport-endpoints-check is reached from filter-input for a
// connection's first packet: a process's connection to 127.0.0.1 crosses
// the output hooks, then comes back in on lo. Every NodePort of a
// rejected protocol has its element, with or without endpoints. The
// counters live in the elements of a set, not in named counters (which
// upstream uses), so that they are read like the traffic metrics'
// (nftnl.ReadCounters) and survive restarts with the table.
type LocalhostNodePorts struct {
	// Reject lists protocols (nft.ProtoTCP, ProtoUDP, ProtoSCTP).
	Reject []uint8
}

func (l LocalhostNodePorts) rejects(proto uint8) bool { return slices.Contains(l.Reject, proto) }

// LocalhostRejectedSet is the counted set whose elements count the
// connections to loopback NodePorts refused, one per protocol.
const LocalhostRejectedSet = setLocalhostRejected

// LocalhostRejected returns the protocol whose refused connections an
// element's counter holds, if s is the set that counts them (ok false for
// any other set).
func LocalhostRejected(set string, e nft.Element) (proto uint8, ok bool) {
	if set != setLocalhostRejected || len(e.Key) != 1 {
		return 0, false
	}
	return uint8(e.Key[0].Int), true
}

// Counters says which maps give each element a counter (nft.Set.Counter).
// The maps it names are looked up only for a connection's first packet
// (nat hooks, which see only new connections), so an element's counter is
// the number of new connections it dispatched, at no cost beyond the
// counter's update.
type Counters uint8

const (
	// CountNone: no counters (the default).
	CountNone Counters = iota
	// CountServices: service-ips and service-nodeports count the new
	// connections of each frontend (ClusterIP, external IP, load balancer
	// IP, NodePort) of each Service port.
	CountServices
	// CountEndpoints: CountServices, and the endpoints maps count the new
	// connections to each endpoint; their elements carry the Service
	// port's comment, as the dispatch maps' do, so that a reader of the
	// kernel's counters can name the Service.
	CountEndpoints
)

// String is the value of --service-traffic-metrics that asks for c.
func (c Counters) String() string {
	switch c {
	case CountServices:
		return "services"
	case CountEndpoints:
		return "endpoints"
	}
	return "none"
}

// EndpointsMap returns m, an endpoints map Slots made, counted if c
// counts endpoints.
func (c Counters) EndpointsMap(m *nft.Set) *nft.Set {
	m.Counter = c == CountEndpoints
	return m
}

// LocalDetector tells pod traffic from other traffic (--detect-local-mode).
// At most one field is set; none: no traffic counts as local.
type LocalDetector struct {
	// CIDRs: sources inside one of them (ClusterCIDR, NodeCIDR modes).
	CIDRs []netip.Prefix
	// Interface: the input interface is this one (BridgeInterface mode), or
	// with InterfacePrefix, starts with it (InterfaceNamePrefix mode).
	Interface       string
	InterfacePrefix bool
}

// local returns the rules' phrase lists that match local traffic (one per
// alternative), or that match non-local traffic (all of the phrases must
// hold: one list); nil if there is no detector.
func (d LocalDetector) local() [][]nft.Phrase {
	if d.Interface != "" {
		return [][]nft.Phrase{{nft.MatchIifname{Name: d.Interface, Prefix: d.InterfacePrefix}}}
	}
	var out [][]nft.Phrase
	for _, c := range d.CIDRs {
		out = append(out, []nft.Phrase{nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: c}})
	}
	return out
}

func (d LocalDetector) notLocal() []nft.Phrase {
	if d.Interface != "" {
		return []nft.Phrase{nft.MatchIifname{Name: d.Interface, Prefix: d.InterfacePrefix, Negate: true}}
	}
	var out []nft.Phrase
	for _, c := range d.CIDRs {
		out = append(out, nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: c, Negate: true})
	}
	return out
}

// NodePortAddresses are the destinations NodePorts answer on: exactly the
// node's primary Addresses (--nodeport-addresses=primary), or any local
// address inside one of the CIDRs (0.0.0.0/0: every local address).
// Loopback addresses never are. Neither set: no NodePorts.
type NodePortAddresses struct {
	Addresses []netip.Addr
	CIDRs     []netip.Prefix
}

// guards returns one phrase list per rule that must match the destination
// of NodePort traffic.
func (n NodePortAddresses) guards(f nft.Family) [][]nft.Phrase {
	return n.guardsOn(f, nft.FieldDstAddr)
}

// sourceGuards are guards on the source address: that of a NodePort
// connection's replies.
func (n NodePortAddresses) sourceGuards(f nft.Family) [][]nft.Phrase {
	return n.guardsOn(f, nft.FieldSrcAddr)
}

func (n NodePortAddresses) guardsOn(f nft.Family, fd nft.Field) [][]nft.Phrase {
	var out [][]nft.Phrase
	for _, a := range n.Addresses {
		if a.IsLoopback() {
			continue
		}
		out = append(out, []nft.Phrase{nft.MatchPrefix{Field: fd, Prefix: netip.PrefixFrom(a, a.BitLen())}})
	}
	loopback := f.Loopback()
	for _, c := range n.CIDRs {
		if loopback.Overlaps(c) && c.Bits() >= loopback.Bits() {
			continue // loopback only: a guard that nothing passes
		}
		g := []nft.Phrase{nft.MatchFibLocal{Field: fd}}
		if c.Bits() > 0 {
			g = append(g, nft.MatchPrefix{Field: fd, Prefix: c.Masked()})
		}
		if c.Overlaps(loopback) {
			g = append(g, nft.MatchPrefix{Field: fd, Prefix: loopback, Negate: true})
		}
		out = append(out, g)
	}
	return out
}

var (
	vipProtoPort = []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}
	protoPort    = []nft.Field{nft.FieldL4Proto, nft.FieldDstPort}
	hairpinKey   = []nft.Field{nft.FieldSrcAddr, nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}
)

// Build returns the complete desired ruleset of a family: the base objects
// and the fragment of the given service ports, with slots assigned in
// their order. The proxier builds the same ruleset Service by Service (see
// proxier.syncFamily); Build is for tests and tools.
func Build(cfg Config, f nft.Family, ports []model.ServicePortState) *nft.Ruleset {
	return BuildSlots(cfg, f, ports, NewSlots())
}

// BuildSlots is Build with the slots of an earlier build: the chains that
// already have one keep it.
func BuildSlots(cfg Config, f nft.Family, ports []model.ServicePortState, slots *Slots) *nft.Ruleset {
	ed := nft.NewEditor(f)
	for _, s := range Sets(f, cfg) {
		ed.AddSet(s)
	}
	fr := ServiceFragment(cfg, ports, slots)
	slots.ReleaseUnclaimed() // as the proxier's full sync does
	for _, s := range slots.Maps(f) {
		ed.AddSet(cfg.Counters.EndpointsMap(s))
	}
	ed.Replace(nil, Base(cfg, f))
	ed.Replace(nil, fr)
	slots.UpdatePicks(f, ed, nil)
	return ed.Ruleset()
}

// Sets are the sets and maps every node has. They depend only on
// cfg.Counters and cfg.LocalhostNodePorts, which are fixed for a run:
// their definitions never change while nftproxy runs. The endpoints maps
// come with the slots handed out (Slots.Maps, Counters.EndpointsMap).
func Sets(f nft.Family, cfg Config) []*nft.Set {
	addr := f.AddrType()
	vipKey := []nft.DataType{addr, nft.TypeInetProto, nft.TypeInetService}
	portKey := []nft.DataType{nft.TypeInetProto, nft.TypeInetService}
	verdict := []nft.DataType{nft.TypeVerdict}
	counted := cfg.Counters != CountNone
	sets := []*nft.Set{
		{Name: setClusterIPs, Key: []nft.DataType{addr}, Comment: "Active ClusterIPs"},
		{Name: mapServiceIPs, Key: vipKey, Data: verdict, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic",
			Counter: counted},
		{Name: mapServiceNodePorts, Key: portKey, Data: verdict, Comment: "NodePort traffic", Counter: counted},
		{Name: mapNoEndpointServices, Key: vipKey, Data: verdict,
			Comment: "services with no endpoints: reject, or drop when only a Local policy has none"},
		{Name: mapNoEndpointNodePorts, Key: portKey, Data: verdict, Comment: "NodePorts with no endpoints: reject"},
		{Name: mapFirewallIPs, Key: vipKey, Data: verdict, Comment: "LoadBalancer IPs with loadBalancerSourceRanges"},
		{Name: setHairpinConnections, Key: []nft.DataType{addr, addr, nft.TypeInetProto, nft.TypeInetService},
			Comment: "this node's endpoints reaching themselves through their service"},
	}
	if counted {
		sets = append(sets,
			&nft.Set{Name: setServiceTraffic, Key: vipKey, Counter: true,
				Comment: "packets and bytes of ClusterIP, ExternalIP and LoadBalancer IP traffic, both ways"},
			&nft.Set{Name: setNodePortTraffic, Key: portKey, Counter: true,
				Comment: "packets and bytes of NodePort traffic, both ways"})
	}
	if len(cfg.LocalhostNodePorts.Reject) > 0 {
		sets = append(sets,
			&nft.Set{Name: mapLocalhostRejectPorts, Key: portKey, Data: verdict,
				Comment: "NodePorts that refuse connections to loopback"},
			&nft.Set{Name: setLocalhostRejected, Key: []nft.DataType{nft.TypeInetProto}, Counter: true,
				Comment: "connections to loopback NodePorts refused, per protocol"})
	}
	return sets
}

// Counts are the sizes a full sync into an empty table reserves room for
// (Reserve): Services, their ports, endpoint ports in all, and those of
// this node's endpoints. They are estimates: too few only leaves some
// growth.
type Counts struct{ Services, Ports, Endpoints, LocalEndpoints int }

// MapElements is the room to reserve in new endpoints or pick map m: an
// endpoints map's slots times the endpoints per port, or as many elements
// as a pick map holds.
func (c Counts) MapElements(m *nft.Set) int {
	if m.PickProto != 0 {
		return min(PickMapElements, c.Endpoints)
	}
	if c.Ports == 0 {
		return 0
	}
	return SlotsPerMap * ((c.Endpoints + c.Ports - 1) / c.Ports)
}

// Reserve makes room in e for the chains and shared sets of a table of
// the given size (see nft.Editor.Reserve).
func Reserve(e *nft.Editor, c Counts) {
	e.ReserveChains(c.Ports)
	e.Reserve(setClusterIPs, c.Services)
	e.Reserve(mapServiceIPs, c.Ports)
	e.Reserve(setHairpinConnections, c.LocalEndpoints)
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
	countPrerouting, countOutput := countRequests(cfg)
	base(chainFilterPreroutingPreNAT, nft.ChainFilter, nft.HookPrerouting, nft.PriorityPreDstNATFilter,
		append([]nft.Rule{ctNewJump(chainFirewallCheck)}, countPrerouting...)...)
	base(chainFilterOutputPreNAT, nft.ChainFilter, nft.HookOutput, nft.PriorityPreDstNATFilter,
		append([]nft.Rule{ctNewJump(chainFirewallCheck)}, countOutput...)...)
	base(chainFilterForward, nft.ChainFilter, nft.HookForward, nft.PriorityFilter,
		ctNewJump(chainServiceEndpointCheck), ctNewJump(chainClusterIPsCheck))
	base(chainFilterOutput, nft.ChainFilter, nft.HookOutput, nft.PriorityFilter,
		ctNewJump(chainServiceEndpointCheck), ctNewJump(chainClusterIPsCheck))
	base(chainFilterInput, nft.ChainFilter, nft.HookInput, nft.PriorityFilter,
		ctNewJump(chainNodePortEndpointCheck), ctNewJump(chainServiceEndpointCheck))
	fr.Chains = append(fr.Chains, masqueradeBitClear(cfg))

	guards := cfg.NodePorts.guards(f)
	chain(chainServices, servicesRules(cfg, guards)...)
	if cfg.Counters != CountNone {
		trafficChains(fr, cfg, f)
	}
	chain(chainMasquerading,
		rule(nft.MatchMarkBits{Mask: cfg.MasqueradeMark}, nft.ToggleMarkBits{Bits: cfg.MasqueradeMark}, nft.Masquerade{}),
		rule(nft.MatchCtStatusDNAT{}, nft.MatchSet{Fields: hairpinKey, Set: setHairpinConnections}, nft.Masquerade{}))
	chain(chainServiceEndpointCheck, rule(nft.VmapLookup{Fields: vipProtoPort, Map: mapNoEndpointServices}))
	var nodePortCheck []nft.Rule
	for _, g := range guards {
		nodePortCheck = append(nodePortCheck, rule(append(g, nft.VmapLookup{Fields: protoPort, Map: mapNoEndpointNodePorts})...))
	}
	if len(cfg.LocalhostNodePorts.Reject) > 0 {
		nodePortCheck = append(nodePortCheck, rule(nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: f.Loopback()},
			nft.VmapLookup{Fields: protoPort, Map: mapLocalhostRejectPorts}))
		chain(chainLocalhostReject, rule(nft.MatchSet{Fields: []nft.Field{nft.FieldL4Proto}, Set: setLocalhostRejected},
			nft.Goto(chainReject)))
		for _, proto := range cfg.LocalhostNodePorts.Reject {
			fr.Elements = append(fr.Elements, nft.SetElement{Set: setLocalhostRejected,
				Element: nft.Element{Key: []nft.Datum{nft.Int(uint32(proto))}}})
		}
	}
	chain(chainNodePortEndpointCheck, nodePortCheck...)
	chain(chainFirewallCheck, rule(nft.VmapLookup{Fields: vipProtoPort, Map: mapFirewallIPs}))
	toClusterIP := nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: setClusterIPs}
	check := []nft.Rule{
		{Phrases: []nft.Phrase{toClusterIP, nft.RejectTCPReset{}}, Comment: "reject traffic to invalid ports of ClusterIPs"},
		{Phrases: []nft.Phrase{toClusterIP, nft.Reject{}}, Comment: "reject traffic to invalid ports of ClusterIPs"},
	}
	for _, p := range cfg.ServiceCIDRs {
		if p.Bits() == 0 {
			// A ServiceCIDR of every address (the API allows it): dropping
			// all traffic to addresses no Service has would cut the node
			// off, and nft cannot write a match of everything.
			continue
		}
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

// masqueradeBitClear is the base chain that clears the masquerade bit. The
// masquerading chain clears the bit it masquerades for, but it never sees a
// packet another program's source NAT chain took first (at the same
// priority, the chain registered last runs first; the first masquerade ends
// the hook). A packet must not leave with the bit: it survives
// encapsulation, and the outer packet would be masqueraded for it. So it is
// cleared once every source NAT chain has read it, whoever masqueraded.
func masqueradeBitClear(cfg Config) *nft.Chain {
	return &nft.Chain{Name: chainFilterPostrouting,
		Base:  &nft.BaseChain{Type: nft.ChainFilter, Hook: nft.HookPostrouting, Priority: nft.PrioritySrcNAT + 1},
		Rules: []nft.Rule{rule(nft.MatchMarkBits{Mask: cfg.MasqueradeMark}, nft.ToggleMarkBits{Bits: cfg.MasqueradeMark})}}
}

// trafficChains count the packets and bytes of every connection to a
// Service frontend (service-traffic, nodeport-traffic). A request is
// counted before DNAT, where it still carries the frontend as its
// destination (countRequests: in the chains that check source ranges,
// after the check, so packets it drops are not); a reply after its
// source was turned back into the frontend (by the reverse of the DNAT,
// at the source NAT priority). A request is counted where it enters
// (prerouting or output), a reply where it leaves (postrouting or input),
// so each packet once. A frontend's elements come and go with its
// dispatch element: connections through a Service with no endpoint, which
// are never DNATed, are not counted.
func trafficChains(fr *nft.Fragment, cfg Config, f nft.Family) {
	base := func(name string, h nft.Hook, prio int32, rules ...nft.Rule) {
		fr.Chains = append(fr.Chains, &nft.Chain{Name: name,
			Base: &nft.BaseChain{Type: nft.ChainFilter, Hook: h, Priority: prio}, Rules: rules})
	}
	reply, dnat, countReply := nft.MatchCtDirection{Reply: true}, nft.MatchCtStatusDNAT{}, nft.Goto(chainCountReplies)
	base(chainTrafficInput, nft.HookInput, nft.PrioritySrcNAT+10, rule(reply, dnat, notLoopback, countReply))
	base(chainTrafficPostrouting, nft.HookPostrouting, nft.PrioritySrcNAT+10, rule(reply, dnat, countReply))

	count := func(name string, addr, port nft.Field, guards [][]nft.Phrase) {
		// A Service IP's traffic returns before the NodePort rules: a
		// local external IP must not count again on a port that is also a
		// NodePort.
		rules := []nft.Rule{rule(nft.MatchSet{Fields: []nft.Field{addr, nft.FieldL4Proto, port}, Set: setServiceTraffic}, nft.Return())}
		for _, g := range guards {
			rules = append(rules, rule(append(g, nft.MatchSet{Fields: []nft.Field{nft.FieldL4Proto, port}, Set: setNodePortTraffic})...))
		}
		fr.Chains = append(fr.Chains, &nft.Chain{Name: name, Rules: rules})
	}
	count(chainCountRequests, nft.FieldDstAddr, nft.FieldDstPort, cfg.NodePorts.guards(f))
	count(chainCountReplies, nft.FieldSrcAddr, nft.FieldSrcPort, cfg.NodePorts.sourceGuards(f))
}

// A packet from the node to the node crosses all four hooks: it is
// counted in output or postrouting, and not again when it comes back in
// on the loopback interface.
var notLoopback = nft.MatchIifname{Name: "lo", Negate: true}

// countRequests returns the rules that send requests to count-requests,
// for prerouting and for output (none if traffic is not counted). Only
// packets of DNATed connections are looked up, and the first packets of
// connections, which are DNATed after they are counted: other traffic
// pays two tests. A goto, not a jump: a packet that matches both rules (a
// SYN sent again) is counted once.
func countRequests(cfg Config) (prerouting, output []nft.Rule) {
	if cfg.Counters == CountNone {
		return nil, nil
	}
	request, dnat, first, count := nft.MatchCtDirection{}, nft.MatchCtStatusDNAT{}, nft.MatchCtStateNew{}, nft.Goto(chainCountRequests)
	return []nft.Rule{rule(request, dnat, notLoopback, count), rule(first, notLoopback, count)},
		[]nft.Rule{rule(request, dnat, count), rule(first, count)}
}

// servicesRules mark ClusterIP traffic for masquerading, then dispatch on
// the destination: a Service IP, else a NodePort on a NodePort address.
func servicesRules(cfg Config, nodePortGuards [][]nft.Phrase) []nft.Rule {
	var rules []nft.Rule
	toClusterIP := nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: setClusterIPs}
	mark := nft.SetMarkBits{Bits: cfg.MasqueradeMark}
	switch notLocal := cfg.LocalTraffic.notLocal(); {
	case cfg.MasqueradeAll:
		rules = append(rules, nft.Rule{Phrases: []nft.Phrase{toClusterIP, mark},
			Comment: "masquerade all clusterIP traffic"})
	case cfg.LocalTraffic.Interface != "":
		rules = append(rules, nft.Rule{Phrases: append(append([]nft.Phrase{toClusterIP}, notLocal...), mark),
			Comment: "masquerade clusterIP traffic from outside the cluster"})
	default:
		// One rule per CIDR (one per family in practice): a source outside
		// it is not a pod's.
		for _, p := range notLocal {
			rules = append(rules, nft.Rule{Phrases: []nft.Phrase{toClusterIP, p, mark},
				Comment: "masquerade clusterIP traffic from outside the cluster"})
		}
	}
	rules = append(rules, rule(nft.VmapLookup{Fields: vipProtoPort, Map: mapServiceIPs}))
	for _, g := range nodePortGuards {
		rules = append(rules, rule(append(g, nft.VmapLookup{Fields: protoPort, Map: mapServiceNodePorts})...))
	}
	return rules
}

// ServiceFragment is what the ports of one Service (in one family) need:
// the ClusterIP; per port, the chains that DNAT to its endpoints, with the
// map elements that dispatch ClusterIP, external IP and NodePort traffic to
// them; or, when there is no endpoint to go to, the elements that reject
// or drop that traffic. A chain that picks endpoints through an endpoints
// map gets its slot from slots (which assigns one if it has none: add
// slots.Maps to the table).
func ServiceFragment(cfg Config, ports []model.ServicePortState, slots *Slots) *nft.Fragment {
	// Room for the elements of the usual port (its ClusterIP, service IP,
	// a range per endpoint and a hairpin connection per local one), not
	// grown from nothing: growing was a large share of a full sync's
	// allocations (docs/code-figures.md).
	n := 0
	for i := range ports {
		n += 2 + len(ports[i].Endpoints) + len(ports[i].LocalEndpoints)
	}
	fr := &nft.Fragment{Elements: make([]nft.SetElement, 0, n)}
	AddServiceFragment(fr, cfg, ports, slots)
	return fr
}

// AddServiceFragment adds what ServiceFragment returns to fr: a sync that
// builds every Service's fragment in turn builds them all in the memory of
// one (see nft.Fragment.Reset).
func AddServiceFragment(fr *nft.Fragment, cfg Config, ports []model.ServicePortState, slots *Slots) {
	for i := range ports {
		portFragment(fr, cfg, &ports[i], slots)
	}
}

// portBuilder adds the objects of one service port to a fragment.
type portBuilder struct {
	fr    *nft.Fragment
	cfg   Config
	sp    *model.ServicePortState
	slots *Slots
}

func (b portBuilder) element(set string, e nft.Element) {
	b.fr.Elements = append(b.fr.Elements, nft.SetElement{Set: set, Element: e})
}

func (b portBuilder) chain(kind string, rules ...nft.Rule) string {
	return b.namedChain(ChainName(kind, b.sp.Name), rules...)
}

func (b portBuilder) namedChain(name string, rules ...nft.Rule) string {
	b.fr.Chains = append(b.fr.Chains, &nft.Chain{Name: name, Rules: rules})
	return name
}

// dispatch adds the element of a dispatch map (service-ips or
// service-nodeports) that sends key's traffic to chain, and when traffic
// is counted, the element of the same key that counts its packets.
func (b portBuilder) dispatch(set string, key []nft.Datum, comment, chain string) {
	b.element(set, nft.Element{Key: key, Comment: comment, Verdict: gotoChain(chain)})
	if b.cfg.Counters == CountNone {
		return
	}
	counter := setServiceTraffic
	if set == mapServiceNodePorts {
		counter = setNodePortTraffic
	}
	b.element(counter, nft.Element{Key: key, Comment: comment})
}

// key is addr . proto . port of the service port.
func (b portBuilder) key(a netip.Addr, port uint16) []nft.Datum {
	k := b.fr.Datums(3)
	k[0], k[1], k[2] = nft.Addr(a), nft.Int(uint32(b.sp.Name.Protocol)), nft.Int(uint32(port))
	return k
}

func (b portBuilder) nodePortKey() []nft.Datum {
	k := b.fr.Datums(2)
	k[0], k[1] = nft.Int(uint32(b.sp.Name.Protocol)), nft.Int(uint32(b.sp.NodePort))
	return k
}

var (
	gotoReject = &nft.Verdict{Kind: nft.VerdictGoto, Chain: chainReject}
	drop       = &nft.Verdict{Kind: nft.VerdictDrop}
)

func gotoChain(name string) *nft.Verdict { return &nft.Verdict{Kind: nft.VerdictGoto, Chain: name} }

func portFragment(fr *nft.Fragment, cfg Config, sp *model.ServicePortState, slots *Slots) {
	b := portBuilder{fr: fr, cfg: cfg, sp: sp, slots: slots}
	comment := Comment(sp.Name)
	vip := b.fr.Datums(1)
	vip[0] = nft.Addr(sp.ClusterIP)
	b.element(setClusterIPs, nft.Element{Key: vip})
	hairpins(b, sp.LocalEndpoints)
	if sp.NodePort != 0 && cfg.LocalhostNodePorts.rejects(sp.Name.Protocol) {
		b.element(mapLocalhostRejectPorts, nft.Element{Key: b.nodePortKey(), Comment: comment,
			Verdict: gotoChain(chainLocalhostReject)})
	}

	// No endpoint at all: every frontend rejects (in the filter chains,
	// after the packet was not DNATed).
	if len(sp.Endpoints) == 0 {
		b.element(mapNoEndpointServices, nft.Element{Key: b.key(sp.ClusterIP, sp.Port), Comment: comment, Verdict: gotoReject})
		for _, a := range externalAddrs(sp) {
			b.element(mapNoEndpointServices, nft.Element{Key: b.key(a, sp.Port), Comment: comment, Verdict: gotoReject})
		}
		if sp.NodePort != 0 {
			b.element(mapNoEndpointNodePorts, nft.Element{Key: b.nodePortKey(), Comment: comment, Verdict: gotoReject})
		}
		firewall(b)
		return
	}

	var clusterChain, localChain string
	cluster := func() string {
		if clusterChain == "" {
			clusterChain = b.pickChain(kindService, sp.Endpoints)
		}
		return clusterChain
	}
	local := func() string {
		if localChain == "" && len(sp.LocalEndpoints) > 0 {
			localChain = b.pickChain(kindLocal, sp.LocalEndpoints)
		}
		return localChain
	}

	// ClusterIP: through a pick map (no chain of its own) unless it needs
	// session affinity or has more endpoints than a pick map holds.
	internal := sp.Endpoints
	if sp.InternalLocal {
		internal = sp.LocalEndpoints
	}
	switch {
	case len(internal) > 0 && len(internal) <= nft.MaxPickEndpoints && sp.AffinityTimeout == 0:
		b.dispatch(mapServiceIPs, b.key(sp.ClusterIP, sp.Port), comment, b.pick(internal))
	case !sp.InternalLocal:
		b.dispatch(mapServiceIPs, b.key(sp.ClusterIP, sp.Port), comment, cluster())
	case local() != "":
		b.dispatch(mapServiceIPs, b.key(sp.ClusterIP, sp.Port), comment, local())
	default:
		// internalTrafficPolicy: Local with no endpoint here: drop, as
		// upstream (the Service has endpoints, just not on this node).
		b.element(mapNoEndpointServices, nft.Element{Key: b.key(sp.ClusterIP, sp.Port), Comment: comment, Verdict: drop})
	}

	// External frontends share one chain.
	if !sp.HasExternal() {
		return
	}
	ext := b.chain(kindExternal, externalRules(b, cluster, local)...)
	for _, a := range externalAddrs(sp) {
		b.dispatch(mapServiceIPs, b.key(a, sp.Port), comment, ext)
	}
	if sp.NodePort != 0 {
		b.dispatch(mapServiceNodePorts, b.nodePortKey(), comment, ext)
	}
	firewall(b)
}

func externalAddrs(sp *model.ServicePortState) []netip.Addr {
	return append(append([]netip.Addr(nil), sp.ExternalIPs...), sp.LoadBalancerIPs...)
}

// externalRules decide how external traffic (NodePort, external IPs, load
// balancer IPs) goes on. With externalTrafficPolicy Cluster it is
// masqueraded and sent to any endpoint. With Local, the client's address is
// kept and only this node's endpoints serve, except for traffic from this
// node's pods or the node itself, which goes to any endpoint (the node
// masqueraded): those clients would not have reached the Service through a
// load balancer. (Upstream dropped pod traffic to an external IP of such a
// Service with no local endpoint, kubernetes#131765, until #132456.)
func externalRules(b portBuilder, cluster, local func() string) []nft.Rule {
	mark := nft.SetMarkBits{Bits: b.cfg.MasqueradeMark}
	if !b.sp.ExternalLocal {
		return []nft.Rule{
			{Phrases: []nft.Phrase{mark}, Comment: "masquerade"},
			rule(nft.Goto(cluster())),
		}
	}
	var rules []nft.Rule
	for _, l := range b.cfg.LocalTraffic.local() {
		rules = append(rules, nft.Rule{Phrases: append(l, nft.Goto(cluster())), Comment: "short-circuit pod traffic"})
	}
	fromNode := nft.MatchFibLocal{Field: nft.FieldSrcAddr}
	rules = append(rules,
		nft.Rule{Phrases: []nft.Phrase{fromNode, mark}, Comment: "masquerade local traffic"},
		nft.Rule{Phrases: []nft.Phrase{fromNode, nft.Goto(cluster())}, Comment: "short-circuit local traffic"})
	if l := local(); l != "" {
		return append(rules, rule(nft.Goto(l)))
	}
	return append(rules, nft.Rule{Phrases: []nft.Phrase{nft.Drop()}, Comment: "no local endpoint"})
}

// firewall adds, for a port with loadBalancerSourceRanges, the chain that
// drops traffic to its load balancer IPs from other sources (before DNAT).
// NodePorts and external IPs are not filtered, as upstream.
func firewall(b portBuilder) {
	sp := b.sp
	// A range of every address (0.0.0.0/0, a common way of writing "no
	// restriction") lets every source in: no firewall, and no match of
	// everything, which nft cannot write.
	if len(sp.SourceRanges) == 0 || len(sp.LoadBalancerIPs) == 0 ||
		slices.ContainsFunc(sp.SourceRanges, func(r netip.Prefix) bool { return r.Bits() == 0 }) {
		return
	}
	rules := make([]nft.Rule, 0, len(sp.SourceRanges)+1)
	for _, r := range sp.SourceRanges {
		rules = append(rules, rule(nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: r.Masked()},
			nft.VerdictPhrase{Verdict: nft.Verdict{Kind: nft.VerdictReturn}}))
	}
	rules = append(rules, nft.Rule{Phrases: []nft.Phrase{nft.Drop()}, Comment: "source outside loadBalancerSourceRanges"})
	fw := b.chain(kindFirewall, rules...)
	for _, a := range sp.LoadBalancerIPs {
		b.element(mapFirewallIPs, nft.Element{Key: b.key(a, sp.Port), Comment: Comment(sp.Name), Verdict: gotoChain(fw)})
	}
}

// hairpins lets an endpoint reach itself through its Service: such
// connections are masqueraded, or the endpoint would see its own address
// as the source and answer itself directly. Only this node's endpoints
// need it, as upstream kube-proxy has it: a connection is DNATed on the
// client's node, and for a hairpin the client is the endpoint. (Traffic
// DNATed on another node is external, and masqueraded there, or under an
// external Local policy goes to that node's own endpoints.)
func hairpins(b portBuilder, endpoints []netip.AddrPort) {
	keys := b.fr.Datums(4 * len(endpoints))
	for i, ep := range endpoints {
		k := keys[4*i : 4*i+4 : 4*i+4]
		k[0], k[1], k[2], k[3] = nft.Addr(ep.Addr()), nft.Addr(ep.Addr()), nft.Int(uint32(b.sp.Name.Protocol)), nft.Int(uint32(ep.Port()))
		b.element(setHairpinConnections, nft.Element{Key: k})
	}
}

// pickChain adds the chain of this kind that sends a connection to one of
// the endpoints and returns its name. Without session affinity it is one
// rule, a DNAT through the chain's slot of an endpoints map, whose ranges
// of buckets go to the endpoints:
//
//	meta l4proto tcp dnat ip to numgen random mod 65536 offset 131072 map @endpoints-tcp-0
//
// so that an endpoint change is element work only: no rule changes, which
// would make the kernel validate the whole table (see nft.DNATMap). With
// session affinity: a jump to the endpoint the client used last, if it is
// still among them, else a cascade of jumps to endpoint chains that DNAT
// and remember the client.
func (b portBuilder) pickChain(kind string, endpoints []netip.AddrPort) string {
	name := ChainName(kind, b.sp.Name)
	if b.sp.AffinityTimeout > 0 {
		return b.namedChain(name, b.affinityRules(endpoints)...)
	}
	proto := b.sp.Name.Protocol
	m, slot := b.slots.Slot(name, proto)
	b.fr.AddEndpointsElements(m, slot, endpoints, b.endpointsComment())
	return b.namedChain(name, rule(nft.DNATMap{Proto: proto, Map: m, Slot: slot}))
}

// pick adds the elements of a pick map that send ClusterIP connections to
// one of the endpoints, and returns the chain that DNATs through it
// (nft.DNATPick, Slots.PickChains).
func (b portBuilder) pick(endpoints []netip.AddrPort) string {
	m, chain := b.slots.Pick(b.sp.Name.Protocol, len(endpoints), b.sp.ClusterIP, b.sp.Port)
	b.fr.AddPickElements(m, b.sp.ClusterIP, b.sp.Port, endpoints, b.endpointsComment())
	return chain
}

// endpointsComment is the comment of the port's endpoint elements: its
// name when they are counted (the traffic collector reads it), else none.
func (b portBuilder) endpointsComment() string {
	if b.cfg.Counters == CountEndpoints {
		return Comment(b.sp.Name)
	}
	return ""
}

// affinityRules: see pickChain.
func (b portBuilder) affinityRules(endpoints []netip.AddrPort) []nft.Rule {
	var sticky []nft.Rule
	cascade := make([]nft.Rule, len(endpoints))
	for i, ep := range endpoints {
		set, chain := b.affinityEndpoint(ep)
		sticky = append(sticky, rule(nft.MatchSet{Fields: []nft.Field{nft.FieldSrcAddr}, Set: set}, nft.Goto(chain)))
		var p []nft.Phrase
		if left := len(endpoints) - i; left > 1 {
			p = append(p, nft.MatchRandom{Mod: uint32(left)})
		}
		cascade[i] = rule(append(p, nft.Goto(chain))...)
	}
	return append(sticky, cascade...)
}

// affinityEndpoint adds (once per endpoint: the cluster and local chains
// share them) the set of clients stuck to ep and the chain that DNATs to
// ep and refreshes the client's entry, the shape upstream uses:
//
//	set affinity-… { type ipv4_addr; size 65535; flags dynamic,timeout; timeout 3h }
//	chain endpoint-… { update @affinity-… { ip saddr }; meta l4proto tcp dnat to 10.244.1.11:8080 }
//
// The timeout is part of the set's name, so changing it replaces the set.
func (b portBuilder) affinityEndpoint(ep netip.AddrPort) (set, chain string) {
	suffix := "__" + endpointText(ep)
	set = objectName(kindAffinity, nameHash(b.sp.Name, ep.String(), b.sp.AffinityTimeout.String()), b.sp.Name, suffix)
	chain = objectName(kindEndpoint, nameHash(b.sp.Name, ep.String()), b.sp.Name, suffix)
	for _, s := range b.fr.Sets {
		if s.Name == set {
			return set, chain
		}
	}
	b.fr.Sets = append(b.fr.Sets, &nft.Set{Name: set, Key: []nft.DataType{addrType(ep.Addr())},
		Dynamic: true, Timeout: b.sp.AffinityTimeout, Size: affinitySetSize})
	b.fr.Chains = append(b.fr.Chains, &nft.Chain{Name: chain, Rules: []nft.Rule{
		rule(nft.UpdateSet{Field: nft.FieldSrcAddr, Set: set}, nft.MatchL4Proto{Proto: b.sp.Name.Protocol}, nft.DNAT{To: ep}),
	}})
	return set, chain
}

// affinitySetSize bounds the clients remembered per endpoint (upstream's).
const affinitySetSize = 65535

func addrType(a netip.Addr) nft.DataType {
	if a.Is4() {
		return nft.IPv4.AddrType()
	}
	return nft.IPv6.AddrType()
}

func rule(p ...nft.Phrase) nft.Rule { return nft.Rule{Phrases: p} }
