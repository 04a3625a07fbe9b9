package main

import (
	"math"
	"testing"
	"time"
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
	s := parseMetrics(exposition)
	if v, ok := s.sum("nftproxy_api_events_total", nil); !ok || v != 12 {
		t.Errorf("events = %v %v, want 12", v, ok)
	}
	if v, _ := s.sum("weird", map[string]string{"a": `x"y,z}`, "b": "2"}); v != 1500 {
		t.Errorf("escaped label: %v", v)
	}
	h4, ok := s.histogram("kubeproxy_sync_proxy_rules_duration_seconds", ipv4)
	if !ok || h4.count != 10 || h4.sum != 0.02 || len(h4.le) != 4 {
		t.Fatalf("IPv4 histogram = %+v", h4)
	}
	// rank 5 of 10 lies in (0.001, 0.002] holding ranks 3..6: 0.001 + 0.001*3/4.
	if q := h4.quantile(0.5); math.Abs(q-0.00175) > 1e-12 {
		t.Errorf("p50 = %v, want 0.00175", q)
	}
	if q := h4.quantile(0.99); math.Abs(q-(0.002+0.002*3.9/4)) > 1e-12 {
		t.Errorf("p99 = %v", q)
	}
	all, _ := s.histogram("kubeproxy_sync_proxy_rules_duration_seconds", nil)
	if all.count != 13 || all.cum[0] != 5 {
		t.Errorf("both families = %+v", all)
	}
	if d := all.minus(h4); d.count != 3 || d.cum[3] != 3 {
		t.Errorf("minus = %+v", d)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 20; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p := pct(ds, 0.5); p != 10*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := pct(ds, 0.99); p != 20*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := pct(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing = %v", p)
	}
}
