package metrics

import "github.com/prometheus/client_golang/prometheus"

// The metrics below mirror pkg/proxy/metrics/metrics.go of Kubernetes
// v1.36.3 (those upstream registers in nftables mode). Names, help texts,
// label names and buckets must not change: dashboards depend on them.
var (
	// SyncProxyRulesLatency is the duration of one sync of one IP family,
	// full or partial. Label: ip_family.
	SyncProxyRulesLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_duration_seconds",
		Help:      alpha + "SyncProxyRules latency in seconds",
		Buckets:   syncLatencyBuckets,
	}, []string{"ip_family"})

	// SyncFullProxyRulesLatency is the duration of one full sync (the whole
	// ruleset rewritten). Label: ip_family.
	SyncFullProxyRulesLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_full_proxy_rules_duration_seconds",
		Help:      alpha + "SyncProxyRules latency in seconds for full resyncs",
		Buckets:   syncLatencyBuckets,
	}, []string{"ip_family"})

	// SyncPartialProxyRulesLatency is the duration of one partial sync (only
	// what changed). Label: ip_family.
	SyncPartialProxyRulesLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_partial_proxy_rules_duration_seconds",
		Help:      alpha + "SyncProxyRules latency in seconds for partial resyncs",
		Buckets:   syncLatencyBuckets,
	}, []string{"ip_family"})

	// SyncProxyRulesLastTimestamp is when rules were last synced
	// successfully (set to the current time after each success). Label:
	// ip_family.
	SyncProxyRulesLastTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_timestamp_seconds",
		Help:      alpha + "The last time proxy rules were successfully synced",
	}, []string{"ip_family"})

	// SyncProxyRulesLastQueuedTimestamp is when a sync was last requested.
	// Much later than SyncProxyRulesLastTimestamp means syncs are stuck.
	// Label: ip_family.
	SyncProxyRulesLastQueuedTimestamp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_last_queued_timestamp_seconds",
		Help:      alpha + "The last time a sync of proxy rules was queued",
	}, []string{"ip_family"})

	// NetworkProgrammingLatency is the time from a change of an
	// EndpointSlice (its endpoints.kubernetes.io/last-change-trigger-time
	// annotation, set by the control plane) to the sync that programmed it;
	// observed once per update of a slice made after the proxy started,
	// each from its own trigger time, as kube-proxy observes it
	// (ClusterLoader2's NetworkProgrammingLatency reads it). See
	// https://github.com/kubernetes/community/blob/master/sig-scalability/slos/network_programming_latency.md
	// Label: ip_family.
	NetworkProgrammingLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "network_programming_duration_seconds",
		Help:      alpha + "In Cluster Network Programming Latency in seconds",
		Buckets:   networkProgrammingBuckets,
	}, []string{"ip_family"})

	// EndpointChangesPending is the number of EndpointSlice changes recorded
	// but not yet synced. Upstream has no ip_family label here.
	EndpointChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_pending",
		Help:      alpha + "Pending proxy rules Endpoint changes",
	})

	// EndpointChangesTotal counts EndpointSlice updates received: every
	// event of a tracked slice, changed or not, and each slice a relist
	// changed (as kube-proxy counts them; not the slices per sync).
	EndpointChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_endpoint_changes_total",
		Help:      alpha + "Cumulative proxy rules Endpoint changes",
	})

	// ServiceChangesPending is the number of Service changes recorded but
	// not yet synced. Upstream has no ip_family label here.
	ServiceChangesPending = prometheus.NewGauge(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_pending",
		Help:      alpha + "Pending proxy rules Service changes",
	})

	// ServiceChangesTotal counts Service updates received, as
	// EndpointChangesTotal counts EndpointSlice updates.
	ServiceChangesTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_service_changes_total",
		Help:      alpha + "Cumulative proxy rules Service changes",
	})

	// SyncProxyRulesNoLocalEndpointsTotal is, after each sync, the number of
	// services with a Local traffic policy and no local endpoint. Despite
	// the _total suffix it is a gauge (Set, not Inc), as upstream. Labels:
	// traffic_policy (TrafficPolicyInternal or TrafficPolicyExternal),
	// ip_family.
	SyncProxyRulesNoLocalEndpointsTotal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_no_local_endpoints_total",
		Help:      alpha + "Number of services with a Local traffic policy and no endpoints",
	}, []string{"traffic_policy", "ip_family"})

	// NFTablesSyncFailuresTotal counts transactions the kernel refused.
	// Label: ip_family.
	NFTablesSyncFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_nftables_sync_failures_total",
		Help:      alpha + "Cumulative proxy nftables sync failures",
	}, []string{"ip_family"})

	// NFTablesCleanupFailuresTotal counts failed deletions of stale chains.
	// Label: ip_family.
	NFTablesCleanupFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "sync_proxy_rules_nftables_cleanup_failures_total",
		Help:      alpha + "Cumulative proxy nftables cleanup failures",
	}, []string{"ip_family"})

	// ReconcileConntrackFlowsLatency is the duration of one conntrack
	// reconciliation (listing and deleting stale flows). Label: ip_family.
	ReconcileConntrackFlowsLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_sync_duration_seconds",
		Help:      alpha + "ReconcileConntrackFlowsLatency latency in seconds",
		Buckets:   syncLatencyBuckets,
	}, []string{"ip_family"})

	// ReconcileConntrackFlowsDeletedEntriesTotal counts conntrack entries
	// deleted as stale. Label: ip_family.
	ReconcileConntrackFlowsDeletedEntriesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "conntrack_reconciler_deleted_entries_total",
		Help:      alpha + "Cumulative conntrack flows deleted by conntrack reconciler",
	}, []string{"ip_family"})

	// ProxyHealthzTotal counts /healthz answers by HTTP status. Label: code
	// ("200" or "503").
	ProxyHealthzTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_healthz_total",
		Help:      alpha + "Cumulative proxy healthz HTTP status",
	}, []string{"code"})

	// ProxyLivezTotal counts /livez answers by HTTP status. Label: code.
	ProxyLivezTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "proxy_livez_total",
		Help:      alpha + "Cumulative proxy livez HTTP status",
	}, []string{"code"})
)

// kubeProxyCollectors lists the metrics above for registration.
func kubeProxyCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		SyncProxyRulesLatency,
		SyncFullProxyRulesLatency,
		SyncPartialProxyRulesLatency,
		SyncProxyRulesLastTimestamp,
		SyncProxyRulesLastQueuedTimestamp,
		NetworkProgrammingLatency,
		EndpointChangesPending,
		EndpointChangesTotal,
		ServiceChangesPending,
		ServiceChangesTotal,
		SyncProxyRulesNoLocalEndpointsTotal,
		NFTablesSyncFailuresTotal,
		NFTablesCleanupFailuresTotal,
		ReconcileConntrackFlowsLatency,
		ReconcileConntrackFlowsDeletedEntriesTotal,
		ProxyHealthzTotal,
		ProxyLivezTotal,
	}
}
