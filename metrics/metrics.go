// Package metrics declares every Prometheus metric nftproxy exports, once,
// and the registry that serves them. It holds no logic: the sync loop, the
// watchers and the health server update these variables directly.
//
// The kubeproxy_* metrics copy upstream kube-proxy v1.36 (pkg/proxy/metrics)
// name for name, label for label and bucket for bucket, so that dashboards
// and alerts written for kube-proxy (the kubernetes-mixin "Kubernetes /
// Proxy" dashboard among them) keep working when nftproxy replaces it. The
// nftproxy_* metrics are our own.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Label values of ip_family, spelled as upstream spells them
// (string(v1.IPFamily)).
const (
	IPv4 = "IPv4"
	IPv6 = "IPv6"
)

// Label values of traffic_policy in SyncProxyRulesNoLocalEndpointsTotal, as
// upstream writes them.
const (
	TrafficPolicyInternal = "internal"
	TrafficPolicyExternal = "external"
)

// Label values of result in SyncsTotal.
const (
	ResultSuccess = "success"
	ResultFailure = "failure"
	// ResultUnchanged: the sync found nothing to change in the kernel.
	ResultUnchanged = "unchanged"
)

// kubeProxySubsystem makes the kubeproxy_ prefix of the upstream metrics.
const kubeProxySubsystem = "kubeproxy"

// alpha prefixes the help text of the metrics copied from upstream, whose
// component-base registry marks each with its stability level; keeping it
// makes our exposition of those metrics identical to kube-proxy's.
const alpha = "[ALPHA] "

// syncLatencyBuckets are upstream's buckets for sync durations:
// 1 ms to about 16 s, doubling.
var syncLatencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// networkProgrammingBuckets are upstream's buckets for
// network_programming_duration_seconds: 0.25 s, 0.5 s, then every second to
// 59 s, every 5 s to 115 s, every 30 s to 5 min.
var networkProgrammingBuckets = mergeBuckets(
	prometheus.LinearBuckets(0.25, 0.25, 2),
	prometheus.LinearBuckets(1, 1, 59),
	prometheus.LinearBuckets(60, 5, 12),
	prometheus.LinearBuckets(120, 30, 7),
)

func mergeBuckets(lists ...[]float64) []float64 {
	var all []float64
	for _, l := range lists {
		all = append(all, l...)
	}
	return all
}
