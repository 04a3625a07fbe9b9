package scenarios

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// diffDeliberate lists where nftproxy deliberately gives another outcome
// than upstream kube-proxy (the newest release of e2e/tools/versions) for a
// probe of TestDifferential (keys are diffRow.key(), outcomes as the table
// prints them), each with its reason. Anything else that differs fails the
// test, and so does an entry whose difference no longer shows.
//
// Empty today (against v1.36.3 and v1.37.2). The difference expected from
// kubernetes#131765 (a pod on a node without a local endpoint dialing an
// eTP=Local Service's external or LB IP: dropped by upstream, served by
// nftproxy) does not exist since kubernetes#132456 (cherry-picked to 1.33
// as #133969) fixed it. Upstream keeps the external IPs in service-ips
// with the external- chain even without a local endpoint, and that chain's
// "short-circuit pod traffic" / "short-circuit local traffic" rules DNAT in
// nat prerouting/output, before the no-endpoint-services /
// no-endpoint-nodeports drop in the filter hooks can match ("DROP anything
// that didn't get short-circuited by the EXT chain",
// pkg/proxy/nftables/proxier.go). The rows "eTP=Local, only endpoint on
// n3: ..." from pod and from node show both proxies serving b3.
var diffDeliberate = []diffKnown{}

// TestDifferential runs the same probes through node n1 (nftproxy) and node
// n2 (upstream kube-proxy, nftables mode) on one API state and asserts the
// outcomes, normalised relative to the node, agree except for diffDeliberate.
//
//	n1: nftproxy,   backend a1, client pod c1
//	n2: kube-proxy, backend a2, client pod c2
//	n3: no proxy,   backend b3
//	ext: no proxy, the outside client; external, LB and cluster IPs are
//	     routed to the node under test before each probe.
func TestDifferential(t *testing.T) {
	started := time.Now()
	d := diffNewBed(t)
	s1, s2 := d.sides[0], d.sides[1]
	a1, a2, b3 := s1.backend, s2.backend, d.b3

	// The API objects, created once, before the proxies start: both see the
	// same state from their first sync.
	cluster := v1.ServiceTypeClusterIP
	cip := d.create("cip", cluster, true, true, nil)
	d.slices(cip, a1, a2)
	none := d.create("none", cluster, false, true, nil)
	d.slices(none)
	np := d.create("np", v1.ServiceTypeNodePort, true, true, nil)
	d.slices(np, a1, a2)
	eipAddr := netip.MustParseAddr("10.10.0.201")
	eip := d.create("eip", cluster, false, false, func(s *v1.Service) { s.Spec.ExternalIPs = []string{eipAddr.String()} })
	d.slices(eip, a1, a2)
	lbAddr, lbDenyAddr := netip.MustParseAddr("10.10.0.202"), netip.MustParseAddr("10.10.0.203")
	lb := d.create("lb", v1.ServiceTypeLoadBalancer, false, false, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", d.ext.IPv4.String() + "/32"}
	})
	d.slices(lb, a1, a2)
	lb = d.setIngress(lb, lbAddr)
	lbDeny := d.create("lb-deny", v1.ServiceTypeLoadBalancer, false, false, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
	})
	d.slices(lbDeny, a1, a2)
	lbDeny = d.setIngress(lbDeny, lbDenyAddr)
	local := func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
	etpAddr, etp3Addr := netip.MustParseAddr("10.10.0.204"), netip.MustParseAddr("10.10.0.205")
	etp := d.create("etp", v1.ServiceTypeLoadBalancer, false, false, local)
	d.slices(etp, a1, a2)
	etp = d.setIngress(etp, etpAddr)
	etp3 := d.create("etp3", v1.ServiceTypeLoadBalancer, false, false, local)
	d.slices(etp3, b3)
	etp3 = d.setIngress(etp3, etp3Addr)
	npNone := d.create("np-none", v1.ServiceTypeNodePort, false, false, nil)
	d.slices(npNone)
	itpLocal := func(s *v1.Service) {
		p := v1.ServiceInternalTrafficPolicyLocal
		s.Spec.InternalTrafficPolicy = &p
	}
	itp := d.create("itp", cluster, false, false, itpLocal)
	d.slices(itp, a1, a2)
	itp3 := d.create("itp3", cluster, false, false, itpLocal)
	d.slices(itp3, b3)
	aff := d.create("aff", cluster, false, false, func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP })
	d.slices(aff, a1, a2)

	// An address of the service CIDR (10.96.0.0/12) that no Service has.
	unalloc := netip.MustParseAddr("10.96.250.250")
	for _, svc := range []*v1.Service{cip, none, np, npNone, eip, lb, lbDeny, etp, etp3, itp, itp3, aff} {
		for _, ip := range svc.Spec.ClusterIPs {
			if ip == unalloc.String() {
				t.Fatalf("%s was allocated to %s; pick another unallocated address", ip, svc.Name)
			}
		}
	}

	d.startProxies()
	t.Logf("bed, objects and proxies ready after %v", time.Since(started).Round(100*time.Millisecond))

	at := func(a netip.Addr, port uint16) func(*diffSide) netip.AddrPort {
		return func(*diffSide) netip.AddrPort { return netip.AddrPortFrom(a, port) }
	}
	nodePort := func(svc *v1.Service, proto v1.Protocol, v6 bool) func(*diffSide) netip.AddrPort {
		p := diffNodePort(svc, proto)
		return func(s *diffSide) netip.AddrPort {
			if v6 {
				return netip.AddrPortFrom(s.node.IPv6, p)
			}
			return netip.AddrPortFrom(s.node.IPv4, p)
		}
	}
	v4, v6 := v1.IPv4Protocol, v1.IPv6Protocol
	var rows []diffRow
	for _, from := range []string{"pod", "node"} {
		rows = append(rows,
			diffRow{what: "ClusterIP, endpoints on n1+n2", proto: "tcp", target: at(diffClusterIP(cip, v4), 80)},
			diffRow{what: "ClusterIP, endpoints on n1+n2", proto: "udp", target: at(diffClusterIP(cip, v4), 80)},
			diffRow{what: "ClusterIP IPv6, endpoints on n1+n2", proto: "tcp", target: at(diffClusterIP(cip, v6), 80)},
			diffRow{what: "ClusterIP, undefined port", proto: "tcp", target: at(diffClusterIP(cip, v4), 81)},
			diffRow{what: "ClusterIP, no endpoints", proto: "tcp", target: at(diffClusterIP(none, v4), 80)},
			diffRow{what: "ClusterIP, no endpoints", proto: "udp", target: at(diffClusterIP(none, v4), 80)},
			diffRow{what: "unallocated service IP", proto: "tcp", target: at(unalloc, 80)},
			diffRow{what: "NodePort eTP=Cluster", proto: "tcp", target: nodePort(np, v1.ProtocolTCP, false)},
			diffRow{what: "NodePort, no endpoints", proto: "tcp", target: nodePort(npNone, v1.ProtocolTCP, false)},
			diffRow{what: "ExternalIP", proto: "tcp", target: at(eipAddr, 80)},
			diffRow{what: "LB IP, ranges allow ext", proto: "tcp", target: at(lbAddr, 80)},
			diffRow{what: "LB IP, ranges exclude ext", proto: "tcp", target: at(lbDenyAddr, 80)},
			diffRow{what: "eTP=Local, endpoints on n1+n2: LB IP", proto: "tcp", target: at(etpAddr, 80)},
			diffRow{what: "eTP=Local, endpoints on n1+n2: NodePort", proto: "tcp", target: nodePort(etp, v1.ProtocolTCP, false)},
			diffRow{what: "eTP=Local, only endpoint on n3: LB IP", proto: "tcp", target: at(etp3Addr, 80)},
			diffRow{what: "eTP=Local, only endpoint on n3: NodePort", proto: "tcp", target: nodePort(etp3, v1.ProtocolTCP, false)},
			diffRow{what: "iTP=Local, endpoints on n1+n2", proto: "tcp", target: at(diffClusterIP(itp, v4), 80)},
			diffRow{what: "iTP=Local, only endpoint on n3", proto: "tcp", target: at(diffClusterIP(itp3, v4), 80)},
			diffRow{what: "sessionAffinity ClientIP", proto: "tcp", target: at(diffClusterIP(aff, v4), 80), sticky: true},
		)
		for i := range rows {
			if rows[i].from == "" {
				rows[i].from = from
			}
		}
	}
	ext := func(r diffRow) diffRow { r.from = "ext"; return r }
	hc := func(svc *v1.Service) func(*diffSide) netip.AddrPort {
		return func(s *diffSide) netip.AddrPort {
			return netip.AddrPortFrom(s.node.IPv4, uint16(svc.Spec.HealthCheckNodePort))
		}
	}
	rows = append(rows,
		ext(diffRow{what: "ClusterIP, endpoints on n1+n2", proto: "tcp", target: at(diffClusterIP(cip, v4), 80), route: true}),
		ext(diffRow{what: "ClusterIP, undefined port", proto: "tcp", target: at(diffClusterIP(cip, v4), 81), route: true}),
		ext(diffRow{what: "ClusterIP, no endpoints", proto: "tcp", target: at(diffClusterIP(none, v4), 80), route: true}),
		ext(diffRow{what: "unallocated service IP", proto: "tcp", target: at(unalloc, 80), route: true}),
		ext(diffRow{what: "iTP=Local, endpoints on n1+n2", proto: "tcp", target: at(diffClusterIP(itp, v4), 80), route: true}),
		ext(diffRow{what: "NodePort, no endpoints", proto: "tcp", target: nodePort(npNone, v1.ProtocolTCP, false)}),
		ext(diffRow{what: "NodePort eTP=Cluster", proto: "tcp", target: nodePort(np, v1.ProtocolTCP, false)}),
		ext(diffRow{what: "NodePort eTP=Cluster", proto: "udp", target: nodePort(np, v1.ProtocolUDP, false)}),
		ext(diffRow{what: "NodePort eTP=Cluster, IPv6", proto: "tcp", target: nodePort(np, v1.ProtocolTCP, true)}),
		ext(diffRow{what: "ExternalIP", proto: "tcp", target: at(eipAddr, 80), route: true}),
		ext(diffRow{what: "LB IP, ranges allow ext", proto: "tcp", target: at(lbAddr, 80), route: true}),
		ext(diffRow{what: "LB NodePort, ranges allow ext", proto: "tcp", target: nodePort(lb, v1.ProtocolTCP, false)}),
		ext(diffRow{what: "LB IP, ranges exclude ext", proto: "tcp", target: at(lbDenyAddr, 80), route: true}),
		ext(diffRow{what: "LB NodePort, ranges exclude ext", proto: "tcp", target: nodePort(lbDeny, v1.ProtocolTCP, false)}),
		ext(diffRow{what: "eTP=Local, endpoints on n1+n2: LB IP", proto: "tcp", target: at(etpAddr, 80), route: true}),
		ext(diffRow{what: "eTP=Local, endpoints on n1+n2: NodePort", proto: "tcp", target: nodePort(etp, v1.ProtocolTCP, false)}),
		ext(diffRow{what: "eTP=Local, only endpoint on n3: LB IP", proto: "tcp", target: at(etp3Addr, 80), route: true}),
		ext(diffRow{what: "eTP=Local, only endpoint on n3: NodePort", proto: "tcp", target: nodePort(etp3, v1.ProtocolTCP, false)}),
		ext(diffRow{what: "eTP=Local, endpoints on n1+n2: healthCheckNodePort", proto: "http", target: hc(etp)}),
		ext(diffRow{what: "eTP=Local, only endpoint on n3: healthCheckNodePort", proto: "http", target: hc(etp3)}),
		ext(diffRow{what: "proxy :10256/healthz", proto: "http", target: func(s *diffSide) netip.AddrPort { return netip.AddrPortFrom(s.node.IPv4, 10256) }}),
		diffRow{what: "NodePort eTP=Cluster on 127.0.0.1", from: "node", proto: "tcp",
			target: at(netip.MustParseAddr("127.0.0.1"), diffNodePort(np, v1.ProtocolTCP))},
		diffRow{what: "ClusterIP, endpoints on n1+n2 (hairpin)", from: "self", proto: "tcp", target: at(diffClusterIP(cip, v4), 80)},
	)

	keys := map[string]bool{}
	for _, r := range rows {
		keys[r.key()] = true
	}
	for _, k := range diffDeliberate {
		if !keys[k.key] {
			t.Errorf("diffDeliberate entry %q names no probe", k.key)
		}
	}

	probing := time.Now()
	results := d.compareAll(rows, diffDeliberate)

	var b strings.Builder
	fmt.Fprintf(&b, "%d probes, each through n1 (nftproxy) and n2 (kube-proxy), in %v; outcomes relative to the node:\n",
		len(rows), time.Since(probing).Round(100*time.Millisecond))
	fmt.Fprintf(&b, "  backend: self | local | remote (the other proxied node) | n3; source seen: client | node | other\n")
	fmt.Fprintf(&b, "%-66s %-24s %-24s %s\n", "probe", "n1 nftproxy", "n2 kube-proxy", "verdict")
	failed := 0
	for _, r := range results {
		mark := r.verdict
		if r.attempts > 1 {
			mark += fmt.Sprintf(" (%d runs)", r.attempts)
		}
		fmt.Fprintf(&b, "%-66s %-24s %-24s %s\n", r.row.key(), r.out[0].norm, r.out[1].norm, mark)
		if r.verdict == "DIFF" {
			failed++
		}
	}
	for _, r := range results {
		for i, e := range r.earlier {
			fmt.Fprintf(&b, "  %s, run %d: %s\n", r.row.key(), i+1, e)
		}
	}
	t.Log("\n" + b.String())
	b.Reset()
	fmt.Fprintf(&b, "deliberate differences (diffDeliberate): %d\n", len(diffDeliberate))
	for _, k := range diffDeliberate {
		fmt.Fprintf(&b, "  %s: nftproxy %q, kube-proxy %q — %s\n", k.key, k.nftproxy, k.upstream, k.reason)
	}
	t.Log("\n" + b.String())

	if failed == 0 && !t.Failed() {
		t.Logf("all %d probes agree (or differ as documented); %v in all", len(rows), time.Since(started).Round(time.Second))
		return
	}
	for _, r := range results {
		if r.verdict != "DIFF" {
			continue
		}
		want := "the same outcome"
		if r.known != nil {
			want = fmt.Sprintf("the documented difference (nftproxy %q, kube-proxy %q)", r.known.nftproxy, r.known.upstream)
		}
		t.Errorf("%s: want %s after %d runs; last run through n1 (nftproxy): %s [%s]; through n2 (kube-proxy): %s [%s]",
			r.row.key(), want, r.attempts, r.out[0].norm, summarize(r.out[0].raw), r.out[1].norm, summarize(r.out[1].raw))
	}
	t.Logf("nft list table ip nftproxy on n1:\n%s", d.ruleset(s1, "ip"))
	t.Logf("nft list table ip kube-proxy on n2:\n%s", d.ruleset(s2, "ip"))
}
