package proxier

// What the sync loop reports: metrics, the health of the sync, and logs.

import (
	"iter"
	"time"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// initMetrics creates at 0, before anything happens, the series of the
// counters whose label values are known in advance: the API events by
// kind, the invalid objects by kind and reason, the waits for readers by
// how they ended, and each family's of initFamilyMetrics. A counter series
// that is born at 1 shows no increase, so without them an alert on rate()
// or increase() would miss the first event, and dashboards would show "no
// data" for a healthy proxy instead of 0.
func initMetrics(families iter.Seq[nft.Family]) {
	for _, kind := range watch.Kinds {
		metrics.APIEventsTotal.WithLabelValues(kind)
	}
	for kind, reasons := range watch.Reasons {
		for _, reason := range reasons {
			metrics.InvalidObjectsTotal.WithLabelValues(kind, reason)
		}
	}
	for _, result := range []string{metrics.ReaderWaitEnded, metrics.ReaderWaitTimedOut, metrics.ReaderWaitRepair} {
		metrics.ReaderWaitsTotal.WithLabelValues(result)
	}
	for _, reason := range []string{metrics.ReaderStalled, metrics.ReaderBudgetSpent} {
		metrics.ReadersIgnoredTotal.WithLabelValues(reason)
	}
	for f := range families {
		initFamilyMetrics(f.IPFamily())
	}
}

// initFamilyMetrics creates a family's counter series at 0 (see
// initMetrics): its syncs by result and their failures, the failed reads
// of its table, the Services whose rules changed, the failed cleanups, the
// stale flows deleted, and the repairs by kind.
func initFamilyMetrics(fam string) {
	metrics.NFTablesSyncFailuresTotal.WithLabelValues(fam)
	for _, result := range []string{metrics.ResultSuccess, metrics.ResultUnchanged, metrics.ResultFailure} {
		metrics.SyncsTotal.WithLabelValues(fam, result)
	}
	for _, reader := range []string{metrics.ReaderTable, metrics.ReaderCounters} {
		metrics.RulesetReadFailuresTotal.WithLabelValues(fam, reader)
	}
	metrics.ServiceRuleChangesTotal.WithLabelValues(fam)
	metrics.NFTablesCleanupFailuresTotal.WithLabelValues(fam)
	metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(fam)
	for _, kind := range repairKinds() {
		metrics.RepairsTotal.WithLabelValues(fam, kind)
	}
}

// observeProgrammingLatency records the network programming latency of
// EndpointSlice updates that family f's sync, ended at now, programmed:
// one sample per update, from the update's own trigger time, as kube-proxy
// records them. Updates of one slice that a sync took together (they
// came faster than the syncs, or a sync waited for a reader or its retry)
// are each observed, the older ones with their longer wait. Updates made
// before the proxier started are left out by the trackers
// (watch.NewTrackers).
func observeProgrammingLatency(f nft.Family, triggers []time.Time, now time.Time) {
	if len(triggers) == 0 {
		return
	}
	h := metrics.NetworkProgrammingLatency.WithLabelValues(f.IPFamily())
	for _, t := range triggers {
		h.Observe(now.Sub(t).Seconds())
	}
}

// countUpdates counts the Service and EndpointSlice updates the watchers
// recorded (watch.Hooks.Updated) as kube-proxy counts them: every event,
// whether or not a sync follows it alone.
func countUpdates(kind string, n int) {
	switch kind {
	case watch.KindService:
		metrics.ServiceChangesTotal.Add(float64(n))
	case watch.KindEndpointSlice:
		metrics.EndpointChangesTotal.Add(float64(n))
	}
}

// logSynced logs a successful sync at -v 2, with where the time went when
// the backend has a kernel (the rest of elapsed is building).
func logSynced(f nft.Family, fs *familyState, backend nft.Backend, sent txSize, elapsed time.Duration,
	full, fromKernel, repair bool) {
	kv := []any{"ipFamily", f.IPFamily(), "full", full, "fromKernel", fromKernel, "repair", repair, "servicePorts", fs.ports,
		"ops", sent.ops, "changes", sent.changes, "elapsed", elapsed}
	if st := backend.LastCommit(); sent.ops > 0 && st.Bytes > 0 {
		kv = append(kv, "bytes", st.Bytes, "encode", st.Encode, "kernel", st.Kernel, "kernelCPU", st.KernelCPU)
	}
	klog.V(2).InfoS("Synced", kv...)
}

// txSize is what a sync sent: operations, and the objects they changed
// (nft.Transaction.Changes).
type txSize struct{ ops, changes int }

func sizeOf(tx *nft.Transaction) txSize { return txSize{len(tx.Ops), tx.Changes()} }

func (s *txSize) add(o txSize) { s.ops, s.changes = s.ops+o.ops, s.changes+o.changes }

// recordSync updates the metrics and health after a successful sync.
func (p *Proxier) recordSync(f nft.Family, fs *familyState, full bool, elapsed time.Duration, sent txSize) {
	fam := f.IPFamily()
	metrics.SyncProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	if full {
		metrics.SyncFullProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	} else {
		metrics.SyncPartialProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	}
	metrics.SyncProxyRulesLastTimestamp.WithLabelValues(fam).Set(float64(time.Now().Unix()))
	metrics.SyncKernelOperations.WithLabelValues(fam).Observe(float64(sent.ops))
	result := metrics.ResultSuccess
	if sent.ops == 0 {
		result = metrics.ResultUnchanged
	}
	metrics.SyncsTotal.WithLabelValues(fam, result).Inc()
	metrics.SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues(metrics.TrafficPolicyInternal, fam).Set(float64(len(fs.noLocalInternal)))
	metrics.SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues(metrics.TrafficPolicyExternal, fam).Set(float64(len(fs.noLocalExternal)))
	if p.deps.Health != nil {
		p.deps.Health.Updated(f)
	}
}
