package model

import (
	"net/netip"
	"slices"
	"testing"
	"unsafe"

	"github.com/nftproxy/nftproxy/nft"
)

func TestServicePorts(t *testing.T) {
	web := ServiceName{Namespace: "default", Name: "web"}
	svc := &Service{Name: web, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
		Ports: []ServicePort{{Name: "http", Protocol: nft.ProtoTCP, Port: 80}, {Name: "dns", Protocol: nft.ProtoUDP, Port: 53}}}
	ep := func(addr string, ready, serving, terminating bool) Endpoint {
		return Endpoint{IP: IPOf(netip.MustParseAddr(addr)), Ready: ready, Serving: serving, Terminating: terminating}
	}
	ports := []EndpointPort{{Name: "http", Protocol: nft.ProtoTCP, Port: 8080}, {Name: "dns", Protocol: nft.ProtoUDP, Port: 5353}}
	tests := []struct {
		name   string
		family nft.Family
		slices []*EndpointSlice
		want   map[string][]string // port name → endpoints
	}{
		{"no slices: no endpoints", nft.IPv4, nil, map[string][]string{"http": nil, "dns": nil}},
		{"ready endpoints with port remap", nft.IPv4, []*EndpointSlice{{Family: nft.IPv4, Ports: ports,
			Endpoints: []Endpoint{ep("10.244.2.2", true, true, false), ep("10.244.1.1", true, true, false)}}},
			map[string][]string{"http": {"10.244.1.1:8080", "10.244.2.2:8080"}, "dns": {"10.244.1.1:5353", "10.244.2.2:5353"}}},
		{"terminating used only when none is ready", nft.IPv4, []*EndpointSlice{{Family: nft.IPv4, Ports: ports,
			Endpoints: []Endpoint{ep("10.244.1.1", false, true, true), ep("10.244.1.2", false, false, true)}}},
			map[string][]string{"http": {"10.244.1.1:8080"}, "dns": {"10.244.1.1:5353"}}},
		{"ready preferred to terminating", nft.IPv4, []*EndpointSlice{{Family: nft.IPv4, Ports: ports,
			Endpoints: []Endpoint{ep("10.244.1.1", false, true, true), ep("10.244.1.3", true, true, false)}}},
			map[string][]string{"http": {"10.244.1.3:8080"}, "dns": {"10.244.1.3:5353"}}},
		{"same endpoint in two slices counts once", nft.IPv4, []*EndpointSlice{
			{Family: nft.IPv4, Ports: ports, Endpoints: []Endpoint{ep("10.244.1.1", true, true, false)}},
			{Family: nft.IPv4, Ports: ports, Endpoints: []Endpoint{ep("10.244.1.1", true, true, false)}}},
			map[string][]string{"http": {"10.244.1.1:8080"}, "dns": {"10.244.1.1:5353"}}},
		{"slice port must match name and protocol", nft.IPv4, []*EndpointSlice{{Family: nft.IPv4,
			Ports:     []EndpointPort{{Name: "http", Protocol: nft.ProtoUDP, Port: 8080}},
			Endpoints: []Endpoint{ep("10.244.1.1", true, true, false)}}},
			map[string][]string{"http": nil, "dns": nil}},
		{"IPv6 family uses the IPv6 ClusterIP", nft.IPv6, []*EndpointSlice{{Family: nft.IPv6, Ports: ports,
			Endpoints: []Endpoint{ep("fd00:244:1::5", true, true, false)}}},
			map[string][]string{"http": {"[fd00:244:1::5]:8080"}, "dns": {"[fd00:244:1::5]:5353"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ServicePorts(tc.family, Node{Name: "n1"}, svc, tc.slices)
			if len(got) != 2 {
				t.Fatalf("got %d service ports, want 2", len(got))
			}
			for _, sp := range got {
				if !tc.family.Contains(sp.ClusterIP) {
					t.Errorf("%s: ClusterIP %v not of family %s", sp.Name, sp.ClusterIP, tc.family)
				}
				var eps []string
				for _, e := range sp.Endpoints {
					eps = append(eps, e.String())
				}
				if !slices.Equal(eps, tc.want[sp.Name.Port]) {
					t.Errorf("%s: endpoints %v, want %v", sp.Name, eps, tc.want[sp.Name.Port])
				}
			}
		})
	}
}

func TestSingleStackServiceHasNoOtherFamily(t *testing.T) {
	svc := &Service{Name: ServiceName{"a", "b"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports: []ServicePort{{Protocol: nft.ProtoTCP, Port: 80}}}
	if got := ServicePorts(nft.IPv6, Node{}, svc, nil); len(got) != 0 {
		t.Errorf("IPv4-only service has IPv6 ports: %+v", got)
	}
}

// TestLocalAndTopology: which endpoints serve cluster-wide and node-local
// traffic, from the point of view of node n1 in zone a.
func TestLocalAndTopology(t *testing.T) {
	svc := &Service{Name: ServiceName{"ns", "s"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports: []ServicePort{{Name: "p", Protocol: nft.ProtoTCP, Port: 80}}}
	ports := []EndpointPort{{Name: "p", Protocol: nft.ProtoTCP, Port: 8080}}
	type ep struct {
		addr, node         string
		ready, terminating bool
		zones, nodes       []string
	}
	node := Node{Name: "n1", Zone: "a"}
	tests := []struct {
		name           string
		eps            []ep
		cluster, local []string
		localReady     int
	}{
		{"local and remote", []ep{{addr: "10.0.0.1", node: "n1", ready: true}, {addr: "10.0.0.2", node: "n2", ready: true}},
			[]string{"10.0.0.1", "10.0.0.2"}, []string{"10.0.0.1"}, 1},
		{"no local", []ep{{addr: "10.0.0.2", node: "n2", ready: true}}, []string{"10.0.0.2"}, nil, 0},
		{"local terminating only: used locally, not counted ready", []ep{
			{addr: "10.0.0.1", node: "n1", terminating: true}, {addr: "10.0.0.2", node: "n2", ready: true}},
			[]string{"10.0.0.2"}, []string{"10.0.0.1"}, 0},
		{"zone hints narrow cluster endpoints", []ep{
			{addr: "10.0.0.1", node: "n3", ready: true, zones: []string{"a"}}, {addr: "10.0.0.2", node: "n2", ready: true, zones: []string{"b"}}},
			[]string{"10.0.0.1"}, nil, 0},
		{"zone hints for other zones only: all", []ep{
			{addr: "10.0.0.1", node: "n3", ready: true, zones: []string{"c"}}, {addr: "10.0.0.2", node: "n2", ready: true, zones: []string{"b"}}},
			[]string{"10.0.0.1", "10.0.0.2"}, nil, 0},
		{"partial hints are ignored", []ep{
			{addr: "10.0.0.1", node: "n3", ready: true, zones: []string{"a"}}, {addr: "10.0.0.2", node: "n2", ready: true}},
			[]string{"10.0.0.1", "10.0.0.2"}, nil, 0},
		{"node hints first", []ep{
			{addr: "10.0.0.1", node: "n1", ready: true, zones: []string{"a"}, nodes: []string{"n1"}},
			{addr: "10.0.0.2", node: "n2", ready: true, zones: []string{"a"}, nodes: []string{"n2"}}},
			[]string{"10.0.0.1"}, []string{"10.0.0.1"}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			es := &EndpointSlice{Family: nft.IPv4, Ports: ports}
			for _, e := range tc.eps {
				es.Endpoints = append(es.Endpoints, Endpoint{IP: IPOf(netip.MustParseAddr(e.addr)),
					Ready: e.ready, Serving: e.ready || e.terminating, Terminating: e.terminating,
					Place: &Placement{NodeName: e.node, Zones: e.zones, Nodes: e.nodes}})
			}
			got := ServicePorts(nft.IPv4, node, svc, []*EndpointSlice{es})[0]
			addrs := func(aps []netip.AddrPort) []string {
				var out []string
				for _, a := range aps {
					out = append(out, a.Addr().String())
				}
				return out
			}
			if c, l := addrs(got.Endpoints), addrs(got.LocalEndpoints); !slices.Equal(c, tc.cluster) || !slices.Equal(l, tc.local) || got.LocalReady != tc.localReady {
				t.Errorf("cluster %v local %v localReady %d; want %v %v %d", c, l, got.LocalReady, tc.cluster, tc.local, tc.localReady)
			}
		})
	}
}

// TestExternalFields: external frontends are split by family; source
// ranges only apply with load balancer IPs; externalTrafficPolicy only
// with an external frontend.
func TestExternalFields(t *testing.T) {
	svc := &Service{Name: ServiceName{"ns", "s"},
		ClusterIPs:      []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")},
		Ports:           []ServicePort{{Name: "p", Protocol: nft.ProtoUDP, Port: 53, NodePort: 30053}},
		ExternalIPs:     []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")},
		LoadBalancerIPs: []netip.Addr{netip.MustParseAddr("192.0.2.2")},
		SourceRanges:    []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:1::/48")},
		ExternalLocal:   true}
	v4 := ServicePorts(nft.IPv4, Node{}, svc, nil)[0]
	v6 := ServicePorts(nft.IPv6, Node{}, svc, nil)[0]
	if len(v4.ExternalIPs) != 1 || len(v4.LoadBalancerIPs) != 1 || len(v4.SourceRanges) != 1 || !v4.ExternalLocal || v4.NodePort != 30053 {
		t.Errorf("IPv4: %+v", v4)
	}
	if len(v6.ExternalIPs) != 1 || len(v6.LoadBalancerIPs) != 0 || len(v6.SourceRanges) != 0 || !v6.ExternalLocal {
		t.Errorf("IPv6 (no LB IP, so no source ranges): %+v", v6)
	}
	svc.ExternalIPs, svc.LoadBalancerIPs, svc.Ports[0].NodePort = nil, nil, 0
	if sp := ServicePorts(nft.IPv4, Node{}, svc, nil)[0]; sp.ExternalLocal || sp.HasExternal() {
		t.Errorf("no external frontend, yet external: %+v", sp)
	}
}

// TestDuplicateEndpoints: an endpoint listed twice counts once, as its
// first usable listing (a non-serving listing does not hide a later ready
// one), whether categorize finds duplicates by scanning (few endpoints) or
// with a map (more than dedupScanMax).
func TestDuplicateEndpoints(t *testing.T) {
	svc := &Service{Name: ServiceName{"ns", "s"}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")},
		Ports: []ServicePort{{Name: "p", Protocol: nft.ProtoTCP, Port: 80}}}
	ports := []EndpointPort{{Name: "p", Protocol: nft.ProtoTCP, Port: 8080}}
	for _, n := range []int{2, dedupScanMax + 8} {
		var first, second []Endpoint
		for i := 0; i < n; i++ {
			a := netip.AddrFrom4([4]byte{10, 244, 0, byte(i)})
			// Even: not serving, then ready on n1. Odd: ready on n1, then
			// ready on n2 (ignored).
			first = append(first, Endpoint{IP: IPOf(a), Ready: i%2 == 1, Serving: i%2 == 1, Place: &Placement{NodeName: "n1"}})
			second = append(second, Endpoint{IP: IPOf(a), Ready: true, Serving: true, Place: &Placement{NodeName: map[bool]string{true: "n2", false: "n1"}[i%2 == 1]}})
		}
		slices := []*EndpointSlice{{Family: nft.IPv4, Ports: ports, Endpoints: first}, {Family: nft.IPv4, Ports: ports, Endpoints: second}}
		sp := ServicePorts(nft.IPv4, Node{Name: "n1"}, svc, slices)[0]
		if len(sp.Endpoints) != n || len(sp.LocalEndpoints) != n || sp.LocalReady != n {
			t.Errorf("%d endpoints listed twice: %d cluster, %d local, %d local ready; want %d each",
				n, len(sp.Endpoints), len(sp.LocalEndpoints), sp.LocalReady, n)
		}
	}
}

// TestEndpointSize: a million endpoints at 100,000 Services × 10; each
// byte more is a megabyte of live heap.
func TestEndpointSize(t *testing.T) {
	if n := unsafe.Sizeof(Endpoint{}); n > 32 {
		t.Errorf("an Endpoint takes %d bytes, want at most 32", n)
	}
}

func TestIP(t *testing.T) {
	for _, s := range []string{"10.1.2.3", "0.0.0.0", "255.255.255.255", "fd00::1", "::", "::ffff:10.1.2.3", "2001:db8::ffff:0:1"} {
		a := netip.MustParseAddr(s)
		if got := IPOf(a).Addr(); got != a {
			t.Errorf("IPOf(%v).Addr() = %v", a, got)
		}
	}
	if got := IPOf(netip.MustParseAddr("fe80::1%eth0")).Addr(); got != netip.MustParseAddr("fe80::1") {
		t.Errorf("zone kept: %v", got)
	}
}
