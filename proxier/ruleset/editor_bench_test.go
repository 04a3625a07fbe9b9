package ruleset_test

import (
	"testing"

	"github.com/nftproxy/nftproxy/internal/testutil/benchrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// The benchmarks of the Editor over the rules of the API state of
// e2e/cmd/bench, built as nft/nftnl's encoding benchmarks build them
// (internal/testutil/benchrules; docs/profiles.md).

// BenchmarkEditorFullBuild is the Editor's part of a full sync, the
// fragments being built: AddSet, Replace of the base and of every
// fragment, and the (full rewrite) Transaction.
func BenchmarkEditorFullBuild(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			slots := ruleset.NewSlots()
			frags := benchrules.Fragments(ruleset.TestConfig, slots, sz)
			var tx *nft.Transaction
			b.ReportAllocs()
			for b.Loop() {
				tx = benchrules.Editor(ruleset.TestConfig, slots, frags).Transaction()
			}
			b.ReportMetric(float64(len(tx.Ops)), "ops")
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
			slots := ruleset.NewSlots()
			frags := benchrules.Fragments(ruleset.TestConfig, slots, sz)
			ed := benchrules.Editor(ruleset.TestConfig, slots, frags)
			ed.Transaction()
			ed.Commit()
			ops := 0
			b.ReportAllocs()
			gen := 0
			for b.Loop() {
				gen++
				i := gen * 7919 % sz.Services
				fr := benchrules.Fragment(ruleset.TestConfig, slots, sz, i, gen)
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
