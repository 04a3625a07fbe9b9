package metrics

import "github.com/prometheus/client_golang/prometheus"

// nftproxyNamespace prefixes the metrics that upstream has no equivalent of.
const nftproxyNamespace = "nftproxy"

var (
	// SyncKernelOperations is the number of kernel operations (netlink
	// messages: adds, deletes, flushes of tables, chains, rules, sets and
	// elements) one sync of one family sent. An unchanged sync should
	// observe 0, which is why 0 is a bucket of its own; the _sum series
	// gives the running total. Label: ip_family.
	SyncKernelOperations = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: nftproxyNamespace,
		Name:      "sync_kernel_operations",
		Help:      "Number of nftables operations sent to the kernel per sync",
		Buckets:   []float64{0, 1, 10, 100, 1e3, 1e4, 1e5, 1e6},
	}, []string{"ip_family"})

	// SyncsTotal counts syncs of one family by outcome. Labels: ip_family,
	// result (ResultSuccess, ResultUnchanged: nothing to send to the
	// kernel, or ResultFailure).
	SyncsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "syncs_total",
		Help:      "Number of rule syncs by IP family and result",
	}, []string{"ip_family", "result"})

	// InvalidObjectsTotal counts API objects (or parts of them) skipped
	// because they could not be programmed, e.g. a Service with an
	// unparsable ClusterIP. Labels: kind ("Service", "EndpointSlice",
	// "ServiceCIDR"), reason (one of a closed list of short fixed words,
	// proxier/watch's Reasons, never free text from the object: the
	// cardinality is bounded, and the proxier serves every series at 0
	// from its start).
	InvalidObjectsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "invalid_objects_total",
		Help:      "Number of API objects skipped as invalid, by kind and reason",
	}, []string{"kind", "reason"})

	// ServiceRuleChangesTotal counts, per family, the Services whose rules
	// a successful sync changed: the node-local changes. Compared with
	// APIEventsTotal it shows how many API events needed no kernel work
	// (another node's endpoint, an annotation, a status update…).
	// Label: ip_family.
	ServiceRuleChangesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "service_rule_changes_total",
		Help:      "Number of Services whose rules changed, by IP family",
	}, []string{"ip_family"})

	// RepairsTotal counts repairs of nftproxy's tables after another
	// process changed them (nftnl.Monitor), by the kind of object changed
	// (table, chain, rule, set, element, object, flowtable, or unknown
	// after notifications were lost). A repair that mends several kinds
	// counts once for each. Labels: ip_family, kind. Served at 0 from
	// the proxier's start, as every counter whose label values are known
	// in advance (proxier's initMetrics).
	RepairsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "repairs_total",
		Help:      "Number of repairs of nftproxy's tables changed by another process, by IP family and kind of object changed",
	}, []string{"ip_family", "kind"})

	// APIEventsTotal counts informer events received (add, update, delete).
	// Label: kind ("Service", "EndpointSlice", "Node", "ServiceCIDR").
	APIEventsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "api_events_total",
		Help:      "Number of API watch events received, by kind",
	}, []string{"kind"})

	// KubeProxyLeftovers is the number of objects kube-proxy left in the
	// node's kernel, as found at start and again after a removal of its
	// tables. Labels: ip_family, kind (LeftoverNFTablesTable: its
	// nftables-mode "kube-proxy" table; LeftoverIPTablesChains: KUBE-*
	// chains its iptables or ipvs mode left in iptables-nft's tables).
	KubeProxyLeftovers = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: nftproxyNamespace,
		Name:      "kube_proxy_leftovers",
		Help:      "Number of kube-proxy's nftables tables and iptables-nft KUBE-* chains found in the kernel, by IP family and kind",
	}, []string{"ip_family", "kind"})

	// KubeProxyTableRemovalsTotal counts the transactions that deleted
	// kube-proxy's nftables table of a family (--remove-kube-proxy-tables),
	// by outcome. Labels: ip_family, result (ResultSuccess, ResultFailure).
	KubeProxyTableRemovalsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "kube_proxy_table_removals_total",
		Help:      "Number of removals of kube-proxy's nftables tables, by IP family and result",
	}, []string{"ip_family", "result"})
)

var (
	// ReaderWaitSeconds is how long syncs waited for other processes'
	// reads of the ruleset before committing (runner.Config.Readers): a
	// commit would make a read under way start over. Only syncs that
	// waited are observed.
	ReaderWaitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: nftproxyNamespace,
		Name:      "reader_wait_seconds",
		Help:      "Time a sync waited for other processes reading the nftables ruleset before committing",
		Buckets:   []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
	})

	// ReaderWaitsTotal counts syncs that waited for readers, by how the
	// wait ended. Label: result (ReaderWaitEnded: the reads ended, or
	// stopped holding commits (ReadersIgnoredTotal); ReaderWaitTimedOut:
	// the wait reached --max-reader-wait, and the commit made a read under
	// way start over; ReaderWaitRepair: a repair of the tables cut it).
	ReaderWaitsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "reader_waits_total",
		Help:      "Number of syncs that waited for other processes reading the nftables ruleset, by how the wait ended",
	}, []string{"result"})

	// ReadersIgnoredTotal counts reads of other processes that commits
	// stopped waiting for before they ended (proxier/readers). Label:
	// reason (ReaderStalled: a dump on the socket stopped moving, its
	// process no longer reads; ReaderBudgetSpent: the read held commits
	// for --max-reader-wait in all).
	ReadersIgnoredTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "readers_ignored_total",
		Help:      "Number of other processes' reads of the nftables ruleset that commits stopped waiting for, by reason",
	}, []string{"reason"})

	// ReaderDetectionAvailable is 1 while other processes' reads of the
	// ruleset can be seen (sock_diag, or /proc/net/netlink), 0 when
	// they cannot: commits then never wait for them.
	ReaderDetectionAvailable = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: nftproxyNamespace,
		Name:      "reader_detection_available",
		Help:      "1 if nftproxy can see other processes reading the nftables ruleset, 0 if it cannot",
	})

	// RulesetReadFailuresTotal counts nftproxy's own reads of its tables
	// that failed (after their retries, when commits kept interrupting
	// them). Labels: ip_family, reader (ReaderTable: the table read back
	// for a full sync; ReaderCounters: the traffic counters of a scrape).
	RulesetReadFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "ruleset_read_failures_total",
		Help:      "Number of nftproxy's reads of its nftables tables that failed, by IP family and reader",
	}, []string{"ip_family", "reader"})
)

// Label values of ReaderWaitsTotal, ReadersIgnoredTotal and
// RulesetReadFailuresTotal.
const (
	ReaderWaitEnded    = "ended"
	ReaderWaitTimedOut = "timeout"
	ReaderWaitRepair   = "repair"
	ReaderStalled      = "stalled"
	ReaderBudgetSpent  = "budget"
	ReaderTable        = "table"
	ReaderCounters     = "counters"
)

// Label values of kind in KubeProxyLeftovers.
const (
	LeftoverNFTablesTable  = "nftables-table"
	LeftoverIPTablesChains = "iptables-chains"
)

// nftproxyCollectors lists the metrics above for registration.
func nftproxyCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		SyncKernelOperations,
		SyncsTotal,
		InvalidObjectsTotal,
		APIEventsTotal,
		ServiceRuleChangesTotal,
		RepairsTotal,
		KubeProxyLeftovers,
		KubeProxyTableRemovalsTotal,
		ReaderWaitSeconds,
		ReaderWaitsTotal,
		ReadersIgnoredTotal,
		ReaderDetectionAvailable,
		RulesetReadFailuresTotal,
	}
}
