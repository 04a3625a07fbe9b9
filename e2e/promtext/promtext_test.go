package promtext

import (
	"math"
	"testing"
)

const exposition = `# HELP kubeproxy_sync_proxy_rules_duration_seconds [ALPHA] SyncProxyRules latency in seconds
# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 2
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.002"} 6
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.004"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="+Inf"} 10
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.02
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"} 10
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.001"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.002"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.004"} 3
kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="+Inf"} 3
kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv6"} 0.001
kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv6"} 3
nftproxy_api_events_total{kind="EndpointSlice"} 7
nftproxy_api_events_total{kind="Service"} 5
nftproxy_syncs_total{ip_family="IPv4",result="success"} 4
nftproxy_syncs_total{ip_family="IPv6",result="unchanged"} 2
weird{a="x\"y,z}",b="2"} 1.5e3
`

func TestParseMetrics(t *testing.T) {
	s := Parse(exposition)
	if v, ok := s.Sum("nftproxy_api_events_total", nil); !ok || v != 12 {
		t.Errorf("events = %v %v, want 12", v, ok)
	}
	if v, _ := s.Sum("weird", map[string]string{"a": `x"y,z}`, "b": "2"}); v != 1500 {
		t.Errorf("escaped label: %v", v)
	}
	h4, ok := s.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", map[string]string{"ip_family": "IPv4"})
	if !ok || h4.Count != 10 || h4.Sum != 0.02 || len(h4.Le) != 4 {
		t.Fatalf("IPv4 histogram = %+v", h4)
	}
	// rank 5 of 10 lies in (0.001, 0.002] holding ranks 3..6: 0.001 + 0.001*3/4.
	if q := h4.Quantile(0.5); math.Abs(q-0.00175) > 1e-12 {
		t.Errorf("p50 = %v, want 0.00175", q)
	}
	if q := h4.Quantile(0.99); math.Abs(q-(0.002+0.002*3.9/4)) > 1e-12 {
		t.Errorf("p99 = %v", q)
	}
	all, _ := s.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", nil)
	if all.Count != 13 || all.Cum[0] != 5 {
		t.Errorf("both families = %+v", all)
	}
	if d := all.Minus(h4); d.Count != 3 || d.Cum[3] != 3 {
		t.Errorf("minus = %+v", d)
	}
}

// TestPlus: adding a histogram to an empty one gives it back; adding two
// adds their counts bucket by bucket.
func TestPlus(t *testing.T) {
	s := Parse(exposition)
	h4, _ := s.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", map[string]string{"ip_family": "IPv4"})
	h6, _ := s.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", map[string]string{"ip_family": "IPv6"})
	if got := (Hist{}).Plus(h4); got.Count != 10 || got.Cum[1] != 6 {
		t.Errorf("empty plus IPv4 = %+v", got)
	}
	all, _ := s.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", nil)
	if got := h4.Plus(h6); got.Count != all.Count || got.Sum != all.Sum || got.Cum[0] != all.Cum[0] || got.Cum[3] != all.Cum[3] {
		t.Errorf("IPv4 plus IPv6 = %+v, want %+v", got, all)
	}
}
