package main

import (
	"context"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/promtext"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// phaseResult is one phase of one column.
type phaseResult struct {
	Arrivals []arrival `json:"arrivals"` // when each watcher had the state the phase ended with
	API      apiCost   `json:"api"`
	// HollowCPU is the hollow watchers' process's CPU seconds over the
	// phase: what the node side did (it runs at the lowest priority,
	// nice 19, so that it does not take the API server's CPU, as it would
	// not on nodes of their own).
	HollowCPU float64 `json:"hollowCPUSeconds"`
	// Took is the phase's length: until every watcher was back, or the
	// churn's length.
	Took time.Duration `json:"took"`
}

// churnResult is the churn phase of one column.
type churnResult struct {
	phaseResult
	Scales, Rollouts, Failures int64
	LastError                  string `json:",omitempty"`
	// SLI is the real nodes' network programming latency over the churn,
	// their histograms added up, as ClusterLoader2 reads it.
	SLI sli `json:"sli"`
	// Syncs is the real nodes' sync durations over the churn
	// (kubeproxy_sync_proxy_rules_duration_seconds), added up.
	Syncs sli `json:"syncs"`
	// Delivered is the churn's EndpointSlice updates from their trigger
	// time to the bench's own watcher (deliveries).
	Delivered sli `json:"delivered"`
}

// sli is a latency histogram's count and quantiles.
type sli struct {
	Samples       float64 `json:"samples"`
	P50, P90, P99 float64 // seconds
}

// columnResult is every phase of one column.
type columnResult struct {
	Name    string      `json:"name"`
	Start   phaseResult `json:"start"`
	Churn   churnResult `json:"churn"`
	Restart phaseResult `json:"restart"`
	Outage  phaseResult `json:"outage"`
	Rollout phaseResult `json:"rollout"`
}

// settle is the pause before a phase: a watcher counts as back once it has
// the marker, which may be before each of its reflectors has (one that
// resumed its watch may be ahead of one that relists after a 410 and its
// backoff); the next phase must not begin while they catch up.
const settle = 15 * time.Second

// measureColumn runs every phase with col's proxies, on an API server
// started afresh for it.
func (cl *cluster) measureColumn(col string) columnResult {
	cl.tb.Logf("clusterbench: column %s", col)
	cl.stopControlLoops()
	cl.bed.StopAPIServer()
	cl.bed.StartAPIServer()
	cl.startControlLoops()
	cl.bumpMarker(time.Minute)
	r := columnResult{Name: col}

	cl.tb.Logf("clusterbench: %s: start of %d hollow and %d real nodes", col, cl.cfg.Hollow, cl.cfg.Real)
	m := cl.startMeter(false, cl.txBytes())
	t0 := time.Now()
	w := cl.startWatchers(col)
	r.Start = cl.until(t0, m, w, 0)

	cl.tb.Logf("clusterbench: %s: churn for %v", col, cl.cfg.Churn)
	r.Churn = cl.churnPhase(w)

	cl.tb.Logf("clusterbench: %s: the API server restarted at once", col)
	time.Sleep(settle)
	r.Restart = cl.stormPhase(w, 0)
	cl.tb.Logf("clusterbench: %s: the API server down for %v", col, cl.cfg.Outage)
	time.Sleep(settle)
	r.Outage = cl.stormPhase(w, cl.cfg.Outage)

	cl.tb.Logf("clusterbench: %s: every proxy restarted at once", col)
	time.Sleep(settle)
	cl.bumpMarker(time.Minute)
	if missing := countMissing(cl.waitMarker(time.Now())); missing > 0 {
		cl.tb.Logf("clusterbench: %s: %d watchers without the marker before the rollout", col, missing)
	}
	cl.bumpMarker(time.Minute)
	m = cl.startMeter(false, cl.txBytes())
	t0 = time.Now()
	cl.stopWatchers(w)
	w = cl.startWatchers(col)
	r.Rollout = cl.until(t0, m, w, 0)
	cl.stopWatchers(w)
	return r
}

// until waits for every watcher to have the current marker, counting from
// zero, and stops m; hollowCPU0 is the hollow process's CPU seconds at the
// phase's start.
func (cl *cluster) until(zero time.Time, m *meter, w *watchers, hollowCPU0 float64) phaseResult {
	arr := cl.waitMarker(zero)
	r := phaseResult{Arrivals: arr, API: m.stop(), Took: time.Since(zero),
		HollowCPU: cpuSeconds(w.hollow.Pid()) - hollowCPU0}
	if n := countMissing(arr); n > 0 {
		cl.tb.Logf("clusterbench: %d watchers did not get the marker within %v", n, cl.cfg.Limit)
	}
	return r
}

// stormPhase stops the API server, keeps it down for down, starts it, moves
// the marker as soon as it is ready, and waits for every watcher to have
// it: the time counts from the server's readiness. The API server's costs
// are those of the new process, from its start.
func (cl *cluster) stormPhase(w *watchers, down time.Duration) phaseResult {
	tx0, cpu0 := cl.txBytes(), cpuSeconds(w.hollow.Pid())
	cl.bed.StopAPIServer()
	time.Sleep(down)
	ready := cl.bed.StartAPIServer()
	m := cl.startMeter(true, tx0)
	cl.bumpMarker(time.Minute)
	return cl.until(ready, m, w, cpu0)
}

// churnPhase runs the churn and reads the real nodes' network programming
// latency over it.
func (cl *cluster) churnPhase(w *watchers) churnResult {
	before := cl.realHistograms(programmingLatency, syncDuration)
	cpu0 := cpuSeconds(w.hollow.Pid())
	m := cl.startMeter(false, cl.txBytes())
	d := cl.watchDeliveries()
	t0 := time.Now()
	ch := cl.startChurn()
	time.Sleep(cl.cfg.Churn)
	var r churnResult
	r.Scales, r.Rollouts, r.Failures, r.LastError = ch.end()
	// The last changes reach the nodes, and the marker shows they have.
	cl.bumpMarker(time.Minute)
	r.Arrivals = cl.waitMarker(time.Now())
	r.API, r.Took, r.HollowCPU = m.stop(), time.Since(t0), cpuSeconds(w.hollow.Pid())-cpu0
	after := cl.realHistograms(programmingLatency, syncDuration)
	r.SLI, r.Syncs = quantiles(after[0].Minus(before[0])), quantiles(after[1].Minus(before[1]))
	var stale sli
	r.Delivered, stale = d.end()
	cl.tb.Logf("clusterbench: churn: %.0f EndpointSlice updates with a new trigger time; %.0f kept the one they had, "+
		"%.2f s old at the median, %.2f s at the 99th percentile (each a sample from that time)",
		r.Delivered.Samples, stale.Samples, stale.P50, stale.P99)
	return r
}

// The real nodes' histograms the churn reads: both proxies export them.
const (
	programmingLatency = "kubeproxy_network_programming_duration_seconds"
	syncDuration       = "kubeproxy_sync_proxy_rules_duration_seconds"
)

func quantiles(h promtext.Hist) sli {
	return sli{Samples: h.Count, P50: h.Quantile(0.5), P90: h.Quantile(0.9), P99: h.Quantile(0.99)}
}

// realHistograms adds up histograms of the real nodes (both families),
// each in the order of names, as ClusterLoader2's query sums the network
// programming latency over every proxy before taking quantiles. Each node
// is scraped once.
func (cl *cluster) realHistograms(names ...string) []promtext.Hist {
	scrapes := make([]promtext.Scrape, len(cl.real))
	errs := make([]error, len(cl.real))
	var wg sync.WaitGroup
	for i, node := range cl.real {
		wg.Go(func() { scrapes[i], errs[i] = nodeMetrics(node) })
	}
	wg.Wait()
	totals := make([]promtext.Hist, len(names))
	for i, node := range cl.real {
		if errs[i] != nil {
			cl.tb.Fatalf("clusterbench: the metrics of %s: %v", node.Name, errs[i])
		}
		for j, name := range names {
			// Empty while the proxy has no sample: a histogram vector has
			// no series before its first.
			h, _ := scrapes[i].Histogram(name, nil)
			totals[j] = totals[j].Plus(h)
		}
	}
	return totals
}

// nodeMetrics scrapes the proxy on node.
func nodeMetrics(node *testbed.Node) (promtext.Scrape, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := node.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		return nil, err
	}
	return promtext.Parse(body), nil
}

func countMissing(arr []arrival) int {
	n := 0
	for _, a := range arr {
		if a.Missing {
			n++
		}
	}
	return n
}
