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
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Protocol uint8 // nft.ProtoTCP, ProtoUDP, ProtoSCTP
	Port     uint16
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
// used, as upstream does.
type Endpoint struct {
	Addr        netip.Addr
	Ready       bool
	Serving     bool
	Terminating bool
	NodeName    string
}

// SliceKey identifies an EndpointSlice.
type SliceKey struct {
	Namespace, Name string
}

func (k SliceKey) String() string { return fmt.Sprintf("%s/%s", k.Namespace, k.Name) }
