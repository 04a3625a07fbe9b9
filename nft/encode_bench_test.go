package nft_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// These benchmarks encode the transactions the proxier really writes for
// the workload of e2e/cmd/bench (see docs/profiles.md): they live in the
// external test package so that they can build them with proxier/ruleset.

type benchSize struct{ Services, Endpoints int }

func (s benchSize) String() string { return fmt.Sprintf("%dkx%d", s.Services/1000, s.Endpoints) }

var benchSizes = []benchSize{{1000, 5}, {10000, 5}, {100000, 5}, {100000, 10}}

var (
	benchNode = model.Node{Name: "node-0", Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
	benchCfg  = ruleset.Config{
		LocalTraffic:   ruleset.LocalDetector{CIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
		ServiceCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		NodePorts:      ruleset.NodePortAddresses{Addresses: benchNode.Addresses},
		MasqueradeMark: 0x4000,
	}
)

// benchFragment is the fragment of Service i: bench/svc-i, ClusterIP port
// http 80/TCP, endpoints on 8080 from 10.128.0.0/9; gen > 0 moves the first
// endpoint to 10.200.0.0/16 + gen.
func benchFragment(slots *ruleset.Slots, sz benchSize, i, gen int) *nft.Fragment {
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
	return ruleset.ServiceFragment(benchCfg, model.ServicePorts(nft.IPv4, benchNode, svc, []*model.EndpointSlice{es}), slots)
}

// benchEditor has every Service's fragment; frags are returned for
// single changes.
func benchEditor(sz benchSize) (*nft.Editor, []*nft.Fragment, *ruleset.Slots) {
	ed := nft.NewEditor(nft.IPv4)
	for _, s := range ruleset.Sets(nft.IPv4) {
		ed.AddSet(s)
	}
	ed.Replace(nil, ruleset.Base(benchCfg, nft.IPv4))
	slots := ruleset.NewSlots()
	frags := make([]*nft.Fragment, sz.Services)
	for i := range frags {
		frags[i] = benchFragment(slots, sz, i, 0)
		for _, m := range slots.NewMaps(nft.IPv4) {
			ed.AddSet(m)
		}
		ed.Replace(nil, frags[i])
	}
	return ed, frags, slots
}

// BenchmarkEncodeFullSync encodes the full-sync transaction (table reset
// and everything) into one netlink batch, as Netlink.Apply does before its
// one sendmsg.
func BenchmarkEncodeFullSync(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			ed, _, _ := benchEditor(sz)
			tx := ed.Transaction()
			var n, msgs int
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if n, msgs, err = nft.EncodeForBench(tx); err != nil {
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
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			ed, frags, slots := benchEditor(sz)
			ed.Transaction()
			ed.Commit()
			i := sz.Services / 2
			ed.Replace(frags[i], benchFragment(slots, sz, i, 1))
			tx := ed.Transaction()
			var n int
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if n, _, err = nft.EncodeForBench(tx); err != nil {
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
	for _, sz := range benchSizes {
		b.Run(sz.String(), func(b *testing.B) {
			ed, _, _ := benchEditor(sz)
			tx := ed.Transaction()
			b.ReportAllocs()
			for b.Loop() {
				if err := nft.NewFake().Apply(context.Background(), tx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
