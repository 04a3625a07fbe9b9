package proxier

import (
	"context"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftfake"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
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

// TestProgrammingLatencyPerUpdate: every update of an EndpointSlice is
// observed once, from its own trigger time, when a sync programs it, also
// when one sync takes several updates of the slice together (here: they
// arrive while the sync before is still running) and when an update
// changes nothing the proxy programs; endpoint changes count the updates,
// not the syncs. kube-proxy does the same; one sample per slice and sync,
// from the newest trigger time, would read low.
func TestProgrammingLatencyPerUpdate(t *testing.T) {
	var be *heldBackend
	h := startWith(t, func(d *Deps) {
		be = &heldBackend{Backend: d.NFT[nft.IPv4], committed: make(chan struct{}, 1), release: make(chan struct{}, 1)}
		d.NFT = map[nft.Family]nft.Backend{nft.IPv4: be}
	}, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.1"))
	web := tcp("10.96.0.10", 80)
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080")
	count0, sum0 := programmingLatency(t)
	changes0 := promtestutil.ToFloat64(metrics.EndpointChangesTotal)

	base := time.Now()
	var triggers []time.Time
	update := func(endpoint string, labels ...string) {
		t.Helper()
		es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, endpoint)
		at := base.Add(time.Duration(len(triggers)) * time.Millisecond)
		if len(labels) > 0 { // an update of a label only: the last trigger time again
			at = triggers[len(triggers)-1]
			es.Labels[labels[0]] = labels[1]
		}
		triggers = append(triggers, at)
		es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: at.Format(time.RFC3339Nano)}
		if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	be.hold.Store(true)
	update("10.244.1.2") // its sync commits, and is held before it returns
	<-be.committed
	be.hold.Store(false)
	update("10.244.1.3") // both wait for the held sync, and are synced together
	update("10.244.1.4")
	update("10.244.1.4", "example.com/team", "a") // changes nothing programmed, and is observed too
	testutil.Eventually(t, "the updates' endpoint changes", func() bool {
		return promtestutil.ToFloat64(metrics.EndpointChangesTotal)-changes0 == 4
	})
	released := time.Now()
	be.release <- struct{}{}
	h.eventually(web, nft.VerdictAccept, "10.244.1.4:8080")
	testutil.Eventually(t, "four latencies", func() bool { n, _ := programmingLatency(t); return n-count0 >= 4 })
	_, sum := programmingLatency(t)
	// One more update, synced after all of the above: a sample too many
	// from them would show in the count.
	update("10.244.1.5")
	h.eventually(web, nft.VerdictAccept, "10.244.1.5:8080")
	testutil.Eventually(t, "the last update's latency", func() bool { n, _ := programmingLatency(t); return n-count0 >= 5 })
	if n, _ := programmingLatency(t); n-count0 != 5 {
		t.Errorf("%d latencies observed, want 5 (one per update)", n-count0)
	}
	// Each sample is at least the time from its trigger to the release.
	var least float64
	for _, at := range triggers[:4] {
		least += released.Sub(at).Seconds()
	}
	if got := sum - sum0; got < least || got > least+3*testutil.Timeout.Seconds() {
		t.Errorf("latencies sum to %.3f s, want at least %.3f s (each from its own trigger time)", got, least)
	}
	if got := promtestutil.ToFloat64(metrics.EndpointChangesTotal) - changes0; got != 5 {
		t.Errorf("%v endpoint changes counted, want 5 (every update)", got)
	}
}

// TestProgrammingLatencyOfFailedSync: an update whose sync failed is
// observed by the retry that programs it, with the whole wait.
func TestProgrammingLatencyOfFailedSync(t *testing.T) {
	var rb *refusingBackend
	h := startWith(t, func(d *Deps) {
		rb = &refusingBackend{Fake: d.NFT[nft.IPv4].(*nftfake.Fake)}
		d.NFT[nft.IPv4] = rb
	}, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.1"))
	web := tcp("10.96.0.10", 80)
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080")
	count0, sum0 := programmingLatency(t)

	rb.refuse.Store(true)
	trigger := time.Now()
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.2")
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "a refused sync", func() bool { return rb.refused.Load() >= 1 })
	accepted := time.Now()
	rb.refuse.Store(false)
	h.eventually(web, nft.VerdictAccept, "10.244.1.2:8080")
	testutil.Eventually(t, "the latency", func() bool { n, _ := programmingLatency(t); return n > count0 })
	count, sum := programmingLatency(t)
	if count-count0 != 1 {
		t.Errorf("%d latencies observed, want 1", count-count0)
	}
	if got, least := sum-sum0, accepted.Sub(trigger).Seconds(); got < least {
		t.Errorf("latency %.3f s, want at least %.3f s (until the retry that programmed it)", got, least)
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

// TestSeriesFromStart: every counter series whose label values are known
// in advance is served, at 0, once the proxier is created (initMetrics):
// a fresh node's dashboard shows 0, and rate() has a first point.
func TestSeriesFromStart(t *testing.T) {
	for _, v := range []interface{ Reset() }{metrics.APIEventsTotal, metrics.InvalidObjectsTotal, metrics.ReaderWaitsTotal,
		metrics.NFTablesSyncFailuresTotal, metrics.SyncsTotal, metrics.RulesetReadFailuresTotal, metrics.ServiceRuleChangesTotal,
		metrics.NFTablesCleanupFailuresTotal, metrics.ReconcileConntrackFlowsDeletedEntriesTotal, metrics.RepairsTotal} {
		v.Reset()
	}
	if _, err := New(Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Minute},
		Deps{NFT: map[nft.Family]nft.Backend{nft.IPv4: nftfake.New(), nft.IPv6: nftfake.New()}}); err != nil {
		t.Fatal(err)
	}
	type series struct {
		name   string
		labels map[string]string
	}
	var want []series
	add := func(name string, labels ...string) {
		s := series{name: name, labels: map[string]string{}}
		for i := 0; i < len(labels); i += 2 {
			s.labels[labels[i]] = labels[i+1]
		}
		want = append(want, s)
	}
	for _, kind := range []string{"Service", "EndpointSlice", "Node", "ServiceCIDR"} {
		add("nftproxy_api_events_total", "kind", kind)
	}
	for _, reason := range []string{"invalid-name", "invalid-cluster-ip", "invalid-port-name", "invalid-protocol",
		"invalid-port", "duplicate-port", "invalid-node-port", "invalid-external-ip", "invalid-load-balancer-ip",
		"invalid-source-range"} {
		add("nftproxy_invalid_objects_total", "kind", "Service", "reason", reason)
	}
	for _, reason := range []string{"invalid-name", "invalid-address", "invalid-protocol", "invalid-port"} {
		add("nftproxy_invalid_objects_total", "kind", "EndpointSlice", "reason", reason)
	}
	add("nftproxy_invalid_objects_total", "kind", "ServiceCIDR", "reason", "invalid-cidr")
	add("nftproxy_reader_waits_total", "result", "ended")
	add("nftproxy_reader_waits_total", "result", "timeout")
	for _, fam := range []string{"IPv4", "IPv6"} {
		add("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "ip_family", fam)
		add("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", "ip_family", fam)
		add("kubeproxy_conntrack_reconciler_deleted_entries_total", "ip_family", fam)
		add("nftproxy_service_rule_changes_total", "ip_family", fam)
		for _, result := range []string{"success", "unchanged", "failure"} {
			add("nftproxy_syncs_total", "ip_family", fam, "result", result)
		}
		for _, reader := range []string{"table", "counters"} {
			add("nftproxy_ruleset_read_failures_total", "ip_family", fam, "reader", reader)
		}
		for _, kind := range []string{"table", "chain", "rule", "set", "element", "object", "flowtable", "unknown"} {
			add("nftproxy_repairs_total", "ip_family", fam, "kind", kind)
		}
	}
	for _, s := range want {
		if v, ok := testutil.Served(t, metrics.Registry, s.name, s.labels); !ok || v != 0 {
			t.Errorf("%s%v: served %v, value %v; want served at 0", s.name, s.labels, ok, v)
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
