package proxier

import (
	"context"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftfake"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// TestProgrammingLatencySinceStart: the network programming latency counts
// the EndpointSlice changes made after the proxier started, not the age of
// the slices its first sync finds (which would put every restart in the
// 99th percentile), as upstream.
func TestProgrammingLatencySinceStart(t *testing.T) {
	old := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	old.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Hour).Format(time.RFC3339Nano)}
	count0, sum0 := programmingLatency(t)
	h := start(t, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP), old)
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")

	changed := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11", "10.244.2.12")
	changed.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), changed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the change's latency", func() bool { n, _ := programmingLatency(t); return n > count0 })
	count, sum := programmingLatency(t)
	if count-count0 != 1 {
		t.Errorf("%d latencies observed, want 1 (the change after the start)", count-count0)
	}
	if sum-sum0 > 60 {
		t.Errorf("latency %.0f s: the slice's age before the start was counted", sum-sum0)
	}
}

// TestFailureSeriesFromStart: a family's failure and result series exist,
// at 0, once the proxier is created, so that rate() and increase() see the
// first failure.
func TestFailureSeriesFromStart(t *testing.T) {
	metrics.NFTablesSyncFailuresTotal.Reset()
	metrics.SyncsTotal.Reset()
	if _, err := New(Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Minute},
		Deps{NFT: map[nft.Family]nft.Backend{nft.IPv6: nftfake.New()}}); err != nil {
		t.Fatal(err)
	}
	// Counted before anything below could create a series.
	if n := seriesCount(metrics.NFTablesSyncFailuresTotal) + seriesCount(metrics.SyncsTotal); n != 4 {
		t.Errorf("%d series after New, want 4 (failures; success, unchanged, failure)", n)
	}
	for _, c := range []prometheus.Collector{
		metrics.NFTablesSyncFailuresTotal.WithLabelValues(metrics.IPv6),
		metrics.SyncsTotal.WithLabelValues(metrics.IPv6, metrics.ResultFailure),
	} {
		if v := testutil.Value(t, c); v != 0 {
			t.Errorf("a failure series starts at %v, want 0", v)
		}
	}
}

// programmingLatency returns the IPv4 network programming latency's count
// and sum.
func programmingLatency(t *testing.T) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := metrics.NetworkProgrammingLatency.WithLabelValues(metrics.IPv4).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// seriesCount is the number of series c collects.
func seriesCount(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}
