// Package model holds nftproxy's own immutable view of the Kubernetes
// objects it serves, and the pure function that derives this node's service
// model from them. Nothing here imports k8s.io/api: the watch layer converts
// each object once, at the edge.
package model

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/nft"
)

// ServiceName identifies a Service.
type ServiceName struct{ Namespace, Name string }

func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// ServicePortName identifies one port of a Service.
type ServicePortName struct {
	ServiceName
	Port     string // the port's name ("" for an unnamed single port)
	Protocol uint8
}

// String is "ns/name:port" (":port" omitted for an unnamed port), the form
// used in element comments and logs.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.ServiceName.String()
	}
	return n.ServiceName.String() + ":" + n.Port
}

// Service is the part of a Service that the proxy acts on.
type Service struct {
	Name       ServiceName
	ClusterIPs []netip.Addr // at most one per family
	Ports      []ServicePort
	// ExternalIPs (spec.externalIPs) and LoadBalancerIPs (status ingress
	// IPs, except those with ipMode Proxy) are reached from outside the
	// cluster; SourceRanges (spec.loadBalancerSourceRanges) restrict who
	// may use the LoadBalancer IPs.
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	SourceRanges    []netip.Prefix
	// ExternalLocal (externalTrafficPolicy: Local) sends external traffic
	// only to endpoints on the receiving node, keeping the client's source
	// address; InternalLocal (internalTrafficPolicy: Local) does the same
	// for ClusterIP traffic.
	ExternalLocal bool
	InternalLocal bool
	// HealthCheckNodePort answers load balancers' health checks for an
	// ExternalLocal Service; 0 if none.
	HealthCheckNodePort uint16
	// AffinityTimeout is how long a client sticks to its endpoint with
	// sessionAffinity ClientIP; 0: no affinity.
	AffinityTimeout time.Duration
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Protocol uint8 // nft.ProtoTCP, ProtoUDP, ProtoSCTP
	Port     uint16
	NodePort uint16 // 0: none
}

// Node is what the proxy needs to know about the node it runs on.
type Node struct {
	Name string
	// Zone is the node's topology.kubernetes.io/zone label ("" if none).
	Zone string
	// Addresses are the node's primary IPs, at most one per family: its
	// first InternalIP of the family, else its first ExternalIP.
	Addresses []netip.Addr
	// PodCIDRs are the node's pod CIDRs (spec.podCIDRs).
	PodCIDRs []netip.Prefix
}

// EndpointSlice is the part of an EndpointSlice that the proxy acts on.
type EndpointSlice struct {
	Name      string
	Service   ServiceName
	Family    nft.Family
	Ports     []EndpointPort
	Endpoints []Endpoint
	// TriggerTime is when the change this version of the slice reflects
	// happened (annotation endpoints.kubernetes.io/last-change-trigger-time);
	// zero if unknown. It feeds the network programming latency metric.
	TriggerTime time.Time
}

// EndpointPort is one port of an EndpointSlice.
type EndpointPort struct {
	Name     string
	Protocol uint8
	Port     uint16
}

// Endpoint is one endpoint of an EndpointSlice. Only the first address is
// used, as upstream does. There are millions of them at scale, so an
// Endpoint is kept to 32 bytes: a compact address, and its node and hints
// behind one pointer that endpoints placed alike share.
type Endpoint struct {
	IP          IP
	Ready       bool
	Serving     bool
	Terminating bool
	Place       *Placement // nil: no node name and no hints
}

// Placement is where an endpoint runs and whom it should serve. The
// converter gives endpoints with the same values one shared Placement, so
// nothing may change one once it is made.
type Placement struct {
	NodeName string
	// Zones and Nodes are the topology hints set by the EndpointSlice
	// controller: the zones and nodes the endpoint should serve (none: no
	// hint).
	Zones, Nodes []string
}

// OnNode reports whether the endpoint is on the node of this name (an
// unnamed node has none).
func (e *Endpoint) OnNode(node string) bool {
	return node != "" && e.Place != nil && e.Place.NodeName == node
}

// ZoneHints are the zones the endpoint should serve (none: no hint).
func (e *Endpoint) ZoneHints() []string {
	if e.Place == nil {
		return nil
	}
	return e.Place.Zones
}

// NodeHints are the nodes the endpoint should serve (none: no hint).
func (e *Endpoint) NodeHints() []string {
	if e.Place == nil {
		return nil
	}
	return e.Place.Nodes
}

// IP is an IP address without a zone, in 17 bytes rather than the 24 of a
// netip.Addr (whose zone is a pointer).
type IP struct {
	b   [16]byte
	is4 bool
}

// IPOf is a's IP (its zone dropped; the zero Addr is IPv6 ::).
func IPOf(a netip.Addr) IP {
	return IP{b: a.As16(), is4: a.Is4()}
}

// Addr is the address as a netip.Addr.
func (ip IP) Addr() netip.Addr {
	if ip.is4 {
		return netip.AddrFrom4([4]byte(ip.b[12:]))
	}
	return netip.AddrFrom16(ip.b)
}

// SliceKey identifies an EndpointSlice.
type SliceKey struct {
	Namespace, Name string
}

func (k SliceKey) String() string { return fmt.Sprintf("%s/%s", k.Namespace, k.Name) }
