package main

import (
	"fmt"
	"github.com/nftproxy/nftproxy/e2e/promtext"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// result is one proxy's measurements.
type result struct {
	name, load string

	ready, readyDP time.Duration // start → first full sync done; → first answer through the ClusterIP
	fullSync       float64       // first full sync, seconds (own histogram)
	cpuReady       float64       // CPU seconds until ready

	idle, churn  []time.Duration // data-path latency of single changes
	idleSync     []float64       // own partial-sync duration per idle change, seconds
	idleSyncs    float64         // syncs (all families) during the idle changes
	cpuPerChange float64         // CPU seconds per idle change
	churnRate    float64         // achieved background updates per second
	churnMissed  int64
	churnCores   float64 // CPU seconds per second during the churn changes

	// `nft list table` of the proxy's table: idle, and under churn one
	// after the other (listTimeouts of them unfinished), with the
	// data-path latency of changes made meanwhile.
	listIdle, listChurn []time.Duration
	listTimeouts        int
	churnListing        []time.Duration

	// Other processes reading the ruleset under churn (neighbours.go):
	// `nft list ruleset` on the idle node, the changes timed beside each
	// neighbour, and the time a deleted table took to answer again with a
	// reader stuck in a dump.
	rulesetIdle time.Duration
	neighbours  []neighbourResult
	repairStuck time.Duration

	syncHist           promtext.Hist // all syncs, IPv4
	kernelOpsPerChange float64       // nftproxy_sync_kernel_operations per idle change
	nlObjects, nlGens  float64       // kernel notifications per monitored change
	nlLost             int

	cpuTotal         float64
	wall             time.Duration
	rssProc, rssTree int64

	nft                 bool // the nftproxy_* metrics exist
	events, ruleChanges float64
	syncsByResult       map[string]float64
	syncResults         []string
	noop                noopResult
	churnWindow         noopResult // counter deltas while the churn changes were timed

	fpN, fpDirect []time.Duration // first-packet latency at N: via ClusterIP, direct to the pod
	fpBase        []time.Duration // via ClusterIP at the baseline size
	fpBaseDirect  []time.Duration // direct to the pod at the baseline size
	probeFailures fails           // attempts without (the right) answer, idle and churn changes and first packets

	// Phase 6, restart with the API state unchanged.
	restartReady    time.Duration // the new process's start → first full sync done
	restartOps      float64       // its kernel operations (nftproxy_sync_kernel_operations_sum) by then
	restartRSS      int64         // its peak RSS (VmHWM)
	restartAttempts int           // connections through the ClusterIP during the restart
	restartFailures fails         // of those, without (the right) answer
}

type noopResult struct {
	updates                               int
	events, ruleChanges, kernelOps, syncs float64
	nft                                   bool
}

type report struct {
	c                  config
	start              time.Time
	results            []*result
	baselineN          int
	loadStart, loadEnd string
	floor              *listFloor // nil: not timed
}

// pct is the q-quantile (nearest rank) of ds; 0 when empty.
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[(len(s)-1)/2]
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// fmtSec prints seconds with a unit that keeps 2–3 significant digits.
func fmtSec(s float64) string {
	switch {
	case math.IsNaN(s):
		return "n/a"
	case s == 0:
		return "0"
	case s < 1e-3:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 10e-3:
		return fmt.Sprintf("%.2f ms", s*1e3)
	case s < 100e-3:
		return fmt.Sprintf("%.1f ms", s*1e3)
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1e3)
	case s < 10:
		return fmt.Sprintf("%.2f s", s)
	default:
		return fmt.Sprintf("%.1f s", s)
	}
}

func fmtNum(x float64) string {
	switch {
	case math.IsNaN(x):
		return "n/a"
	case x == math.Trunc(x):
		return fmt.Sprintf("%.0f", x)
	case x < 10:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.1f", x)
	}
}

// cell is one value of the table: v (NaN: not applicable) and its text.
type cell struct {
	v    float64
	text string
}

func secCell(s float64) cell { return cell{s, fmtSec(s)} }

// listCell is the q-quantile of the listings under churn, marked when
// some did not finish (their time is the timeout).
func listCell(r *result, q float64) cell {
	c := durCell(pct(r.listChurn, q))
	if r.listTimeouts > 0 {
		c.text = fmt.Sprintf("%s (%d of %d unfinished)", c.text, r.listTimeouts, len(r.listChurn))
	}
	return c
}
func durCell(d time.Duration) cell      { return secCell(d.Seconds()) }
func numCell(x float64) cell            { return cell{x, fmtNum(x)} }
func mbCell(b int64) cell               { return cell{mb(b), fmt.Sprintf("%.0f MB", mb(b))} }
func naCell() cell                      { return cell{math.NaN(), "n/a"} }
func textCell(v float64, t string) cell { return cell{v, t} }

type row struct {
	label string
	cells []cell
	ratio bool // lower is better: print kube-proxy / nftproxy
}

func (rep *report) rows() []row {
	var rows []row
	add := func(label string, ratio bool, f func(r *result) cell) {
		rw := row{label: label, ratio: ratio}
		for _, r := range rep.results {
			rw.cells = append(rw.cells, f(r))
		}
		rows = append(rows, rw)
	}
	nftOnly := func(f func(r *result) cell) func(r *result) cell {
		return func(r *result) cell {
			if !r.nft {
				return naCell()
			}
			return f(r)
		}
	}
	c := rep.c
	add("start → rules programmed (first full sync done)", true, func(r *result) cell { return durCell(r.ready) })
	add("start → first answer through a ClusterIP", true, func(r *result) cell { return durCell(r.readyDP) })
	add("first full sync (own histogram)", true, func(r *result) cell { return secCell(r.fullSync) })
	add("CPU until rules programmed (incl. children)", true, func(r *result) cell { return cell{r.cpuReady, fmt.Sprintf("%.2f s", r.cpuReady)} })
	if c.Changes > 0 {
		add(fmt.Sprintf("single change, data path, idle: p50 (%d changes)", c.Changes), true, func(r *result) cell { return durCell(pct(r.idle, 0.5)) })
		add("single change, data path, idle: p99", true, func(r *result) cell { return durCell(pct(r.idle, 0.99)) })
	}
	if c.ChurnChanges > 0 {
		add(fmt.Sprintf("single change, data path, churn: p50 (%d changes)", c.ChurnChanges), true, func(r *result) cell { return durCell(pct(r.churn, 0.5)) })
		add("single change, data path, churn: p99", true, func(r *result) cell { return durCell(pct(r.churn, 0.99)) })
		add("  churn achieved (EndpointSlice updates/s)", false, func(r *result) cell { return cell{r.churnRate, fmt.Sprintf("%.1f", r.churnRate)} })
		add(fmt.Sprintf("nft list table, idle: median (%d listings)", listings), true, func(r *result) cell { return durCell(pct(r.listIdle, 0.5)) })
		add(fmt.Sprintf("nft list table, churn: median (%d listings in a row)", listings), true, func(r *result) cell { return listCell(r, 0.5) })
		add("nft list table, churn: max", true, func(r *result) cell { return listCell(r, 1) })
		add("single change, data path, churn while nft lists: p50", true, func(r *result) cell { return durCell(pct(r.churnListing, 0.5)) })
		add("single change, data path, churn while nft lists: max", true, func(r *result) cell { return durCell(pct(r.churnListing, 1)) })
	}
	if c.ChurnChanges > 0 && c.Neighbours {
		add(fmt.Sprintf("nft list ruleset, idle: median (%d listings)", listings), true, func(r *result) cell { return durCell(r.rulesetIdle) })
		for i, nb := range neighbours {
			res := func(r *result) *neighbourResult {
				if i < len(r.neighbours) {
					return &r.neighbours[i]
				}
				return &neighbourResult{}
			}
			add(fmt.Sprintf("single change, churn, with %s: p50 (%d changes)", nb.name, c.NeighbourChanges), true,
				func(r *result) cell { return durCell(pct(res(r).changes, 0.5)) })
			add("  max", true, func(r *result) cell { return durCell(pct(res(r).changes, 1)) })
			add("  nft list ruleset meanwhile: max", false, func(r *result) cell {
				l := res(r).listings
				if len(l.seconds) == 0 {
					return naCell()
				}
				c := durCell(pct(l.seconds, 1))
				c.text = fmt.Sprintf("%s (%d listings, %d unfinished)", c.text, len(l.seconds), l.timeouts)
				return c
			})
		}
		add("table deleted, churn, a reader stuck in a dump → answers again", true, func(r *result) cell { return durCell(r.repairStuck) })
	}
	if c.Changes > 0 {
		add("sync after an idle change, median (own metric)", true, func(r *result) cell { return secCell(median(r.idleSync)) })
		add("sync after an idle change, max", true, func(r *result) cell { return secCell(maxOf(r.idleSync)) })
		add("syncs per idle change (both families)", false, func(r *result) cell { return numCell(r.idleSyncs / float64(c.Changes)) })
		add("CPU per idle change (incl. children)", true, func(r *result) cell { return secCell(r.cpuPerChange) })
	}
	add("sync histogram IPv4, whole run: count", false, func(r *result) cell { return numCell(r.syncHist.Count) })
	add("sync histogram IPv4: sum", true, func(r *result) cell { return secCell(r.syncHist.Sum) })
	add("sync histogram IPv4: p50 (from buckets)", true, func(r *result) cell { return secCell(r.syncHist.Quantile(0.5)) })
	add("sync histogram IPv4: p99 (from buckets)", true, func(r *result) cell { return secCell(r.syncHist.Quantile(0.99)) })
	if c.Changes > 0 {
		add("kernel operations per single change (own metric)", false, nftOnly(func(r *result) cell { return numCell(r.kernelOpsPerChange) }))
	}
	if c.MonitorChanges > 0 {
		add("nftables objects changed per single change (kernel notifications)", true, func(r *result) cell {
			t := fmtNum(r.nlObjects)
			if r.nlLost > 0 {
				t = "≥ " + t
			}
			return textCell(r.nlObjects, t)
		})
		add("nftables transactions per single change", false, func(r *result) cell { return numCell(r.nlGens) })
	}
	add("CPU, whole run (incl. children)", true, func(r *result) cell { return cell{r.cpuTotal, fmt.Sprintf("%.1f s", r.cpuTotal)} })
	add("  wall time of the run", false, func(r *result) cell { return textCell(r.wall.Seconds(), r.wall.Round(time.Second).String()) })
	if c.ChurnChanges > 0 {
		add("CPU cores used under churn", true, func(r *result) cell { return cell{r.churnCores, fmt.Sprintf("%.2f", r.churnCores)} })
	}
	add("peak RSS, proxy process (VmHWM)", true, func(r *result) cell { return mbCell(r.rssProc) })
	add("peak RSS, proxy + children (sampled)", true, func(r *result) cell { return mbCell(r.rssTree) })
	add("API events received (whole run)", false, nftOnly(func(r *result) cell { return numCell(r.events) }))
	add("Service rule changes (whole run)", false, nftOnly(func(r *result) cell { return numCell(r.ruleChanges) }))
	add("syncs by result (whole run)", false, nftOnly(func(r *result) cell {
		var parts []string
		for _, k := range r.syncResults {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, r.syncsByResult[k]))
		}
		return textCell(0, strings.Join(parts, ", "))
	}))
	if c.ChurnChanges > 0 {
		add("under churn: API events / rule changes / syncs (IPv4+IPv6)", false, func(r *result) cell {
			if !r.nft {
				return textCell(0, fmt.Sprintf("n/a / n/a / %.0f", r.churnWindow.syncs))
			}
			return textCell(0, fmt.Sprintf("%.0f / %.0f / %.0f", r.churnWindow.events, r.churnWindow.ruleChanges, r.churnWindow.syncs))
		})
	}
	if c.NoopUpdates > 0 {
		label := fmt.Sprintf("%d no-op updates: API events / rule changes / kernel ops", c.NoopUpdates)
		add(label, false, nftOnly(func(r *result) cell {
			return textCell(0, fmt.Sprintf("%.0f / %.0f / %.0f", r.noop.events, r.noop.ruleChanges, r.noop.kernelOps))
		}))
		add(fmt.Sprintf("%d no-op updates: syncs", c.NoopUpdates), false, func(r *result) cell { return numCell(r.noop.syncs) })
	}
	if rep.baselineN > 0 && rep.baselineN != c.Services {
		add(fmt.Sprintf("first packet via ClusterIP, %d Services: p50", rep.baselineN), true, func(r *result) cell { return durCell(pct(r.fpBase, 0.5)) })
		add(fmt.Sprintf("first packet via ClusterIP, %d Services: p99", rep.baselineN), true, func(r *result) cell { return durCell(pct(r.fpBase, 0.99)) })
		add(fmt.Sprintf("first packet direct to the pod, %d Services: p50", rep.baselineN), false, func(r *result) cell { return durCell(pct(r.fpBaseDirect, 0.5)) })
	}
	add(fmt.Sprintf("first packet via ClusterIP, %d Services: p50", c.Services), true, func(r *result) cell { return durCell(pct(r.fpN, 0.5)) })
	add(fmt.Sprintf("first packet via ClusterIP, %d Services: p99", c.Services), true, func(r *result) cell { return durCell(pct(r.fpN, 0.99)) })
	add(fmt.Sprintf("first packet direct to the pod, %d Services: p50", c.Services), false, func(r *result) cell { return durCell(pct(r.fpDirect, 0.5)) })
	add(fmt.Sprintf("first packet direct to the pod, %d Services: p99", c.Services), false, func(r *result) cell { return durCell(pct(r.fpDirect, 0.99)) })
	add("data-path attempts without answer", false, func(r *result) cell { return textCell(0, r.probeFailures.String()) })
	if c.Restart {
		add("restart, API unchanged: start → rules programmed", true, func(r *result) cell { return durCell(r.restartReady) })
		add("restart: kernel operations of its first sync (own metric)", false, nftOnly(func(r *result) cell { return numCell(r.restartOps) }))
		add("restart: peak RSS of the new process (VmHWM)", true, func(r *result) cell { return mbCell(r.restartRSS) })
		add("restart: connections through the ClusterIP (every 10 ms) without answer", false, func(r *result) cell {
			return textCell(float64(r.restartFailures.total()), fmt.Sprintf("%s of %d", r.restartFailures.String(), r.restartAttempts))
		})
	}
	return rows
}

// print writes the side-by-side table (Markdown).
func (rep *report) print(w io.Writer) {
	c := rep.c
	fmt.Fprintf(w, "\n%d Services × %d endpoints; %d idle changes, %d under churn at %.0f updates/s; first packets: %d connections; load average %s at start, %s at end\n",
		c.Services, c.Endpoints, c.Changes, c.ChurnChanges, c.ChurnRate, c.Conns, rep.loadStart, rep.loadEnd)
	header := []string{""}
	for _, r := range rep.results {
		header = append(header, r.name)
	}
	two := len(rep.results) == 2
	if two {
		header = append(header, "ratio")
	}
	table := [][]string{header}
	for _, rw := range rep.rows() {
		line := []string{rw.label}
		for _, cl := range rw.cells {
			line = append(line, cl.text)
		}
		if two {
			ratio := ""
			a, b := rw.cells[0].v, rw.cells[1].v
			if rw.ratio && a > 0 && b > 0 && !math.IsNaN(a) && !math.IsNaN(b) {
				ratio = fmtRatio(b / a)
			}
			line = append(line, ratio)
		}
		table = append(table, line)
	}
	width := make([]int, len(header))
	for _, l := range table {
		for i, s := range l {
			width[i] = max(width[i], len([]rune(s)))
		}
	}
	for n, l := range table {
		var sb strings.Builder
		sb.WriteString("|")
		for i, s := range l {
			pad := strings.Repeat(" ", width[i]-len([]rune(s)))
			if i == 0 {
				sb.WriteString(" " + s + pad + " |")
			} else {
				sb.WriteString(" " + pad + s + " |")
			}
		}
		fmt.Fprintln(w, sb.String())
		if n == 0 {
			sb.Reset()
			sb.WriteString("|")
			for i := range l {
				if i == 0 {
					sb.WriteString(strings.Repeat("-", width[i]+2) + "|")
				} else {
					sb.WriteString(strings.Repeat("-", width[i]+1) + ":|")
				}
			}
			fmt.Fprintln(w, sb.String())
		}
	}
	if two {
		fmt.Fprintln(w, "ratio: kube-proxy ÷ nftproxy (higher is better for nftproxy)")
	}
	if fl := rep.floor; fl != nil {
		fmt.Fprintf(w, "API list floor (a bare client-go client listing the Services and EndpointSlices, no proxy): %.2f s; client CPU %.2f s, API server and etcd CPU %.2f s; the objects as decoded %.0f MB of live heap\n",
			fl.wall.Seconds(), fl.clientCPU, fl.apiCPU, float64(fl.heap)/1e6)
	}
}

func fmtRatio(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.0f×", x)
	default:
		return fmt.Sprintf("%.1f×", x)
	}
}

// validate checks nftproxy's numbers (the first result) for completeness
// and plausibility; it returns the problems found.
func (rep *report) validate() []string {
	var p []string
	bad := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if len(rep.results) == 0 || rep.results[0].name != "nftproxy" {
		return []string{"no nftproxy result"}
	}
	r, c := rep.results[0], rep.c
	inRange := func(what string, v, lo, hi float64) {
		if math.IsNaN(v) || v < lo || v > hi {
			bad("%s = %v, want %v…%v", what, v, lo, hi)
		}
	}
	inRange("start → rules programmed (s)", r.ready.Seconds(), 1e-3, 60)
	inRange("start → first answer (s)", r.readyDP.Seconds(), 1e-3, 60)
	inRange("first full sync (s)", r.fullSync, 1e-6, 30)
	inRange("CPU until programmed (s)", r.cpuReady, 0, 60)
	if len(r.idle) != c.Changes || len(r.idleSync) != c.Changes {
		bad("%d idle changes timed, want %d", len(r.idle), c.Changes)
	}
	for _, d := range r.idle {
		inRange("idle change latency (s)", d.Seconds(), 1e-5, 30)
	}
	for _, s := range r.idleSync {
		inRange("sync after an idle change (s)", s, 1e-7, 30)
	}
	if len(r.churn) != c.ChurnChanges {
		bad("%d churn changes timed, want %d", len(r.churn), c.ChurnChanges)
	}
	for _, d := range r.churn {
		inRange("churn change latency (s)", d.Seconds(), 1e-5, 60)
	}
	if c.ChurnChanges > 0 {
		inRange("churn rate achieved (/s)", r.churnRate, 0.2*c.ChurnRate, 2*c.ChurnRate)
		if len(r.listIdle) != listings || len(r.listChurn) != listings {
			bad("%d idle and %d churn listings timed, want %d each", len(r.listIdle), len(r.listChurn), listings)
		}
		if r.listTimeouts > 0 {
			bad("%d of %d listings of the table under churn did not finish", r.listTimeouts, len(r.listChurn))
		}
		if c.Neighbours {
			if len(r.neighbours) != len(neighbours) {
				bad("%d neighbour cases timed, want %d", len(r.neighbours), len(neighbours))
			}
			for _, nb := range r.neighbours {
				if len(nb.changes) != c.NeighbourChanges || nb.listings.timeouts > 0 {
					bad("with %s: %d changes timed (want %d), %d listings unfinished", nb.name, len(nb.changes), c.NeighbourChanges, nb.listings.timeouts)
				}
			}
			inRange("a deleted table answers again (s)", r.repairStuck.Seconds(), 1e-4, 60)
		}
		if len(r.churnListing) == 0 {
			bad("no change timed while nft listed")
		}
	}
	inRange("sync histogram count", r.syncHist.Count, float64(1+c.Changes), 1e7)
	inRange("sync histogram sum (s)", r.syncHist.Sum, 1e-7, 1e4)
	inRange("sync histogram p50 (s)", r.syncHist.Quantile(0.5), 1e-7, 60)
	inRange("CPU whole run (s)", r.cpuTotal, 0.01, 1e4)
	inRange("peak RSS (MB)", mb(r.rssProc), 5, 4096)
	if r.rssTree < r.rssProc {
		bad("peak RSS with children %d < without %d", r.rssTree, r.rssProc)
	}
	if !r.nft {
		bad("no nftproxy_* metrics")
	} else {
		if c.Changes > 0 {
			inRange("kernel operations per single change", r.kernelOpsPerChange, 1, 1000)
		}
		inRange("API events", r.events, float64(c.Services), 1e9)
		inRange("Service rule changes", r.ruleChanges, float64(c.Changes+c.ChurnChanges), 1e9)
		if r.syncsByResult["success"] < 1 {
			bad("no successful sync counted in nftproxy_syncs_total: %v", r.syncsByResult)
		}
		if r.syncsByResult["failure"] > 0 {
			bad("%.0f failed syncs", r.syncsByResult["failure"])
		}
		if c.NoopUpdates > 0 {
			if r.noop.events < float64(c.NoopUpdates) {
				bad("%d no-op updates but %.0f API events counted", c.NoopUpdates, r.noop.events)
			}
			if r.noop.ruleChanges != 0 || r.noop.kernelOps != 0 {
				bad("no-op updates caused %.0f rule changes and %.0f kernel operations", r.noop.ruleChanges, r.noop.kernelOps)
			}
		}
	}
	if c.MonitorChanges > 0 {
		inRange("kernel notifications per change", r.nlObjects, 1, 1e6)
		inRange("transactions per change", r.nlGens, 1, 100)
	}
	if len(r.fpN) != c.Conns || len(r.fpDirect) != c.Conns {
		bad("%d/%d first-packet connections answered, want %d", len(r.fpN), len(r.fpDirect), c.Conns)
	}
	inRange("first packet p50 (s)", pct(r.fpN, 0.5).Seconds(), 1e-6, 1)
	if r.probeFailures.total() > 0 {
		bad("data-path attempts without answer: %v", r.probeFailures)
	}
	if c.Restart {
		inRange("restart: start → rules programmed (s)", r.restartReady.Seconds(), 1e-3, 60)
		if r.nft && r.restartOps != 0 {
			bad("the restart with the API state unchanged sent %.0f kernel operations, want 0", r.restartOps)
		}
		if r.restartAttempts < 10 || r.restartFailures.total() > 0 {
			bad("restart: %v of %d connections through the ClusterIP without answer", r.restartFailures, r.restartAttempts)
		}
	}
	if len(rep.results) > 1 {
		u := rep.results[1]
		if u.ready <= 0 || len(u.idle) != c.Changes || u.syncHist.Count == 0 {
			fmt.Printf("smoke: warning: upstream kube-proxy's numbers are incomplete\n")
		}
	}
	return p
}
