package ruleset

import (
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
)

// The benchmarks build the rules of the API state of e2e/cmd/bench
// (benchstate; docs/profiles.md).

// benchPorts returns the service ports of every Service of the workload.
func benchPorts(sz benchstate.Size) [][]model.ServicePortState {
	out := make([][]model.ServicePortState, sz.Services)
	for i := range out {
		svc, es := benchstate.Service(sz, i, 0)
		out[i] = model.ServicePorts(nft.IPv4, benchstate.Node, svc, []*model.EndpointSlice{es})
	}
	return out
}

var (
	benchFragSink *nft.Fragment
	benchTxSink   *nft.Transaction
)

// BenchmarkServiceFragment builds the fragment of every Service.
func BenchmarkServiceFragment(b *testing.B) {
	for _, sz := range benchstate.Sizes {
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

// BenchmarkDiffOneService diffs two full rulesets that differ in one
// Service (one endpoint moved): the cost of the stateless path (nft.Diff)
// that the Editor replaces.
func BenchmarkDiffOneService(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			ports := benchPorts(sz)
			committed := Build(testConfig, nft.IPv4, flatten(ports))
			i := sz.Services / 2
			svc, es := benchstate.Service(sz, i, 1)
			ports[i] = model.ServicePorts(nft.IPv4, benchstate.Node, svc, []*model.EndpointSlice{es})
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
