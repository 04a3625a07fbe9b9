package nft

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed/netnstest"
)

// testNS is a fresh network namespace for one kernel test (netnstest.New,
// nftproxy-t-<random>, needing root, `ip` and `nft`). The root namespace
// is never touched: every Netlink of a test is opened on ns.Fd.
type testNS struct{ *netnstest.NS }

func newTestNS(t testing.TB) *testNS {
	t.Helper()
	return &testNS{netnstest.New(t, "nftproxy-t", "nft")}
}

// nft runs nft in the namespace with optional stdin.
func (ns *testNS) nft(stdin string, args ...string) (string, error) {
	return ns.Run(stdin, append([]string{"nft"}, args...)...)
}

func (ns *testNS) mustNft(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := ns.nft(stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// list returns `nft list table <family> nftproxy`.
func (ns *testNS) list(t testing.TB, f Family) string {
	t.Helper()
	return ns.mustNft(t, "", "list", "table", f.String(), TableName)
}

// netlink opens a Netlink on the namespace, closed when the test ends.
func (ns *testNS) netlink(t testing.TB) *Netlink {
	t.Helper()
	n, err := NewNetlink(NetlinkOptions{NetNSFd: ns.Fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func apply(t testing.TB, n *Netlink, tx *Transaction) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

// addr picks the IPv4 or IPv6 form of a test address.
func addr(f Family, v4, v6 string) netip.Addr {
	if f == IPv6 {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

func prefix(f Family, v4, v6 string) netip.Prefix {
	if f == IPv6 {
		return netip.MustParsePrefix(v6)
	}
	return netip.MustParsePrefix(v4)
}

// backends returns n (≤ 16) distinct backend addresses of service number
// svc: 10.128.0.0/10 in IPv4, fd00:244::<svc>:<j> in IPv6.
func backends(f Family, svc, n int, port uint16) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for j := range n {
		var a netip.Addr
		if f == IPv6 {
			a = netip.MustParseAddr(fmt.Sprintf("fd00:244::%x:%x", svc, j+1))
		} else {
			k := svc*16 + j
			a = netip.AddrFrom4([4]byte{10, byte(128 + k>>16), byte(k >> 8), byte(k)})
		}
		out[j] = netip.AddrPortFrom(a, port)
	}
	return out
}

var (
	tcp = Int(uint32(ProtoTCP))
	udp = Int(uint32(ProtoUDP))
)

// everyPhraseRuleset uses every phrase kind and every set shape nftproxy
// writes, with upstream kube-proxy's object names.
func everyPhraseRuleset(f Family) *Ruleset {
	rs := NewRuleset(f)
	at := f.AddrType()
	svcIP := addr(f, "10.96.0.10", "fd00:96::10")
	svcIP2 := addr(f, "10.96.0.11", "fd00:96::11")
	rs.AddSet(&Set{Name: "service-ips", Key: []DataType{at, TypeInetProto, TypeInetService},
		Data: []DataType{TypeVerdict}, Comment: "ClusterIP, ExternalIP and LoadBalancer IP traffic"})
	rs.AddSet(&Set{Name: "service-nodeports", Key: []DataType{TypeInetProto, TypeInetService},
		Data: []DataType{TypeVerdict}, Comment: "NodePort traffic"})
	rs.AddSet(&Set{Name: "cluster-ips", Key: []DataType{at}, Comment: "Active ClusterIPs"})
	rs.AddSet(&Set{Name: "nodeport-ips", Key: []DataType{at}})
	rs.AddSet(&Set{Name: "hairpin-connections", Key: []DataType{at, at, TypeInetProto, TypeInetService},
		Comment: "service hairpin connections"})
	rs.AddSet(&Set{Name: "affinity-ABC", Key: []DataType{at}, Timeout: 10 * time.Minute, Dynamic: true, Size: 65535})

	rs.AddChain(&Chain{Name: "nat-prerouting", Base: &BaseChain{ChainNAT, HookPrerouting, PriorityDstNAT}})
	rs.AddChain(&Chain{Name: "nat-output", Base: &BaseChain{ChainNAT, HookOutput, PriorityDstNAT}})
	rs.AddChain(&Chain{Name: "nat-postrouting", Base: &BaseChain{ChainNAT, HookPostrouting, PrioritySrcNAT}})
	rs.AddChain(&Chain{Name: "filter-forward", Base: &BaseChain{ChainFilter, HookForward, PriorityFilter}})
	rs.AddChain(&Chain{Name: "filter-output-pre-dnat", Base: &BaseChain{ChainFilter, HookOutput, PriorityPreDstNATFilter}})
	for _, name := range []string{"services", "masquerading", "cluster-ips-check", "prefixes", "svc-a", "svc-b", "svc-c"} {
		rs.AddChain(&Chain{Name: name})
	}
	rs.Append("nat-prerouting", Rule{Phrases: []Phrase{Jump("services")}})
	rs.Append("nat-output", Rule{Phrases: []Phrase{Jump("services")}})
	rs.Append("nat-postrouting", Rule{Phrases: []Phrase{Jump("masquerading")}})
	rs.Append("filter-forward", Rule{Phrases: []Phrase{MatchCtStateNew{}, Jump("cluster-ips-check")}})
	rs.Append("cluster-ips-check", Rule{Phrases: []Phrase{
		MatchSet{Fields: []Field{FieldDstAddr}, Set: "cluster-ips"}, RejectTCPReset{}}})
	rs.Append("filter-output-pre-dnat", Rule{Phrases: []Phrase{MatchCtStateNew{}, Jump("cluster-ips-check")}})
	rs.Append("nat-output", Rule{Phrases: []Phrase{MatchCtStateNew{}, Jump("prefixes")}})
	rs.Append("services", Rule{Phrases: []Phrase{
		MatchSet{Fields: []Field{FieldDstAddr}, Set: "cluster-ips"},
		MatchPrefix{Field: FieldSrcAddr, Prefix: prefix(f, "10.244.0.0/16", "fd00:244::/64"), Negate: true},
		SetMarkBits{Bits: 0x4000}}, Comment: "masquerade clusterIP traffic from outside cluster"})
	rs.Append("services", Rule{Phrases: []Phrase{
		VmapLookup{Fields: []Field{FieldDstAddr, FieldL4Proto, FieldDstPort}, Map: "service-ips"}}})
	rs.Append("services", Rule{Phrases: []Phrase{
		MatchSet{Fields: []Field{FieldDstAddr}, Set: "nodeport-ips"},
		VmapLookup{Fields: []Field{FieldL4Proto, FieldDstPort}, Map: "service-nodeports"}}})
	rs.Append("masquerading", Rule{Phrases: []Phrase{
		MatchMarkBits{Mask: 0x4000}, ToggleMarkBits{Bits: 0x4000}, Masquerade{}}})
	rs.Append("masquerading", Rule{Phrases: []Phrase{
		MatchCtStatusDNAT{},
		MatchSet{Fields: []Field{FieldSrcAddr, FieldDstAddr, FieldL4Proto, FieldDstPort}, Set: "hairpin-connections"},
		Masquerade{}}})
	rs.Append("cluster-ips-check", Rule{Phrases: []Phrase{
		MatchSet{Fields: []Field{FieldDstAddr}, Set: "cluster-ips"}, Reject{}},
		Comment: "Reject traffic to invalid ports of ClusterIPs"})
	rs.Append("cluster-ips-check", Rule{Phrases: []Phrase{
		MatchPrefix{Field: FieldDstAddr, Prefix: prefix(f, "10.96.0.0/12", "fd00:96::/108")}, Drop()},
		Comment: "Drop traffic to unallocated ClusterIPs"})
	rs.Append("prefixes", Rule{Phrases: []Phrase{
		MatchPrefix{Field: FieldSrcAddr, Prefix: prefix(f, "10.0.0.1/32", "fd00::1/128"), Negate: true},
		VerdictPhrase{Verdict{Kind: VerdictAccept}}}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{
		MatchPrefix{Field: FieldDstAddr, Prefix: prefix(f, "10.10.1.0/24", "fd00:10:1::/60")}, Goto("svc-a")}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{
		MatchPrefix{Field: FieldDstAddr, Prefix: prefix(f, "192.168.0.0/23", "fd00:10:2::/48")},
		MatchSet{Fields: []Field{FieldSrcAddr, FieldDstAddr, FieldL4Proto, FieldDstPort}, Set: "hairpin-connections", Negate: true},
		VerdictPhrase{Verdict{Kind: VerdictReturn}}}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{
		MatchSet{Fields: []Field{FieldSrcAddr}, Set: "affinity-ABC", Negate: true}, Jump("svc-b")}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{MatchFibLocal{Field: FieldDstAddr},
		MatchPrefix{Field: FieldDstAddr, Prefix: prefix(f, "127.0.0.0/8", "::1/128"), Negate: true},
		VmapLookup{Fields: []Field{FieldL4Proto, FieldDstPort}, Map: "service-nodeports"}}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{MatchFibLocal{Field: FieldSrcAddr}, Goto("svc-a")}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{UpdateSet{Field: FieldSrcAddr, Set: "affinity-ABC"}, MatchL4Proto{Proto: ProtoTCP}, DNAT{To: backends(f, 4, 1, 8080)[0]}}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{MatchIifname{Name: "cbr0"}, Goto("svc-a")}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{MatchIifname{Name: "veth", Prefix: true}, Goto("svc-a")}})
	rs.Append("prefixes", Rule{Phrases: []Phrase{MatchIifname{Name: "veth", Prefix: true, Negate: true}, SetMarkBits{Bits: 0x4000}}})
	// Cascades of 2, 1 and 12 backends: the last rule of each is an
	// unguarded DNAT, svc-b has only that one.
	rs.Chains["svc-a"].Rules = dnatCascade(ProtoTCP, backends(f, 1, 2, 8080))
	rs.Chains["svc-b"].Rules = dnatCascade(ProtoUDP, backends(f, 2, 1, 53))
	rs.Chains["svc-c"].Rules = dnatCascade(ProtoSCTP, backends(f, 3, 12, 9999))

	// Shape s: endpoints maps per protocol and a chain of DNATMap rules.
	shardN := uint32(10)
	shard := fmt.Sprintf("shard-%d", shardN)
	epMap := func(proto uint8) string { return fmt.Sprintf("endpoints-%s-%d", ProtoName(proto), shardN) }
	for _, proto := range []uint8{ProtoTCP, ProtoUDP, ProtoSCTP} {
		m := rs.AddSet(NewEndpointsMap(f, epMap(proto), proto))
		if proto == ProtoUDP {
			m.Comment = "UDP endpoints of " + shard
		}
	}
	rs.AddChain(&Chain{Name: shard})
	// Slots: TCP's the shard number, UDP's 0 (nft prints no offset), SCTP's
	// the last one.
	slots := map[uint8]uint16{ProtoTCP: uint16(shardN), ProtoUDP: 0, ProtoSCTP: EndpointsSlots - 1}
	for _, proto := range []uint8{ProtoTCP, ProtoUDP, ProtoSCTP} {
		rs.Append(shard, Rule{Phrases: []Phrase{DNATMap{Proto: proto, Map: epMap(proto), Slot: slots[proto]}}})
	}
	rs.Append("services", Rule{Phrases: []Phrase{Goto(shard)}})
	for _, e := range EndpointsElements(slots[ProtoTCP], backends(f, 5, 3, 8080)) {
		rs.AddElement(epMap(ProtoTCP), e)
	}
	for _, e := range EndpointsElements(slots[ProtoUDP], backends(f, 6, 1, 53)) {
		e.Comment = "default/dns:dns"
		rs.AddElement(epMap(ProtoUDP), e)
	}
	// A single bucket, and the last one alone (its range ends at the
	// last key an end element can name).
	last := uint32(slots[ProtoSCTP]) * EndpointBuckets
	rs.AddElement(epMap(ProtoSCTP), Element{Key: []Datum{Int(last + 7)}, End: last + 7,
		Data: []Datum{Addr(backends(f, 7, 1, 1)[0].Addr()), Int(1)}})
	rs.AddElement(epMap(ProtoSCTP), Element{Key: []Datum{Int(last + 65535)}, End: last + 65535,
		Data: []Datum{Addr(backends(f, 7, 2, 2)[1].Addr()), Int(2)}})

	rs.AddElement("service-ips", Element{Key: []Datum{Addr(svcIP), tcp, Int(80)},
		Verdict: &Verdict{Kind: VerdictGoto, Chain: "svc-a"}, Comment: "default/web:http"})
	rs.AddElement("service-ips", Element{Key: []Datum{Addr(svcIP), udp, Int(53)},
		Verdict: &Verdict{Kind: VerdictGoto, Chain: "svc-b"}})
	rs.AddElement("service-ips", Element{Key: []Datum{Addr(svcIP2), tcp, Int(443)},
		Verdict: &Verdict{Kind: VerdictDrop}, Comment: "default/none:https"})
	rs.AddElement("service-nodeports", Element{Key: []Datum{tcp, Int(30080)},
		Verdict: &Verdict{Kind: VerdictJump, Chain: "svc-c"}})
	rs.AddElement("cluster-ips", Element{Key: []Datum{Addr(svcIP)}})
	rs.AddElement("cluster-ips", Element{Key: []Datum{Addr(svcIP2)}})
	rs.AddElement("nodeport-ips", Element{Key: []Datum{Addr(addr(f, "10.10.0.58", "fd00:10::58"))}})
	be := backends(f, 1, 1, 8080)[0]
	rs.AddElement("hairpin-connections", Element{Key: []Datum{Addr(be.Addr()), Addr(be.Addr()), tcp, Int(8080)}})
	return rs
}

// testService is one Service port of realisticRuleset.
type testService struct {
	index     int
	clusterIP netip.Addr
	backends  []netip.AddrPort
	nodePort  uint32 // 0: none
}

func (s testService) name() string { return fmt.Sprintf("default/svc-%d/tcp/http", s.index) }
func (s testService) chain() string {
	return fmt.Sprintf("service-%08X-%s", uint32(s.index)*2654435761, s.name())
}
func (s testService) external() string {
	return fmt.Sprintf("external-%08X-%s", uint32(s.index)*2654435761, s.name())
}

// makeServices returns count Services with nBackends endpoints each.
func makeServices(f Family, count, nBackends int) []testService {
	out := make([]testService, count)
	for i := range out {
		out[i] = makeService(f, i, nBackends)
	}
	return out
}

// makeService returns Service number i. Every 10th has a NodePort; every
// 50th has no endpoints.
func makeService(f Family, i, nBackends int) testService {
	s := testService{index: i}
	if f == IPv6 {
		s.clusterIP = netip.MustParseAddr(fmt.Sprintf("fd00:96::%x", i+10))
	} else {
		k := i + 10
		s.clusterIP = netip.AddrFrom4([4]byte{10, byte(96 + k>>16), byte(k >> 8), byte(k)})
	}
	if i%50 != 49 {
		s.backends = backends(f, i, nBackends, 8080)
	}
	if i%10 == 9 {
		s.nodePort = uint32(30000 + i/10%2768)
	}
	return s
}

// realisticRuleset has the shape of upstream kube-proxy's nftables table
// (pkg/proxy/nftables in kubernetes v1.36) for the given Services.
func realisticRuleset(f Family, svcs []testService) *Ruleset {
	rs := NewRuleset(f)
	at := f.AddrType()
	vmap := func(name, comment string, key ...DataType) {
		rs.AddSet(&Set{Name: name, Key: key, Data: []DataType{TypeVerdict}, Comment: comment})
	}
	rs.AddSet(&Set{Name: "cluster-ips", Key: []DataType{at}, Comment: "Active ClusterIPs"})
	rs.AddSet(&Set{Name: "nodeport-ips", Key: []DataType{at}, Comment: "IPs that accept NodePort traffic"})
	rs.AddSet(&Set{Name: "hairpin-connections", Key: []DataType{at, at, TypeInetProto, TypeInetService},
		Comment: "service hairpin connections"})
	vmap("service-ips", "ClusterIP, ExternalIP and LoadBalancer IP traffic", at, TypeInetProto, TypeInetService)
	vmap("service-nodeports", "NodePort traffic", TypeInetProto, TypeInetService)
	vmap("no-endpoint-services", "vmap to drop or reject packets to services with no endpoints",
		at, TypeInetProto, TypeInetService)
	vmap("no-endpoint-nodeports", "vmap to drop or reject packets to service nodeports with no endpoints",
		TypeInetProto, TypeInetService)
	vmap("firewall-ips", "destinations that are subject to LoadBalancerSourceRanges",
		at, TypeInetProto, TypeInetService)

	base := func(name string, t ChainType, h Hook, prio int32, rules ...[]Phrase) {
		rs.AddChain(&Chain{Name: name, Base: &BaseChain{t, h, prio}})
		for _, r := range rules {
			rs.Append(name, Rule{Phrases: r})
		}
	}
	newJump := func(chain string) []Phrase { return []Phrase{MatchCtStateNew{}, Jump(chain)} }
	base("filter-prerouting-pre-dnat", ChainFilter, HookPrerouting, PriorityPreDstNATFilter, newJump("firewall-check"))
	base("filter-output-pre-dnat", ChainFilter, HookOutput, PriorityPreDstNATFilter, newJump("firewall-check"))
	base("filter-input", ChainFilter, HookInput, PriorityFilter,
		newJump("nodeport-endpoints-check"), newJump("service-endpoints-check"))
	base("filter-forward", ChainFilter, HookForward, PriorityFilter,
		newJump("service-endpoints-check"), newJump("cluster-ips-check"))
	base("filter-output", ChainFilter, HookOutput, PriorityFilter,
		newJump("service-endpoints-check"), newJump("cluster-ips-check"))
	base("nat-prerouting", ChainNAT, HookPrerouting, PriorityDstNAT, []Phrase{Jump("services")})
	base("nat-output", ChainNAT, HookOutput, PriorityDstNAT, []Phrase{Jump("services")})
	base("nat-postrouting", ChainNAT, HookPostrouting, PrioritySrcNAT, []Phrase{Jump("masquerading")})

	daddr3 := []Field{FieldDstAddr, FieldL4Proto, FieldDstPort}
	port2 := []Field{FieldL4Proto, FieldDstPort}
	chain := func(name string, rules ...Rule) {
		rs.AddChain(&Chain{Name: name, Rules: rules})
	}
	chain("nodeport-endpoints-check", Rule{Phrases: []Phrase{
		MatchSet{Fields: []Field{FieldDstAddr}, Set: "nodeport-ips"}, VmapLookup{port2, "no-endpoint-nodeports"}}})
	chain("service-endpoints-check", Rule{Phrases: []Phrase{VmapLookup{daddr3, "no-endpoint-services"}}})
	chain("firewall-check", Rule{Phrases: []Phrase{VmapLookup{daddr3, "firewall-ips"}}})
	chain("services",
		Rule{Phrases: []Phrase{MatchSet{Fields: []Field{FieldDstAddr}, Set: "cluster-ips"},
			MatchPrefix{Field: FieldSrcAddr, Prefix: prefix(f, "10.128.0.0/10", "fd00:244::/64"), Negate: true},
			SetMarkBits{0x4000}}, Comment: "masquerade clusterIP traffic from outside cluster"},
		Rule{Phrases: []Phrase{VmapLookup{daddr3, "service-ips"}}},
		Rule{Phrases: []Phrase{MatchSet{Fields: []Field{FieldDstAddr}, Set: "nodeport-ips"}, VmapLookup{port2, "service-nodeports"}}})
	chain("masquerading",
		Rule{Phrases: []Phrase{MatchMarkBits{0x4000}, ToggleMarkBits{0x4000}, Masquerade{}}},
		Rule{Phrases: []Phrase{MatchCtStatusDNAT{}, MatchSet{Fields: []Field{FieldSrcAddr, FieldDstAddr, FieldL4Proto, FieldDstPort},
			Set: "hairpin-connections"}, Masquerade{}}})
	chain("cluster-ips-check",
		Rule{Phrases: []Phrase{MatchSet{Fields: []Field{FieldDstAddr}, Set: "cluster-ips"}, Reject{}},
			Comment: "Reject traffic to invalid ports of ClusterIPs"},
		Rule{Phrases: []Phrase{MatchPrefix{Field: FieldDstAddr, Prefix: prefix(f, "10.96.0.0/12", "fd00:96::/108")}, Drop()},
			Comment: "Drop traffic to unallocated ClusterIPs"})
	chain("reject-chain", Rule{Phrases: []Phrase{Reject{}}})
	rs.AddElement("nodeport-ips", Element{Key: []Datum{Addr(addr(f, "10.10.0.58", "fd00:10::58"))}})

	for _, s := range svcs {
		addService(rs, s)
	}
	return rs
}

// addService adds one Service's chains and elements.
func addService(rs *Ruleset, s testService) {
	key := []Datum{Addr(s.clusterIP), tcp, Int(80)}
	rs.AddElement("cluster-ips", Element{Key: []Datum{Addr(s.clusterIP)}})
	if len(s.backends) == 0 {
		rs.AddElement("no-endpoint-services", Element{Key: key, Comment: s.name(),
			Verdict: &Verdict{Kind: VerdictGoto, Chain: "reject-chain"}})
		return
	}
	rs.AddChain(&Chain{Name: s.chain(), Rules: dnatCascade(ProtoTCP, s.backends)})
	rs.AddElement("service-ips", Element{Key: key, Comment: s.name(),
		Verdict: &Verdict{Kind: VerdictGoto, Chain: s.chain()}})
	if s.nodePort != 0 {
		rs.AddChain(&Chain{Name: s.external(), Rules: []Rule{
			{Phrases: []Phrase{SetMarkBits{0x4000}}, Comment: "masquerade"},
			{Phrases: []Phrase{Goto(s.chain())}}}})
		rs.AddElement("service-nodeports", Element{Key: []Datum{tcp, Int(s.nodePort)}, Comment: s.name(),
			Verdict: &Verdict{Kind: VerdictGoto, Chain: s.external()}})
	}
}

// dnatCascade picks one of the backends uniformly at random, as
// proxier/ruleset's dnatCascade writes it:
//
//	meta l4proto tcp numgen random mod 3 0 dnat to 10.244.1.11:8080
//	meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.12:8080
//	meta l4proto tcp dnat to 10.244.1.13:8080
func dnatCascade(proto uint8, backends []netip.AddrPort) []Rule {
	rules := make([]Rule, len(backends))
	for i, be := range backends {
		p := []Phrase{MatchL4Proto{proto}}
		if left := len(backends) - i; left > 1 {
			p = append(p, MatchRandom{Mod: uint32(left)})
		}
		rules[i] = Rule{Phrases: append(p, DNAT{To: be})}
	}
	return rules
}
