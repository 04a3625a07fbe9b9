// Package benchstate is the API state of e2e/cmd/bench as the watch layer
// converts it, for the benchmarks of every stage (proxier/model,
// proxier/ruleset, nft and proxier; docs/profiles.md): one definition, so
// that their figures describe the same cluster.
//
// Service i is bench/svc-i, a ClusterIP Service (10.96.0.0 + i + 10, port
// http 80/TCP) with one EndpointSlice bench/svc-i-1 of endpoints on port
// 8080 taken from 10.128.0.0/9 and spread over 100 nodes, node-0 being
// this node (Node).
package benchstate

import (
	"fmt"
	"net/netip"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Size is a cluster of Services with one EndpointSlice of Endpoints
// endpoints each.
type Size struct{ Services, Endpoints int }

func (s Size) String() string {
	if s.Services%1000 == 0 {
		return fmt.Sprintf("%dkx%d", s.Services/1000, s.Endpoints)
	}
	return fmt.Sprintf("%dx%d", s.Services, s.Endpoints)
}

// Sizes are the sizes issue 4 asks for.
var Sizes = []Size{{1000, 5}, {10000, 5}, {100000, 5}, {100000, 10}}

// Node is this node.
var Node = model.Node{Name: "node-0", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}

// places are the 100 nodes' placements (no hints), shared by every
// endpoint as the watch layer shares them.
var places = func() (places [100]*model.Placement) {
	for i := range places {
		places[i] = &model.Placement{NodeName: fmt.Sprintf("node-%d", i)}
	}
	return places
}()

// IPv4 is the IPv4 address n.
func IPv4(n uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// ClusterIP is Service i's ClusterIP.
func ClusterIP(i int) netip.Addr { return IPv4(uint32(10<<24|96<<16) + uint32(i+10)) }

// Endpoint is endpoint j of Service i: from 10.128.0.0/9, or for j == 0
// and gen > 0 10.200.0.0 + gen (e2e/cmd/bench's single change).
func Endpoint(sz Size, i, j, gen int) netip.Addr {
	if j == 0 && gen > 0 {
		return IPv4(uint32(10<<24|200<<16) + uint32(gen))
	}
	return IPv4(uint32(10<<24|128<<16) + uint32(i*sz.Endpoints+j))
}

// Service is Service i and its EndpointSlice in generation gen (see
// Endpoint). Like watch.ConvertEndpointSlice, it presizes the endpoints
// and shares the node names.
func Service(sz Size, i, gen int) (*model.Service, *model.EndpointSlice) {
	name := model.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
	svc := &model.Service{Name: name, ClusterIPs: []netip.Addr{ClusterIP(i)},
		Ports: []model.ServicePort{{Name: "http", Protocol: nft.ProtoTCP, Port: 80}}}
	es := &model.EndpointSlice{Name: name.Name + "-1", Service: name, Family: nft.IPv4,
		Ports:     []model.EndpointPort{{Name: "http", Protocol: nft.ProtoTCP, Port: 8080}},
		Endpoints: make([]model.Endpoint, 0, sz.Endpoints)}
	for j := 0; j < sz.Endpoints; j++ {
		es.Endpoints = append(es.Endpoints, model.Endpoint{IP: model.IPOf(Endpoint(sz, i, j, gen)),
			Ready: true, Serving: true, Place: places[(i*sz.Endpoints+j)%100]})
	}
	return svc, es
}

// Cluster is every Service of sz with its EndpointSlice (slices[i] is
// Service i's).
func Cluster(sz Size) (svcs []*model.Service, slices []*model.EndpointSlice) {
	svcs, slices = make([]*model.Service, sz.Services), make([]*model.EndpointSlice, sz.Services)
	for i := range svcs {
		svcs[i], slices[i] = Service(sz, i, 0)
	}
	return svcs, slices
}
