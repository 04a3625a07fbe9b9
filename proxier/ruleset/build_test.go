package ruleset

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/trace"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

var testConfig = Config{
	LocalTraffic:   LocalDetector{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
	ServiceCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
	MasqueradeMark: 0x4000,
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ip(s string) netip.Addr     { return netip.MustParseAddr(s) }

func spName(ns, name, port string, proto uint8) model.ServicePortName {
	return model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

// testState: web (tcp 80 → 2 endpoints on 8080, one of them on this node),
// dns (udp 53 → 1, on this node), empty (tcp 80, no endpoints).
func testState() []model.ServicePortState {
	return []model.ServicePortState{
		{Name: spName("default", "web", "http", nft.ProtoTCP), ClusterIP: ip("10.96.0.10"), Port: 80,
			Endpoints:      []netip.AddrPort{ap("10.244.1.11:8080"), ap("10.244.2.12:8080")},
			LocalEndpoints: []netip.AddrPort{ap("10.244.1.11:8080")}},
		{Name: spName("kube-system", "dns", "dns", nft.ProtoUDP), ClusterIP: ip("10.96.0.53"), Port: 53,
			Endpoints: []netip.AddrPort{ap("10.244.1.20:5353")}, LocalEndpoints: []netip.AddrPort{ap("10.244.1.20:5353")}},
		{Name: spName("default", "empty", "", nft.ProtoTCP), ClusterIP: ip("10.96.0.20"), Port: 80},
	}
}

func apply(t *testing.T, fk *nftfake.Fake, committed, desired *nft.Ruleset) *nft.Transaction {
	t.Helper()
	tx := nft.Diff(committed, desired)
	if err := fk.Apply(context.Background(), tx); err != nil {
		t.Fatalf("apply: %v", err)
	}
	return tx
}

func TestFlows(t *testing.T) {
	fk := nftfake.New()
	apply(t, fk, nil, Build(testConfig, nft.IPv4, testState()))
	tr := trace.New(fk.Rulesets(), ip("10.10.0.11"))

	pod, outside := ip("10.244.1.5"), ip("10.10.0.99")
	tests := []struct {
		name       string
		pkt        trace.Packet
		verdict    nft.VerdictKind
		dnat       []netip.AddrPort
		masquerade bool
	}{
		{"pod to ClusterIP", trace.Packet{Src: pod, Dst: ip("10.96.0.10"), Proto: nft.ProtoTCP, DPort: 80},
			nft.VerdictAccept, []netip.AddrPort{ap("10.244.1.11:8080"), ap("10.244.2.12:8080")}, false},
		{"outside to ClusterIP is masqueraded", trace.Packet{Src: outside, Dst: ip("10.96.0.10"), Proto: nft.ProtoTCP, DPort: 80},
			nft.VerdictAccept, []netip.AddrPort{ap("10.244.1.11:8080"), ap("10.244.2.12:8080")}, true},
		{"node to ClusterIP is masqueraded", trace.Packet{Src: ip("10.10.0.11"), Dst: ip("10.96.0.10"), Proto: nft.ProtoTCP, DPort: 80, FromNode: true},
			nft.VerdictAccept, []netip.AddrPort{ap("10.244.1.11:8080"), ap("10.244.2.12:8080")}, true},
		{"udp port remap", trace.Packet{Src: pod, Dst: ip("10.96.0.53"), Proto: nft.ProtoUDP, DPort: 53},
			nft.VerdictAccept, []netip.AddrPort{ap("10.244.1.20:5353")}, false},
		{"tcp to a udp port is rejected", trace.Packet{Src: pod, Dst: ip("10.96.0.53"), Proto: nft.ProtoTCP, DPort: 53},
			trace.VerdictReject, nil, false},
		{"wrong port is rejected", trace.Packet{Src: pod, Dst: ip("10.96.0.10"), Proto: nft.ProtoTCP, DPort: 81},
			trace.VerdictReject, nil, false},
		{"no endpoints is rejected", trace.Packet{Src: pod, Dst: ip("10.96.0.20"), Proto: nft.ProtoTCP, DPort: 80},
			trace.VerdictReject, nil, false},
		{"no endpoints from the node is rejected", trace.Packet{Src: ip("10.10.0.11"), Dst: ip("10.96.0.20"), Proto: nft.ProtoTCP, DPort: 80, FromNode: true},
			trace.VerdictReject, nil, false},
		{"unallocated ClusterIP is dropped", trace.Packet{Src: pod, Dst: ip("10.96.5.5"), Proto: nft.ProtoTCP, DPort: 80},
			nft.VerdictDrop, nil, false},
		{"other traffic is untouched", trace.Packet{Src: pod, Dst: ip("10.244.2.12"), Proto: nft.ProtoTCP, DPort: 8080},
			nft.VerdictAccept, nil, false},
		{"hairpin is masqueraded", trace.Packet{Src: ip("10.244.1.11"), Dst: ip("10.96.0.10"), Proto: nft.ProtoTCP, DPort: 80},
			nft.VerdictAccept, []netip.AddrPort{ap("10.244.1.11:8080"), ap("10.244.2.12:8080")}, true},
		// Another node's endpoint is DNATed on its own node: this node
		// keeps no hairpin element for it.
		{"another node's endpoint is not hairpin-masqueraded here", trace.Packet{Src: ip("10.244.2.12"), Dst: ip("10.96.0.10"), Proto: nft.ProtoTCP, DPort: 80},
			nft.VerdictAccept, []netip.AddrPort{ap("10.244.1.11:8080"), ap("10.244.2.12:8080")}, false},
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

func TestResyncIsEmpty(t *testing.T) {
	fk := nftfake.New()
	first := Build(testConfig, nft.IPv4, testState())
	apply(t, fk, nil, first)
	if tx := nft.Diff(first, Build(testConfig, nft.IPv4, testState())); !tx.Empty() {
		t.Fatalf("unchanged state gives %d ops: %+v", len(tx.Ops), tx.Ops)
	}
}

// TestChangesCostTheirSize: moving one endpoint, scaling a Service and
// removing one each touch a handful of objects, whatever the
// number of Services; moving endpoints touches elements only.
func TestChangesCostTheirSize(t *testing.T) {
	elementsOnly := func(t *testing.T, what string, tx *nft.Transaction) {
		t.Helper()
		for _, op := range tx.Ops {
			if op.Kind != nft.OpAddElements && op.Kind != nft.OpDeleteElements {
				t.Errorf("%s: %s", what, op.Kind)
			}
		}
	}
	for _, n := range []int{10, 1000} {
		st := bigState(n)
		fk := nftfake.New()
		slots := NewSlots()
		committed := BuildSlots(testConfig, nft.IPv4, st, slots)
		apply(t, fk, nil, committed)
		step := func(what string, want int) *nft.Transaction {
			t.Helper()
			desired := BuildSlots(testConfig, nft.IPv4, st, slots)
			tx := apply(t, fk, committed, desired)
			if got := tx.Changes(); got != want {
				t.Errorf("n=%d: %s touched %d objects, want %d: %+v", n, what, got, want, tx.Ops)
			}
			committed = desired
			return tx
		}

		sp := &st[n/2]
		sp.Endpoints = append([]netip.AddrPort{ap("10.244.9.9:8080")}, sp.Endpoints[1:]...)
		sp.LocalEndpoints = sp.Endpoints
		// Its pick map element and its hairpin element: out and in.
		elementsOnly(t, "endpoint move", step("endpoint move", 2+2))

		sp.Endpoints = sp.Endpoints[:1]
		sp.LocalEndpoints = sp.Endpoints
		// The first Service with one endpoint: the map of one and its
		// chain and rule. Pick elements 5 out and 1 in, hairpins 4 out,
		// its service-ips element out and in (to the new chain).
		step("scale down", 3+5+1+4+2)

		st = st[1:]
		// cluster-ips, service-ips, 5 hairpin elements and 5 pick
		// elements out; no chain of its own.
		elementsOnly(t, "service removal", step("service removal", 1+1+5+5))
	}
}

func bigState(n int) []model.ServicePortState {
	var st []model.ServicePortState
	for i := 0; i < n; i++ {
		sp := model.ServicePortState{
			Name:      spName("ns", "svc"+strconv.Itoa(i), "http", nft.ProtoTCP),
			ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80,
		}
		for j := 0; j < 5; j++ {
			sp.Endpoints = append(sp.Endpoints, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), uint16(8000+j)))
		}
		sp.LocalEndpoints = sp.Endpoints // all on this node: each has a hairpin element
		st = append(st, sp)
	}
	return st
}

// TestPrefixesOfEverything: a loadBalancerSourceRanges entry of 0.0.0.0/0
// (a common way of writing "no restriction") lets every source in, and a
// ServiceCIDR of 0.0.0.0/0 drops nothing: neither writes a match of every
// address, which nft and our encoder cannot write (the whole sync failed).
func TestPrefixesOfEverything(t *testing.T) {
	cfg := testConfig
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
	lb := model.ServicePortState{Name: spName("default", "lb", "", nft.ProtoTCP), ClusterIP: ip("10.96.0.30"), Port: 80,
		LoadBalancerIPs: []netip.Addr{ip("192.0.2.30")},
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("0.0.0.0/0")},
		Endpoints:       []netip.AddrPort{ap("10.244.2.30:8080")}}
	rs := Build(cfg, nft.IPv4, append(testState(), lb))
	fk := nftfake.New()
	apply(t, fk, nil, rs)
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			for _, p := range r.Phrases {
				if m, ok := p.(nft.MatchPrefix); ok && m.Prefix.Bits() == 0 {
					t.Errorf("chain %s: %s", c.Name, r.Text(nft.IPv4))
				}
			}
		}
	}
	tr := trace.New(fk.Rulesets(), ip("10.10.0.11"))
	if res := tr.Trace(trace.Packet{Src: ip("203.0.113.7"), Dst: ip("192.0.2.30"), Proto: nft.ProtoTCP, DPort: 80}); res.Verdict != nft.VerdictAccept ||
		!slices.Equal(res.DNAT, lb.Endpoints) {
		t.Errorf("load balancer IP from anywhere: %s %v", res.Verdict, res.DNAT)
	}
	if res := tr.Trace(trace.Packet{Src: ip("10.244.1.5"), Dst: ip("10.96.5.5"), Proto: nft.ProtoTCP, DPort: 80}); res.Verdict != nft.VerdictAccept {
		t.Errorf("an address no Service has: %s, want it untouched", res.Verdict)
	}
}
