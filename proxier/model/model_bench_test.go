package model_test

import (
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
)

var benchPortsSink []model.ServicePortState

// BenchmarkServicePorts derives the service ports of every Service of the
// benchmark's cluster (benchstate), as a full sync does.
func BenchmarkServicePorts(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			svcs, slices := benchstate.Cluster(sz)
			b.ReportAllocs()
			for b.Loop() {
				for i, svc := range svcs {
					benchPortsSink = model.ServicePorts(nft.IPv4, benchstate.Node, svc, slices[i:i+1])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(sz.Services), "ns/service")
		})
	}
}
