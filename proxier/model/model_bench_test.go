package model

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// benchSize is a cluster of Services with one EndpointSlice of Endpoints
// endpoints each; the sizes issue 4 asks for (see docs/profiles.md).
type benchSize struct{ Services, Endpoints int }

func (s benchSize) String() string {
	if s.Services%1000 == 0 {
		return fmt.Sprintf("%dkx%d", s.Services/1000, s.Endpoints)
	}
	return fmt.Sprintf("%dx%d", s.Services, s.Endpoints)
}

var benchSizes = []benchSize{{1000, 5}, {10000, 5}, {100000, 5}, {100000, 10}}

// benchWorkload is the API state of e2e/cmd/bench, as the watch layer
// converts it: Service i is bench/svc-i, a ClusterIP Service (port http
// 80/TCP) with one EndpointSlice bench/svc-i-1 of endpoints on port 8080
// taken from 10.128.0.0/9, spread over 100 nodes (node-0 is this node).
func benchWorkload(sz benchSize) ([]*Service, [][]*EndpointSlice) {
	svcs := make([]*Service, sz.Services)
	slices := make([][]*EndpointSlice, sz.Services)
	for i := range svcs {
		name := ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
		k := uint32(10<<24|96<<16) + uint32(i+10)
		svcs[i] = &Service{Name: name,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{byte(k >> 24), byte(k >> 16), byte(k >> 8), byte(k)})},
			Ports:      []ServicePort{{Name: "http", Protocol: nft.ProtoTCP, Port: 80}}}
		es := &EndpointSlice{Name: name.Name + "-1", Service: name, Family: nft.IPv4,
			Ports:     []EndpointPort{{Name: "http", Protocol: nft.ProtoTCP, Port: 8080}},
			Endpoints: make([]Endpoint, 0, sz.Endpoints)}
		for j := 0; j < sz.Endpoints; j++ {
			n := uint32(10<<24|128<<16) + uint32(i*sz.Endpoints+j)
			es.Endpoints = append(es.Endpoints, Endpoint{
				Addr:  netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}),
				Ready: true, Serving: true, NodeName: nodeNames[n%100]})
		}
		slices[i] = []*EndpointSlice{es}
	}
	return svcs, slices
}

// nodeNames are the 100 nodes' names, shared as the watch layer interns
// them.
var nodeNames = func() (names [100]string) {
	for i := range names {
		names[i] = fmt.Sprintf("node-%d", i)
	}
	return names
}()

var benchPortsSink []ServicePortState

// BenchmarkServicePorts derives the service ports of every Service, as a
// full sync does.
func BenchmarkServicePorts(b *testing.B) {
	node := Node{Name: "node-0", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			svcs, slices := benchWorkload(sz)
			b.ReportAllocs()
			for b.Loop() {
				for i, svc := range svcs {
					benchPortsSink = ServicePorts(nft.IPv4, node, svc, slices[i])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sz.Services), "ns/service")
		})
	}
}
