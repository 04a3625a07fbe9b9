package nftnl_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testutil/benchrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// These benchmarks encode the transactions the proxier really writes for
// the workload of e2e/cmd/bench (benchstate; see docs/profiles.md): they
// live in the external test package so that they can build them with
// proxier/ruleset.

var benchCfg = ruleset.Config{
	LocalTraffic:   ruleset.LocalDetector{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
	ServiceCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
	NodePorts:      ruleset.NodePortAddresses{Addresses: benchstate.Node.Addresses},
	MasqueradeMark: 0x4000,
}

// fullSyncEditor is the Editor of a full sync of the workload of size sz
// (benchrules.Editor); frags are returned for single changes.
func fullSyncEditor(sz benchstate.Size) (*nft.Editor, []*nft.Fragment, *ruleset.Slots) {
	slots := ruleset.NewSlots()
	frags := benchrules.Fragments(benchCfg, slots, sz)
	return benchrules.Editor(benchCfg, slots, frags), frags, slots
}

// BenchmarkEncodeFullSync encodes the full-sync transaction (table reset
// and everything) into one netlink batch, as Netlink.Apply does before its
// one sendmsg.
func BenchmarkEncodeFullSync(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			ed, _, _ := fullSyncEditor(sz)
			tx := ed.Transaction()
			var n, msgs int
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if n, msgs, err = nftnl.EncodeForBench(tx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)/(1<<20), "MiB")
			b.ReportMetric(float64(msgs), "msgs")
		})
	}
}

// BenchmarkEncodeSingleChange encodes the transaction of one endpoint
// move: it must not grow with the number of Services.
func BenchmarkEncodeSingleChange(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			ed, frags, slots := fullSyncEditor(sz)
			ed.Transaction()
			ed.Commit()
			i := sz.Services / 2
			ed.Replace(frags[i], benchrules.Fragment(benchCfg, slots, sz, i, 1))
			tx := ed.Transaction()
			var n int
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if n, _, err = nftnl.EncodeForBench(tx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n), "bytes")
		})
	}
}

// BenchmarkFakeApplyFullSync applies the full-sync transaction to a Fake:
// the cost the test backend adds to the proxier's benchmarks, not part of
// nftproxy's own.
func BenchmarkFakeApplyFullSync(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			ed, _, _ := fullSyncEditor(sz)
			tx := ed.Transaction()
			b.ReportAllocs()
			for b.Loop() {
				if err := nftfake.New().Apply(context.Background(), tx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
