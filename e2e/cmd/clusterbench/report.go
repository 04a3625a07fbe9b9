package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// results are a run's figures.
type results struct {
	Config  config           `json:"config"`
	Machine string           `json:"machine"`
	Runs    [][]columnResult `json:"runs"` // each run's columns, in the order of Config.Columns
	Took    time.Duration    `json:"took"`
}

// machine names the machine and the day.
func machine() string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	return fmt.Sprintf("%s, Linux %s, %d CPUs", time.Now().UTC().Format("2006-01-02"),
		unix.ByteSliceToString(u.Release[:]), runtime.NumCPU())
}

func (r *results) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// The markers around the tables in docs/scale.md.
const (
	docBegin = "<!-- clusterbench: begin (make cluster-bench rewrites what is between these lines) -->"
	docEnd   = "<!-- clusterbench: end -->"
)

// rewriteDoc replaces what is between the markers of the page at path with
// the tables.
func (r *results) rewriteDoc(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(b)
	i, j := strings.Index(s, docBegin), strings.Index(s, docEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q … %q", path, docBegin, docEnd)
	}
	s = s[:i+len(docBegin)] + "\n" + r.markdown() + s[j:]
	return os.WriteFile(path, []byte(s), 0o644)
}

// row is one line of a table: a figure per column.
type row struct {
	what  string
	value func(c *columnResult, p *phaseResult) float64
	unit  string // "s", "MB", "" (a count)
}

// markdown is the run's tables.
func (r *results) markdown() string {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "Run of %s: %d hollow nodes and %d real nodes on one API server; %d static Services × %d endpoints, "+
		"%d Deployments × %d replicas behind Services of their own; churn %v (one scale or rollout every %v); outage %v. "+
		"Each figure is the median of %d runs, the columns measured in turn; the whole took %v.\n\n",
		r.Machine, c.Hollow, c.Real, c.Services, c.Endpoints, c.Deployments, c.Replicas,
		c.Churn, c.ChurnEvery, c.Outage, len(r.Runs), r.Took.Round(time.Second))
	phases := []struct {
		name string
		of   func(c *columnResult) *phaseResult
		rows []row
	}{
		{"Start: every proxy started at once", func(c *columnResult) *phaseResult { return &c.Start }, backRows()},
		{"Churn: Deployments scaled and rolled", func(c *columnResult) *phaseResult { return &c.Churn.phaseResult }, churnRows()},
		{"Restart storm: the API server restarted at once (times from its readiness)",
			func(c *columnResult) *phaseResult { return &c.Restart }, backRows()},
		{fmt.Sprintf("Outage storm: the API server down for %v, then started (times from its readiness)", c.Outage),
			func(c *columnResult) *phaseResult { return &c.Outage }, backRows()},
		{"Rollout: every proxy restarted at once", func(c *columnResult) *phaseResult { return &c.Rollout }, backRows()},
	}
	for _, p := range phases {
		fmt.Fprintf(&b, "**%s**\n\n| |", p.name)
		for _, col := range c.Columns {
			fmt.Fprintf(&b, " %s |", col)
		}
		two := len(c.Columns) == 2
		if two {
			b.WriteString(" kube-proxy / nftproxy |")
		}
		b.WriteString("\n|---|" + strings.Repeat("--:|", len(c.Columns)))
		if two {
			b.WriteString("--:|")
		}
		b.WriteString("\n")
		for _, rw := range append(p.rows, apiRows()...) {
			fmt.Fprintf(&b, "| %s |", rw.what)
			var vals []float64
			for i := range c.Columns {
				var runs []float64
				for _, run := range r.Runs {
					runs = append(runs, rw.value(&run[i], p.of(&run[i])))
				}
				v := median(runs)
				vals = append(vals, v)
				fmt.Fprintf(&b, " %s |", format(v, rw.unit))
			}
			if two {
				fmt.Fprintf(&b, " %s |", ratio(vals[0], vals[1]))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// backRows are the rows of a phase that waits for every watcher to be
// back: when the median and the last had the new state, over every
// watcher and over the real nodes (whose data path shows it).
func backRows() []row {
	at := func(q float64, real bool) func(*columnResult, *phaseResult) float64 {
		return func(_ *columnResult, p *phaseResult) float64 { return quantile(p.Arrivals, q, real) }
	}
	return []row{
		{"every watcher back: median", at(0.5, false), "s"},
		{"every watcher back: 90th percentile", at(0.9, false), "s"},
		{"every watcher back: the last", at(1, false), "s"},
		{"real nodes' data path: median", at(0.5, true), "s"},
		{"real nodes' data path: the last", at(1, true), "s"},
	}
}

// churnRows are the churn phase's own rows: what it did, and the network
// programming latency across the real nodes.
func churnRows() []row {
	churn := func(f func(r *churnResult) float64) func(*columnResult, *phaseResult) float64 {
		return func(c *columnResult, _ *phaseResult) float64 { return f(&c.Churn) }
	}
	return []row{
		{"scales and rollouts", churn(func(r *churnResult) float64 { return float64(r.Scales + r.Rollouts) }), ""},
		{"NetworkProgrammingLatency samples (real nodes)", churn(func(r *churnResult) float64 { return r.SLI.Samples }), ""},
		{"NetworkProgrammingLatency p50", churn(func(r *churnResult) float64 { return r.SLI.P50 }), "s"},
		{"NetworkProgrammingLatency p90", churn(func(r *churnResult) float64 { return r.SLI.P90 }), "s"},
		{"NetworkProgrammingLatency p99", churn(func(r *churnResult) float64 { return r.SLI.P99 }), "s"},
		{"real nodes' syncs: p50", churn(func(r *churnResult) float64 { return r.Syncs.P50 }), "s"},
		{"… p99", churn(func(r *churnResult) float64 { return r.Syncs.P99 }), "s"},
		{"EndpointSlice updates at the bench's watcher (trigger time to arrival): p50", churn(func(r *churnResult) float64 { return r.Delivered.P50 }), "s"},
		{"… p99", churn(func(r *churnResult) float64 { return r.Delivered.P99 }), "s"},
	}
}

// apiRows are what a phase cost the API server.
func apiRows() []row {
	api := func(f func(a *apiCost) float64) func(*columnResult, *phaseResult) float64 {
		return func(_ *columnResult, p *phaseResult) float64 { return f(&p.API) }
	}
	return []row{
		{"API server CPU", api(func(a *apiCost) float64 { return a.CPUSeconds }), "s"},
		{"API server peak RSS", api(func(a *apiCost) float64 { return float64(a.PeakRSS) }), "MB"},
		{"bytes sent to the nodes", api(func(a *apiCost) float64 { return float64(a.SentBytes) }), "MB"},
		{"watch event bytes (encoded)", api(func(a *apiCost) float64 { return a.WatchEventBytes }), "MB"},
		{"LISTs of Services and EndpointSlices", api(func(a *apiCost) float64 { return a.Lists }), ""},
		{"watch-lists of Services and EndpointSlices", api(func(a *apiCost) float64 { return a.WatchLists }), ""},
		{"lists served from the watch cache", api(func(a *apiCost) float64 { return a.ListsFromCache }), ""},
		{"lists from etcd", api(func(a *apiCost) float64 { return a.ListsFromEtcd }), ""},
		{"watches open at the end: Services and EndpointSlices", api(func(a *apiCost) float64 { return a.ProxyWatches }), ""},
		{"… of Nodes", api(func(a *apiCost) float64 { return a.NodeWatches }), ""},
		{"429s (any request)", api(func(a *apiCost) float64 { return a.TooManyRequests }), ""},
		{"API Priority and Fairness rejections", api(func(a *apiCost) float64 { return a.Rejected }), ""},
		{"hollow watchers' CPU (their process, nice 19)", func(_ *columnResult, p *phaseResult) float64 { return p.HollowCPU }, "s"},
	}
}

// median is the median of vs (the mean of the middle two of an even
// number); +Inf sorts last, NaN when vs is empty.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	vs = slices.Clone(vs)
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}

// quantile is the q-quantile of the arrival times (of the real nodes only,
// if real), in seconds: +Inf where it falls on watchers that never
// arrived, NaN if there is none.
func quantile(arr []arrival, q float64, real bool) float64 {
	var ds []float64
	for _, a := range arr {
		switch {
		case real && !a.Real:
		case a.Missing:
			ds = append(ds, math.Inf(1))
		default:
			ds = append(ds, a.After.Seconds())
		}
	}
	slices.Sort(ds)
	return rank(ds, q)
}

// rank is the q-quantile of sorted (nearest rank), NaN if it is empty.
func rank(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func format(v float64, unit string) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case math.IsInf(v, 1):
		return "not all back"
	}
	switch unit {
	case "s":
		if v > 0 && v < 0.1 {
			return fmt.Sprintf("%.1f ms", v*1e3)
		}
		if v < 10 {
			return fmt.Sprintf("%.2f s", v)
		}
		return fmt.Sprintf("%.1f s", v)
	case "MB":
		return fmt.Sprintf("%.0f MB", v/1e6)
	}
	return fmt.Sprintf("%.0f", v)
}

// ratio is kube-proxy's figure over nftproxy's.
func ratio(nft, kp float64) string {
	if nft == 0 || math.IsNaN(nft) || math.IsNaN(kp) || math.IsInf(nft, 0) || math.IsInf(kp, 0) {
		return "–"
	}
	return fmt.Sprintf("%.2f×", kp/nft)
}
