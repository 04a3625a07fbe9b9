package model

import (
	"net/netip"
	"sort"

	"github.com/nftproxy/nftproxy/nft"
)

// ServicePortState is what this node does for one port of a Service in one
// IP family: traffic to ClusterIP:Port over Protocol goes to one of the
// Endpoints, or is rejected when there are none.
type ServicePortState struct {
	Name      ServicePortName
	ClusterIP netip.Addr
	Port      uint16
	Endpoints []netip.AddrPort // sorted; empty: reject
}

// ServicePorts derives the service ports of one Service in family f from the
// Service and its EndpointSlices of that family. A Service without a
// ClusterIP in the family has none.
func ServicePorts(f nft.Family, svc *Service, slices []*EndpointSlice) []ServicePortState {
	var vip netip.Addr
	for _, ip := range svc.ClusterIPs {
		if f.Contains(ip) {
			vip = ip
		}
	}
	if !vip.IsValid() {
		return nil
	}
	out := make([]ServicePortState, 0, len(svc.Ports))
	for _, p := range svc.Ports {
		out = append(out, ServicePortState{
			Name:      ServicePortName{ServiceName: svc.Name, Port: p.Name, Protocol: p.Protocol},
			ClusterIP: vip,
			Port:      p.Port,
			Endpoints: endpointsFor(p, slices),
		})
	}
	return out
}

// endpointsFor picks the endpoints of a service port: the ready ones; if
// there are none, the serving and terminating ones (so connections drain to
// terminating pods rather than fail); never non-serving ones. An endpoint
// listed in several slices counts once. The endpoint port is the slice port
// with the same name and protocol as the service port (port remapping).
func endpointsFor(p ServicePort, slices []*EndpointSlice) []netip.AddrPort {
	ready := map[netip.AddrPort]bool{}
	terminating := map[netip.AddrPort]bool{}
	for _, s := range slices {
		port, ok := slicePort(s, p)
		if !ok {
			continue
		}
		for _, e := range s.Endpoints {
			ap := netip.AddrPortFrom(e.Addr, port)
			switch {
			case e.Ready:
				ready[ap] = true
			case e.Serving && e.Terminating:
				terminating[ap] = true
			}
		}
	}
	chosen := ready
	if len(chosen) == 0 {
		chosen = terminating
	}
	out := make([]netip.AddrPort, 0, len(chosen))
	for ap := range chosen {
		out = append(out, ap)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Compare(out[j]) < 0 })
	return out
}

func slicePort(s *EndpointSlice, p ServicePort) (uint16, bool) {
	for _, sp := range s.Ports {
		if sp.Name == p.Name && sp.Protocol == p.Protocol && sp.Port != 0 {
			return sp.Port, true
		}
	}
	return 0, false
}
