package model

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

func TestServicePorts(t *testing.T) {
	web := ServiceName{Namespace: "default", Name: "web"}
	svc := &Service{Name: web, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
		Ports: []ServicePort{{Name: "http", Protocol: nft.ProtoTCP, Port: 80}, {Name: "dns", Protocol: nft.ProtoUDP, Port: 53}}}
	ep := func(addr string, ready, serving, terminating bool) Endpoint {
		return Endpoint{Addr: netip.MustParseAddr(addr), Ready: ready, Serving: serving, Terminating: terminating}
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
			got := ServicePorts(tc.family, svc, tc.slices)
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
	if got := ServicePorts(nft.IPv6, svc, nil); len(got) != 0 {
		t.Errorf("IPv4-only service has IPv6 ports: %+v", got)
	}
}
