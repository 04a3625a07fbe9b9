package ruleset

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// benchSize is a cluster of Services with one EndpointSlice of Endpoints
// endpoints each (as in proxier/model's benchmarks; docs/profiles.md).
type benchSize struct{ Services, Endpoints int }

func (s benchSize) String() string { return fmt.Sprintf("%dkx%d", s.Services/1000, s.Endpoints) }

var benchSizes = []benchSize{{1000, 5}, {10000, 5}, {100000, 5}, {100000, 10}}

var benchNode = model.Node{Name: "node-0", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}

// benchService is Service i of the API state of e2e/cmd/bench, as the watch
// layer converts it: bench/svc-i, ClusterIP port http 80/TCP, one
// EndpointSlice of endpoints on 8080 from 10.128.0.0/9 spread over 100
// nodes. gen > 0 moves the first endpoint to 10.200.0.0/16 + gen, as the
// benchmark's single change does.
func benchService(sz benchSize, i, gen int) (*model.Service, []*model.EndpointSlice) {
	name := model.ServiceName{Namespace: "bench", Name: fmt.Sprintf("svc-%d", i)}
	k := uint32(10<<24|96<<16) + uint32(i+10)
	svc := &model.Service{Name: name,
		ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{byte(k >> 24), byte(k >> 16), byte(k >> 8), byte(k)})},
		Ports:      []model.ServicePort{{Name: "http", Protocol: nft.ProtoTCP, Port: 80}}}
	es := &model.EndpointSlice{Name: name.Name + "-1", Service: name, Family: nft.IPv4,
		Ports: []model.EndpointPort{{Name: "http", Protocol: nft.ProtoTCP, Port: 8080}}}
	for j := 0; j < sz.Endpoints; j++ {
		n := uint32(10<<24|128<<16) + uint32(i*sz.Endpoints+j)
		if j == 0 && gen > 0 {
			n = uint32(10<<24|200<<16) + uint32(gen)
		}
		es.Endpoints = append(es.Endpoints, model.Endpoint{
			Addr:  netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}),
			Ready: true, Serving: true, NodeName: fmt.Sprintf("node-%d", n%100)})
	}
	return svc, []*model.EndpointSlice{es}
}

// benchPorts returns the service ports of every Service of the workload.
func benchPorts(sz benchSize) [][]model.ServicePortState {
	out := make([][]model.ServicePortState, sz.Services)
	for i := range out {
		svc, slices := benchService(sz, i, 0)
		out[i] = model.ServicePorts(nft.IPv4, benchNode, svc, slices)
	}
	return out
}

func benchFragments(ports [][]model.ServicePortState, slots *Slots) []*nft.Fragment {
	out := make([]*nft.Fragment, len(ports))
	for i, p := range ports {
		out[i] = ServiceFragment(testConfig, p, slots)
	}
	return out
}

// benchEditor is the editor of a full sync: the sets, the base chains and
// every fragment.
func benchEditor(frags []*nft.Fragment, slots *Slots) *nft.Editor {
	ed := nft.NewEditor(nft.IPv4)
	for _, s := range Sets(nft.IPv4) {
		ed.AddSet(s)
	}
	for _, m := range slots.Maps(nft.IPv4) {
		ed.AddSet(m)
	}
	ed.Replace(nil, Base(testConfig, nft.IPv4))
	for _, fr := range frags {
		ed.Replace(nil, fr)
	}
	return ed
}

var (
	benchFragSink *nft.Fragment
	benchTxSink   *nft.Transaction
)

// BenchmarkServiceFragment builds the fragment of every Service.
func BenchmarkServiceFragment(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			ports := benchPorts(sz)
			b.ReportAllocs()
			for b.Loop() {
				slots := NewSlots()
				for _, p := range ports {
					benchFragSink = ServiceFragment(testConfig, p, slots)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sz.Services), "ns/service")
		})
	}
}

// BenchmarkEditorFullBuild is the Editor's part of a full sync, the
// fragments being built: AddSet, Replace of the base and of every
// fragment, and the (full rewrite) Transaction.
func BenchmarkEditorFullBuild(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			slots := NewSlots()
			frags := benchFragments(benchPorts(sz), slots)
			b.ReportAllocs()
			for b.Loop() {
				benchTxSink = benchEditor(frags, slots).Transaction()
			}
			b.ReportMetric(float64(len(benchTxSink.Ops)), "ops")
		})
	}
}

// BenchmarkSingleChange is the builder's part of a single-change sync at
// every size: one endpoint of one Service moves (as in e2e/cmd/bench), the
// Service's ports and fragment are rebuilt, the Editor replaces the
// fragment and makes the transaction, which is committed. It must not grow
// with the number of Services.
func BenchmarkSingleChange(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			slots := NewSlots()
			frags := benchFragments(benchPorts(sz), slots)
			ed := benchEditor(frags, slots)
			ed.Transaction()
			ed.Commit()
			ops := 0
			b.ReportAllocs()
			gen := 0
			for b.Loop() {
				gen++
				i := gen * 7919 % sz.Services
				svc, slices := benchService(sz, i, gen)
				fr := ServiceFragment(testConfig, model.ServicePorts(nft.IPv4, benchNode, svc, slices), slots)
				ed.Replace(frags[i], fr)
				frags[i] = fr
				tx := ed.Transaction()
				ed.Commit()
				ops += len(tx.Ops)
			}
			b.ReportMetric(float64(ops)/float64(b.N), "ops/change")
		})
	}
}

// BenchmarkDiffOneService diffs two full rulesets that differ in one
// Service (one endpoint moved): the cost of the stateless path (nft.Diff)
// that the Editor replaces.
func BenchmarkDiffOneService(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			ports := benchPorts(sz)
			committed := Build(testConfig, nft.IPv4, flatten(ports))
			i := sz.Services / 2
			svc, slices := benchService(sz, i, 1)
			ports[i] = model.ServicePorts(nft.IPv4, benchNode, svc, slices)
			desired := Build(testConfig, nft.IPv4, flatten(ports))
			b.ReportAllocs()
			for b.Loop() {
				benchTxSink = nft.Diff(committed, desired)
			}
			b.ReportMetric(float64(len(benchTxSink.Ops)), "ops")
		})
	}
}

func flatten(ports [][]model.ServicePortState) []model.ServicePortState {
	var out []model.ServicePortState
	for _, p := range ports {
		out = append(out, p...)
	}
	return out
}
