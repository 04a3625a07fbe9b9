package metrics

import (
	"context"
	"io"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestUpstreamNames pins the name, type and labels of every metric that
// dashboards written for kube-proxy query.
func TestUpstreamNames(t *testing.T) {
	tests := []struct {
		name   string
		typ    dto.MetricType
		labels []string
		touch  func()
	}{
		{"kubeproxy_sync_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, []string{"ip_family"},
			func() { SyncProxyRulesLatency.WithLabelValues(IPv4).Observe(0.01) }},
		{"kubeproxy_sync_full_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, []string{"ip_family"},
			func() { SyncFullProxyRulesLatency.WithLabelValues(IPv4).Observe(0.01) }},
		{"kubeproxy_sync_partial_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, []string{"ip_family"},
			func() { SyncPartialProxyRulesLatency.WithLabelValues(IPv6).Observe(0.01) }},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", dto.MetricType_GAUGE, []string{"ip_family"},
			func() { SyncProxyRulesLastTimestamp.WithLabelValues(IPv4).SetToCurrentTime() }},
		{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", dto.MetricType_GAUGE, []string{"ip_family"},
			func() { SyncProxyRulesLastQueuedTimestamp.WithLabelValues(IPv4).SetToCurrentTime() }},
		{"kubeproxy_network_programming_duration_seconds", dto.MetricType_HISTOGRAM, []string{"ip_family"},
			func() { NetworkProgrammingLatency.WithLabelValues(IPv4).Observe(1.5) }},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", dto.MetricType_GAUGE, nil,
			func() { EndpointChangesPending.Set(3) }},
		{"kubeproxy_sync_proxy_rules_endpoint_changes_total", dto.MetricType_COUNTER, nil,
			func() { EndpointChangesTotal.Inc() }},
		{"kubeproxy_sync_proxy_rules_service_changes_pending", dto.MetricType_GAUGE, nil,
			func() { ServiceChangesPending.Set(1) }},
		{"kubeproxy_sync_proxy_rules_service_changes_total", dto.MetricType_COUNTER, nil,
			func() { ServiceChangesTotal.Inc() }},
		{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", dto.MetricType_GAUGE, []string{"ip_family", "traffic_policy"},
			func() { SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues(TrafficPolicyInternal, IPv4).Set(2) }},
		{"kubeproxy_sync_proxy_rules_nftables_sync_failures_total", dto.MetricType_COUNTER, []string{"ip_family"},
			func() { NFTablesSyncFailuresTotal.WithLabelValues(IPv4).Inc() }},
		{"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", dto.MetricType_COUNTER, []string{"ip_family"},
			func() { NFTablesCleanupFailuresTotal.WithLabelValues(IPv4).Inc() }},
		{"kubeproxy_conntrack_reconciler_sync_duration_seconds", dto.MetricType_HISTOGRAM, []string{"ip_family"},
			func() { ReconcileConntrackFlowsLatency.WithLabelValues(IPv4).Observe(0.002) }},
		{"kubeproxy_conntrack_reconciler_deleted_entries_total", dto.MetricType_COUNTER, []string{"ip_family"},
			func() { ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(IPv4).Add(4) }},
		{"kubeproxy_proxy_healthz_total", dto.MetricType_COUNTER, []string{"code"},
			func() { ProxyHealthzTotal.WithLabelValues("200").Inc() }},
		{"kubeproxy_proxy_livez_total", dto.MetricType_COUNTER, []string{"code"},
			func() { ProxyLivezTotal.WithLabelValues("503").Inc() }},
		{"nftproxy_sync_kernel_operations", dto.MetricType_HISTOGRAM, []string{"ip_family"},
			func() { SyncKernelOperations.WithLabelValues(IPv4).Observe(0) }},
		{"nftproxy_syncs_total", dto.MetricType_COUNTER, []string{"ip_family", "result"},
			func() { SyncsTotal.WithLabelValues(IPv4, ResultSuccess).Inc() }},
		{"nftproxy_invalid_objects_total", dto.MetricType_COUNTER, []string{"kind", "reason"},
			func() { InvalidObjectsTotal.WithLabelValues("Service", "bad-cluster-ip").Inc() }},
		{"nftproxy_service_rule_changes_total", dto.MetricType_COUNTER, []string{"ip_family"},
			func() { ServiceRuleChangesTotal.WithLabelValues(IPv4).Add(2) }},
		{"nftproxy_api_events_total", dto.MetricType_COUNTER, []string{"kind"},
			func() { APIEventsTotal.WithLabelValues("EndpointSlice").Inc() }},
		{"kubernetes_build_info", dto.MetricType_GAUGE,
			[]string{"build_date", "compiler", "git_commit", "git_tree_state", "git_version", "go_version", "major", "minor", "platform"},
			func() {
				BuildInfo.WithLabelValues("0", "1", "v0.1.0", "abc", "clean", "2026-11-24T00:00:00Z", "go1.26", "gc", "linux/amd64").Set(1)
			}},
		{"nftproxy_kube_proxy_leftovers", dto.MetricType_GAUGE, []string{"ip_family", "kind"},
			func() { KubeProxyLeftovers.WithLabelValues(IPv4, LeftoverIPTablesChains).Set(3) }},
		{"nftproxy_kube_proxy_table_removals_total", dto.MetricType_COUNTER, []string{"ip_family", "result"},
			func() { KubeProxyTableRemovalsTotal.WithLabelValues(IPv6, ResultSuccess).Inc() }},
		{"rest_client_requests_total", dto.MetricType_COUNTER, []string{"code", "host", "method"},
			func() { requestResultAdapter{}.Increment(context.Background(), "200", "GET", "10.0.0.1:6443") }},
		{"rest_client_request_duration_seconds", dto.MetricType_HISTOGRAM, []string{"host", "verb"},
			func() {
				requestLatencyAdapter{}.Observe(context.Background(), "POST", url.URL{Host: "10.0.0.1:6443"}, time.Second)
			}},
	}
	for _, tt := range tests {
		tt.touch()
	}
	families := gather(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mf, ok := families[tt.name]
			if !ok {
				t.Fatalf("metric %s not served", tt.name)
			}
			if mf.GetType() != tt.typ {
				t.Errorf("type = %v, want %v", mf.GetType(), tt.typ)
			}
			if got := labelNames(mf.GetMetric()[0]); !slices.Equal(got, tt.labels) {
				t.Errorf("labels = %v, want %v", got, tt.labels)
			}
		})
	}
}

// TestRuntimeCollectors checks the Go and process series the "Kubernetes /
// Proxy" dashboard plots.
func TestRuntimeCollectors(t *testing.T) {
	families := gather(t)
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "process_cpu_seconds_total"} {
		if _, ok := families[name]; !ok {
			t.Errorf("%s not served", name)
		}
	}
}

func TestBuckets(t *testing.T) {
	tests := []struct {
		name  string
		got   []float64
		first float64
		last  float64
		n     int
	}{
		{"sync latency", syncLatencyBuckets, 0.001, 16.384, 15},
		{"network programming", networkProgrammingBuckets, 0.25, 300, 2 + 59 + 12 + 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if len(tt.got) != tt.n || tt.got[0] != tt.first || tt.got[len(tt.got)-1] != tt.last {
				t.Errorf("buckets %v: want %d from %v to %v", tt.got, tt.n, tt.first, tt.last)
			}
			if !slices.IsSorted(tt.got) {
				t.Errorf("buckets not sorted: %v", tt.got)
			}
		})
	}
}

func TestHandler(t *testing.T) {
	ServiceChangesTotal.Inc()
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != 200 || !strings.Contains(string(body), "kubeproxy_sync_proxy_rules_service_changes_total") {
		t.Errorf("GET /metrics = %d, body lacks service changes:\n%.500s", rec.Code, body)
	}
}

func gather(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := Registry.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	return byName
}

// labelNames returns the sorted label names of m (the exposition sorts them).
func labelNames(m *dto.Metric) []string {
	var names []string
	for _, l := range m.GetLabel() {
		names = append(names, l.GetName())
	}
	return names
}

// TestLocalhostNodePortMetrics: the three metrics of localhost NodePorts
// are served only once registered (the feature gate is on), with
// upstream's names, types and labels.
func TestLocalhostNodePortMetrics(t *testing.T) {
	names := []string{"kubeproxy_nftables_localhost_nodeport_listeners",
		"kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
		"kubeproxy_nftables_localhost_nodeport_rejected_packets_total"}
	LocalhostNodePortListeners.WithLabelValues(IPv4).Set(2)
	LocalhostNodePortListenerCreationFailuresTotal.WithLabelValues(IPv6).Inc()
	for _, name := range names {
		if _, ok := gather(t)[name]; ok {
			t.Errorf("%s served before RegisterLocalhostNodePorts", name)
		}
	}
	unregister, err := RegisterLocalhostNodePorts(fixedRejected{})
	if err != nil {
		t.Fatal(err)
	}
	families := gather(t)
	for i, want := range []struct {
		typ    dto.MetricType
		labels []string
	}{
		{dto.MetricType_GAUGE, []string{"ip_family"}},
		{dto.MetricType_COUNTER, []string{"ip_family"}},
		{dto.MetricType_COUNTER, []string{"ip_family", "protocol"}},
	} {
		mf, ok := families[names[i]]
		if !ok {
			t.Errorf("%s not served", names[i])
			continue
		}
		if mf.GetType() != want.typ || !slices.Equal(labelNames(mf.GetMetric()[0]), want.labels) ||
			!strings.HasPrefix(mf.GetHelp(), "[ALPHA] ") {
			t.Errorf("%s: %v %v %q, want %v %v and an [ALPHA] help", names[i], mf.GetType(), labelNames(mf.GetMetric()[0]),
				mf.GetHelp(), want.typ, want.labels)
		}
	}
	unregister()
	if _, ok := gather(t)[names[2]]; ok {
		t.Error("rejected packets served after unregister")
	}
	unregister, err = RegisterLocalhostNodePorts(fixedRejected{})
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	unregister()
}

// fixedRejected reports one series of rejected packets.
type fixedRejected struct{}

func (fixedRejected) Describe(ch chan<- *prometheus.Desc) { ch <- LocalhostNodePortRejectedPackets }
func (fixedRejected) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(LocalhostNodePortRejectedPackets, prometheus.CounterValue, 3, IPv4, "UDP")
}
