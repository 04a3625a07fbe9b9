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
	for _, s := range Sets(nft.IPv4, Config{}) {
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

// BenchmarkEditorFullBuild is the Editor's part of a full sync, the
// fragments being built: AddSet, Replace of the base and of every
// fragment, and the (full rewrite) Transaction.
func BenchmarkEditorFullBuild(b *testing.B) {
	for _, sz := range benchstate.Sizes {
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
	for _, sz := range benchstate.Sizes {
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
				svc, es := benchstate.Service(sz, i, gen)
				fr := ServiceFragment(testConfig, model.ServicePorts(nft.IPv4, benchstate.Node, svc, []*model.EndpointSlice{es}), slots)
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
