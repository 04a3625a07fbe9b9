package ruleset

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/trace"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Node 10.10.0.11 has pod 10.244.1.11; 10.244.2.12 is on another node.
var (
	nodeIP   = ip("10.10.0.11")
	localEP  = ap("10.244.1.11:8080")
	remoteEP = ap("10.244.2.12:8080")
	both     = []netip.AddrPort{localEP, remoteEP}
)

func featureConfig() Config {
	cfg := testConfig
	cfg.NodePorts = NodePortAddresses{Addresses: []netip.Addr{nodeIP}}
	return cfg
}

// featureState has one Service per external feature.
func featureState() []model.ServicePortState {
	tcp := func(name string, vip string) model.ServicePortState {
		return model.ServicePortState{Name: spName("default", name, "http", nft.ProtoTCP), ClusterIP: ip(vip), Port: 80,
			Endpoints: both, LocalEndpoints: []netip.AddrPort{localEP}, LocalReady: 1}
	}
	np := tcp("nodeport", "10.96.1.1")
	np.NodePort = 30080
	ext := tcp("extip", "10.96.1.2")
	ext.ExternalIPs = []netip.Addr{ip("10.10.0.201")}
	lb := tcp("lb-local", "10.96.1.3")
	lb.LoadBalancerIPs, lb.SourceRanges, lb.NodePort, lb.ExternalLocal =
		[]netip.Addr{ip("10.10.0.202")}, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, 30081, true
	noLocal := tcp("lb-nolocal", "10.96.1.4")
	noLocal.LoadBalancerIPs, noLocal.NodePort, noLocal.ExternalLocal = []netip.Addr{ip("10.10.0.203")}, 30082, true
	noLocal.Endpoints, noLocal.LocalEndpoints, noLocal.LocalReady = []netip.AddrPort{remoteEP}, nil, 0
	itp := tcp("itp-local", "10.96.1.5")
	itp.InternalLocal = true
	itpNone := tcp("itp-none", "10.96.1.6")
	itpNone.InternalLocal, itpNone.Endpoints, itpNone.LocalEndpoints = true, []netip.AddrPort{remoteEP}, nil
	empty := tcp("nodeport-empty", "10.96.1.7")
	empty.NodePort, empty.ExternalIPs, empty.Endpoints, empty.LocalEndpoints = 30083, []netip.Addr{ip("10.10.0.204")}, nil, nil
	aff := tcp("affinity", "10.96.1.8")
	aff.AffinityTimeout, aff.NodePort = 10*time.Minute, 30084
	return []model.ServicePortState{np, ext, lb, noLocal, itp, itpNone, empty, aff}
}

func TestFeatureFlows(t *testing.T) {
	fk := nftfake.New()
	apply(t, fk, nil, Build(featureConfig(), nft.IPv4, featureState()))
	tr := trace.New(fk.Rulesets(), nodeIP)
	pod, outside, allowed := ip("10.244.1.5"), ip("10.10.0.99"), ip("192.0.2.5")
	pkt := func(src netip.Addr, dst string, port uint16) trace.Packet {
		return trace.Packet{Src: src, Dst: ip(dst), Proto: nft.ProtoTCP, DPort: port}
	}
	fromNode := func(dst string, port uint16) trace.Packet {
		p := pkt(nodeIP, dst, port)
		p.FromNode = true
		return p
	}
	local := []netip.AddrPort{localEP}
	remote := []netip.AddrPort{remoteEP}
	tests := []struct {
		name       string
		pkt        trace.Packet
		verdict    nft.VerdictKind
		dnat       []netip.AddrPort
		masquerade bool
	}{
		{"NodePort from outside, masqueraded", pkt(outside, "10.10.0.11", 30080), nft.VerdictAccept, both, true},
		{"NodePort from the node itself", fromNode("10.10.0.11", 30080), nft.VerdictAccept, both, true},
		{"NodePort from a pod", pkt(pod, "10.10.0.11", 30080), nft.VerdictAccept, both, true},
		{"NodePort on a non-NodePort address is not served", pkt(outside, "10.10.0.12", 30080), nft.VerdictAccept, nil, false},
		{"NodePort on loopback is not served", trace.Packet{Src: ip("127.0.0.1"), Dst: ip("127.0.0.1"), Proto: nft.ProtoTCP, DPort: 30080, FromNode: true},
			nft.VerdictAccept, nil, false},
		{"NodePort without endpoints is rejected", pkt(outside, "10.10.0.11", 30083), trace.VerdictReject, nil, false},
		{"NodePort without endpoints, from the node itself, is rejected (filter-input)", fromNode("10.10.0.11", 30083), trace.VerdictReject, nil, false},
		{"external IP without endpoints is rejected", pkt(outside, "10.10.0.204", 80), trace.VerdictReject, nil, false},
		{"external IP, masqueraded", pkt(outside, "10.10.0.201", 80), nft.VerdictAccept, both, true},
		{"external IP, wrong port untouched", pkt(outside, "10.10.0.201", 81), nft.VerdictAccept, nil, false},
		{"LB IP from an allowed source: local endpoint, source kept", pkt(allowed, "10.10.0.202", 80), nft.VerdictAccept, local, false},
		{"LB IP from outside the source ranges is dropped", pkt(outside, "10.10.0.202", 80), nft.VerdictDrop, nil, false},
		{"NodePort of a source-ranged LB is not filtered", pkt(outside, "10.10.0.11", 30081), nft.VerdictAccept, local, false},
		{"eTP Local without local endpoint: external traffic dropped", pkt(outside, "10.10.0.203", 80), nft.VerdictDrop, nil, false},
		{"eTP Local without local endpoint: NodePort dropped", pkt(outside, "10.10.0.11", 30082), nft.VerdictDrop, nil, false},
		{"eTP Local without local endpoint: pod traffic served (kubernetes#131765)", pkt(pod, "10.10.0.203", 80), nft.VerdictAccept, remote, false},
		{"eTP Local without local endpoint: node traffic served, masqueraded", fromNode("10.10.0.203", 80), nft.VerdictAccept, remote, true},
		{"eTP Local ClusterIP uses all endpoints", pkt(pod, "10.96.1.4", 80), nft.VerdictAccept, remote, false},
		{"iTP Local: local endpoint only", pkt(pod, "10.96.1.5", 80), nft.VerdictAccept, local, false},
		{"iTP Local without local endpoint: dropped", pkt(pod, "10.96.1.6", 80), nft.VerdictDrop, nil, false},
		{"iTP Local without local endpoint, from the node: dropped", fromNode("10.96.1.6", 80), nft.VerdictDrop, nil, false},
		{"affinity: a new client takes the cascade to an endpoint chain", pkt(pod, "10.96.1.8", 80), nft.VerdictAccept, local, false},
		{"affinity on a NodePort", pkt(outside, "10.10.0.11", 30084), nft.VerdictAccept, local, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := tr.Trace(tc.pkt)
			if res.Verdict != tc.verdict || !slices.Equal(res.DNAT, tc.dnat) || res.Masquerade != tc.masquerade {
				t.Errorf("got verdict %s dnat %v masquerade %v; want %s %v %v\ntrace:\n%v",
					res.Verdict, res.DNAT, res.Masquerade, tc.verdict, tc.dnat, tc.masquerade, res.Path)
			}
		})
	}
}

// TestNodePortAddresses: CIDRs open NodePorts on local addresses inside
// them (never loopback); primary opens them on the node's IPs only.
func TestNodePortAddresses(t *testing.T) {
	st := featureState()[:1]
	for _, tc := range []struct {
		name     string
		np       NodePortAddresses
		local    []netip.Addr
		dst      string
		fromNode bool
		served   bool
	}{
		{"primary: node IP", NodePortAddresses{Addresses: []netip.Addr{nodeIP}}, []netip.Addr{nodeIP, ip("10.20.0.1")}, "10.10.0.11", false, true},
		{"primary: other local address", NodePortAddresses{Addresses: []netip.Addr{nodeIP}}, []netip.Addr{nodeIP, ip("10.20.0.1")}, "10.20.0.1", false, false},
		{"CIDR: local address inside", NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}}, []netip.Addr{nodeIP, ip("10.20.0.1")}, "10.20.0.1", false, true},
		{"CIDR: local address outside", NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}}, []netip.Addr{nodeIP, ip("10.20.0.1")}, "10.10.0.11", false, false},
		{"CIDR: non-local address inside", NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}}, []netip.Addr{nodeIP}, "10.20.0.9", false, false},
		{"all: any local address", NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, []netip.Addr{nodeIP, ip("10.20.0.1")}, "10.20.0.1", false, true},
		{"all: never loopback", NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}, []netip.Addr{nodeIP, ip("127.0.0.1")}, "127.0.0.1", true, false},
		{"loopback CIDR: not served by the kernel", NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, []netip.Addr{nodeIP, ip("127.0.0.1")}, "127.0.0.1", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := featureConfig()
			cfg.NodePorts = tc.np
			fk := nftfake.New()
			apply(t, fk, nil, Build(cfg, nft.IPv4, st))
			tr := trace.New(fk.Rulesets(), tc.local...)
			src := ip("10.10.0.99")
			if tc.fromNode {
				src = ip("127.0.0.1")
			}
			res := tr.Trace(trace.Packet{Src: src, Dst: ip(tc.dst), Proto: nft.ProtoTCP, DPort: 30080, FromNode: tc.fromNode})
			if got := len(res.DNAT) > 0; got != tc.served {
				t.Errorf("served %v, want %v\n%v", got, tc.served, res.Path)
			}
		})
	}
}

// TestLocalDetectors: pod traffic is recognised by CIDR or interface; the
// rest of ClusterIP traffic is masqueraded.
func TestLocalDetectors(t *testing.T) {
	st := featureState()[:1]
	for _, tc := range []struct {
		name string
		det  LocalDetector
		pkt  trace.Packet
		masq bool
	}{
		{"CIDR: pod", LocalDetector{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}, trace.Packet{Src: ip("10.244.1.5"), Iif: "eth0"}, false},
		{"CIDR: other", LocalDetector{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}, trace.Packet{Src: ip("10.244.2.5"), Iif: "eth0"}, true},
		{"bridge: pod", LocalDetector{Interface: "cbr0"}, trace.Packet{Src: ip("10.99.0.5"), Iif: "cbr0"}, false},
		{"bridge: other", LocalDetector{Interface: "cbr0"}, trace.Packet{Src: ip("10.244.1.5"), Iif: "eth0"}, true},
		{"prefix: pod", LocalDetector{Interface: "veth", InterfacePrefix: true}, trace.Packet{Src: ip("10.99.0.5"), Iif: "veth1234"}, false},
		{"prefix: other", LocalDetector{Interface: "veth", InterfacePrefix: true}, trace.Packet{Src: ip("10.244.1.5"), Iif: "eth0"}, true},
		{"none: nothing masqueraded", LocalDetector{}, trace.Packet{Src: ip("10.10.0.99"), Iif: "eth0"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := featureConfig()
			cfg.LocalTraffic = tc.det
			fk := nftfake.New()
			apply(t, fk, nil, Build(cfg, nft.IPv4, st))
			p := tc.pkt
			p.Dst, p.Proto, p.DPort = ip("10.96.1.1"), nft.ProtoTCP, 80
			res := trace.New(fk.Rulesets(), nodeIP).Trace(p)
			if len(res.DNAT) == 0 || res.Masquerade != tc.masq {
				t.Errorf("dnat %v masquerade %v, want masquerade %v\n%v", res.DNAT, res.Masquerade, tc.masq, res.Path)
			}
		})
	}
}

// TestFeatureOutcomes: for the packets an operator asks about, the tracer
// names the Service port, each backend with its odds, and why a packet is
// dropped or rejected.
func TestFeatureOutcomes(t *testing.T) {
	fk := nftfake.New()
	apply(t, fk, nil, Build(featureConfig(), nft.IPv4, featureState()))
	tr := trace.New(fk.Rulesets(), nodeIP)
	pod, outside := ip("10.244.1.5"), ip("10.10.0.99")
	pkt := func(src netip.Addr, dst string, port uint16) trace.Packet {
		return trace.Packet{Src: src, Dst: ip(dst), Proto: nft.ProtoTCP, DPort: port}
	}
	tests := []struct {
		name    string
		pkt     trace.Packet
		service string
		reason  string
		to      []netip.AddrPort
		shares  []float64
	}{
		{"ClusterIP: two endpoints, half each", pkt(pod, "10.96.1.1", 80), "default/nodeport:http", "", both, []float64{0.5, 0.5}},
		{"affinity cascade: half each", pkt(pod, "10.96.1.8", 80), "default/affinity:http", "", both, []float64{0.5, 0.5}},
		{"iTP Local: the local endpoint", pkt(pod, "10.96.1.5", 80), "default/itp-local:http", "", []netip.AddrPort{localEP}, []float64{1}},
		{"no endpoints", pkt(outside, "10.10.0.11", 30083), "default/nodeport-empty:http",
			"NodePorts with no endpoints: reject", nil, []float64{1}},
		{"source range", pkt(outside, "10.10.0.202", 80), "default/lb-local:http", "source outside loadBalancerSourceRanges", nil, []float64{1}},
		{"unallocated ClusterIP", pkt(pod, "10.96.9.9", 80), "", "drop traffic to unallocated ClusterIPs", nil, []float64{1}},
		{"wrong port of a ClusterIP", pkt(pod, "10.96.1.1", 81), "", "reject traffic to invalid ports of ClusterIPs", nil, []float64{1}},
		{"iTP Local without local endpoint", pkt(pod, "10.96.1.6", 80), "default/itp-none:http",
			"services with no endpoints: reject, or drop when only a Local policy has none", nil, []float64{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			outs := tr.Outcomes(tc.pkt)
			var to []netip.AddrPort
			var shares []float64
			for _, o := range outs {
				if o.To.IsValid() {
					to = append(to, o.To)
				}
				shares = append(shares, float64(int(o.Share*1000+0.5))/1000)
				if o.Service != tc.service || o.Reason != tc.reason {
					t.Errorf("service %q reason %q, want %q %q\n%v", o.Service, o.Reason, tc.service, tc.reason, o.Path)
				}
			}
			if !slices.Equal(to, tc.to) || !slices.Equal(shares, tc.shares) {
				t.Errorf("outcomes %v shares %v, want %v %v", to, shares, tc.to, tc.shares)
			}
		})
	}
}

// TestMasqueradeBitCleared: no packet leaves with the masquerade bit,
// also when another program's source NAT chain runs before ours and
// masquerades the packet first (flannel's nftables mode does, when a
// packet carries a mark bit besides ours), so that our masquerading chain,
// which clears the bit it acts on, never sees it.
func TestMasqueradeBitCleared(t *testing.T) {
	cfg := featureConfig()
	cfg.MasqueradeAll = true
	fk := nftfake.New()
	apply(t, fk, nil, Build(cfg, nft.IPv4, featureState()))
	const foreignBit = 0x1
	for _, foreign := range []bool{false, true} {
		rulesets := fk.Rulesets()
		if foreign {
			rs := rulesets[nft.IPv4].Clone()
			rs.AddChain(&nft.Chain{Name: "foreign-postrouting",
				Base: &nft.BaseChain{Type: nft.ChainNAT, Hook: nft.HookPostrouting, Priority: nft.PrioritySrcNAT - 1}})
			rs.Append("foreign-postrouting", nft.Rule{Phrases: []nft.Phrase{nft.MatchMarkBits{Mask: foreignBit}, nft.Masquerade{}}})
			rulesets = map[nft.Family]*nft.Ruleset{nft.IPv4: rs}
		}
		p := trace.Packet{Src: ip("10.244.1.5"), Dst: ip("10.96.1.1"), Proto: nft.ProtoTCP, DPort: 80, Mark: foreignBit}
		res := trace.New(rulesets, nodeIP).Trace(p)
		if !res.Masquerade || res.Mark != foreignBit {
			t.Errorf("foreign chain first %v: masquerade %v, mark %#x leaving; want masqueraded, leaving with only %#x\n%v",
				foreign, res.Masquerade, res.Mark, foreignBit, res.Path)
		}
	}
}
