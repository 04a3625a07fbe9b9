package model

import (
	"net/netip"
	"slices"
	"time"

	"github.com/nftproxy/nftproxy/nft"
)

// ServicePortState is what this node does for one port of a Service in one
// IP family. Traffic to ClusterIP:Port over Protocol goes to one of the
// Endpoints (with InternalLocal, of the LocalEndpoints); traffic to an
// external frontend (NodePort, ExternalIPs, LoadBalancerIPs) likewise, with
// ExternalLocal deciding between the two. No endpoint: reject.
type ServicePortState struct {
	Name      ServicePortName
	ClusterIP netip.Addr
	Port      uint16
	NodePort  uint16 // 0: none

	ExternalIPs     []netip.Addr   // of this family
	LoadBalancerIPs []netip.Addr   // of this family
	SourceRanges    []netip.Prefix // of this family; only for LoadBalancerIPs

	InternalLocal   bool
	ExternalLocal   bool
	AffinityTimeout time.Duration // 0: no session affinity

	// Endpoints serve cluster-wide traffic: ready ones (narrowed by
	// topology hints when they apply), or if none is ready the serving
	// terminating ones. LocalEndpoints are those on this node, chosen the
	// same way among the node's own. Both sorted.
	Endpoints      []netip.AddrPort
	LocalEndpoints []netip.AddrPort
	// LocalReady counts this node's ready endpoints: what the health check
	// of an ExternalLocal Service reports (terminating ones do not count,
	// so load balancers drain the node).
	LocalReady int
}

// HasExternal reports whether the port can be reached from outside the
// cluster: a NodePort, an external IP or a load balancer IP.
func (sp *ServicePortState) HasExternal() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) > 0 || len(sp.LoadBalancerIPs) > 0
}

// ServicePorts derives the service ports of one Service in family f from the
// Service and its EndpointSlices of that family, as seen from node. A
// Service without a ClusterIP in the family has none.
func ServicePorts(f nft.Family, node Node, svc *Service, slices []*EndpointSlice) []ServicePortState {
	var vip netip.Addr
	for _, ip := range svc.ClusterIPs {
		if f.Contains(ip) {
			vip = ip
		}
	}
	if !vip.IsValid() {
		return nil
	}
	ext, lb, ranges := addrsOf(f, svc.ExternalIPs), addrsOf(f, svc.LoadBalancerIPs), prefixesOf(f, svc.SourceRanges)
	out := make([]ServicePortState, 0, len(svc.Ports))
	for _, p := range svc.Ports {
		sp := ServicePortState{
			Name:            ServicePortName{ServiceName: svc.Name, Port: p.Name, Protocol: p.Protocol},
			ClusterIP:       vip,
			Port:            p.Port,
			NodePort:        p.NodePort,
			ExternalIPs:     ext,
			LoadBalancerIPs: lb,
			InternalLocal:   svc.InternalLocal,
			AffinityTimeout: svc.AffinityTimeout,
		}
		if len(lb) > 0 {
			sp.SourceRanges = ranges
		}
		// externalTrafficPolicy only means something for a port that can
		// be reached from outside (the API server clears it otherwise).
		sp.ExternalLocal = svc.ExternalLocal && sp.HasExternal()
		categorize(&sp, node, p, slices)
		out = append(out, sp)
	}
	return out
}

// candidate is one endpoint of a service port, with what categorize needs.
type candidate struct {
	ap  netip.AddrPort
	ep  *Endpoint
	loc bool
}

// categorize picks the endpoints of a service port. For cluster-wide
// traffic: the ready ones, narrowed by topology hints when every ready
// endpoint has them and some are for this node or its zone; if none is
// ready, the serving and terminating ones (so connections drain to
// terminating pods rather than fail); never non-serving ones. For local
// traffic the same choice is made among this node's endpoints alone,
// without hints. An endpoint listed in several slices counts once. The
// endpoint port is the slice port with the same name and protocol as the
// service port (port remapping).
func categorize(sp *ServicePortState, node Node, p ServicePort, slices []*EndpointSlice) {
	n := 0
	for _, s := range slices {
		n += len(s.Endpoints)
	}
	all := make([]candidate, 0, n)
	var seen map[netip.AddrPort]bool // only for many endpoints: see listed
	if n > dedupScanMax {
		seen = make(map[netip.AddrPort]bool, n)
	}
	for _, s := range slices {
		port, ok := slicePort(s, p)
		if !ok {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			ap := netip.AddrPortFrom(e.IP.Addr(), port)
			if !(e.Ready || e.Serving && e.Terminating) || listed(all, seen, ap) {
				continue
			}
			if seen != nil {
				seen[ap] = true
			}
			all = append(all, candidate{ap: ap, ep: e, loc: e.OnNode(node.Name)})
		}
	}
	cluster := readyOrTerminating(all, func(candidate) bool { return true })
	sp.Endpoints = addrPorts(topologyFilter(cluster, node))
	sp.LocalEndpoints = addrPorts(readyOrTerminating(all, func(c candidate) bool { return c.loc }))
	for _, c := range all {
		if c.loc && c.ep.Ready {
			sp.LocalReady++
		}
	}
}

// dedupScanMax is the number of endpoints up to which categorize finds
// duplicates by scanning the candidates rather than with a map: a map per
// service port was a large share of the model's allocations in a full sync
// (docs/code-figures.md), and nearly every Service has a few endpoints.
const dedupScanMax = 32

// listed reports whether ap is among the candidates: in seen if there is
// one, else by a scan of all.
func listed(all []candidate, seen map[netip.AddrPort]bool, ap netip.AddrPort) bool {
	if seen != nil {
		return seen[ap]
	}
	for _, c := range all {
		if c.ap == ap {
			return true
		}
	}
	return false
}

// readyOrTerminating returns the ready candidates that pass keep, or if
// there are none, the serving terminating ones.
func readyOrTerminating(all []candidate, keep func(candidate) bool) []candidate {
	if everyReady(all, keep) {
		return all // the common case, without a copy
	}
	var ready, terminating []candidate
	for _, c := range all {
		switch {
		case !keep(c):
		case c.ep.Ready:
			ready = append(ready, c)
		case c.ep.Serving && c.ep.Terminating:
			terminating = append(terminating, c)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return terminating
}

func everyReady(all []candidate, keep func(candidate) bool) bool {
	for _, c := range all {
		if !c.ep.Ready || !keep(c) {
			return false
		}
	}
	return true
}

// topologyFilter applies EndpointSlice hints: the endpoints hinted for
// this node, if every endpoint has node hints and some are for this node;
// else those hinted for the node's zone, if every endpoint has zone hints
// and some are for this zone; else all of them. (The controller sets hints
// on all endpoints or none; a partial set means a transition.)
func topologyFilter(eps []candidate, node Node) []candidate {
	if len(eps) == 0 {
		return eps
	}
	allNode, allZone, forNode, forZone := true, true, false, false
	for _, c := range eps {
		allNode = allNode && len(c.ep.NodeHints()) > 0
		allZone = allZone && len(c.ep.ZoneHints()) > 0
		forNode = forNode || slices.Contains(c.ep.NodeHints(), node.Name)
		forZone = forZone || node.Zone != "" && slices.Contains(c.ep.ZoneHints(), node.Zone)
	}
	var keep func(candidate) bool
	switch {
	case allNode && forNode:
		keep = func(c candidate) bool { return slices.Contains(c.ep.NodeHints(), node.Name) }
	case allZone && forZone:
		keep = func(c candidate) bool { return slices.Contains(c.ep.ZoneHints(), node.Zone) }
	default:
		return eps
	}
	var out []candidate
	for _, c := range eps {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

func addrPorts(cs []candidate) []netip.AddrPort {
	if len(cs) == 0 {
		return nil
	}
	out := make([]netip.AddrPort, len(cs))
	for i, c := range cs {
		out[i] = c.ap
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
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

func addrsOf(f nft.Family, addrs []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if f.Contains(a) {
			out = append(out, a)
		}
	}
	return out
}

func prefixesOf(f nft.Family, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if f.Contains(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}
