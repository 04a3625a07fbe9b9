package main

import (
	"github.com/nftproxy/nftproxy/e2e/promtext"
	"math"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
)

// filledReport has every field of the report, its config and its
// results set (TestFilledReportIsFull checks that no field was left out).
func filledReport() *report {
	c := config{Services: 10000, Endpoints: 5, Changes: 2, ChurnChanges: 3, ChurnRate: 50,
		MonitorChanges: 1, NoopUpdates: 100, Conns: 2, Baseline: 1000, Upstream: true,
		MinSyncPeriod: "0s", ProxyEnv: []string{"GOMEMLIMIT=64MiB"}, LogDir: "logs", CPUProfile: "cpu", Smoke: true,
		Populate: "api", Restart: true, ListFloor: true, Neighbours: true, NeighbourChanges: 10, JSON: "out.json"}
	ms := func(xs ...float64) []time.Duration {
		var ds []time.Duration
		for _, x := range xs {
			ds = append(ds, time.Duration(x*float64(time.Millisecond)))
		}
		return ds
	}
	r := func(name string, scale float64) *result {
		return &result{name: name, load: "1.00 0.50 0.25",
			ready: time.Duration(1.26 * scale * float64(time.Second)), readyDP: 1220 * time.Millisecond,
			fullSync: 0.561 * scale, cpuReady: 1.47,
			idle: ms(5.8, 7.54*scale), churn: ms(491, 966, 12.3*scale), idleSync: []float64{0.00103, 0.0021 * scale},
			idleSyncs: 4, cpuPerChange: 0.0065, churnRate: 49.9, churnMissed: 2, churnCores: 0.03,
			listIdle: ms(620, 650*scale), listChurn: ms(530, 560*scale), listTimeouts: 1, churnListing: ms(9, 259*scale),
			rulesetIdle: 880 * time.Millisecond,
			neighbours: []neighbourResult{{name: "nft monitor", changes: ms(4, 6*scale)},
				{name: "nft list ruleset every 2 s", changes: ms(5, 30*scale), listings: neighbourListings{seconds: ms(900, 1100), timeouts: 1}}},
			repairStuck:        time.Duration(420 * scale * float64(time.Millisecond)),
			syncHist:           promtext.Hist{Count: 46, Sum: 0.762, Le: []float64{0.001, 0.002, math.Inf(1)}, Cum: []float64{10, 40, 46}},
			kernelOpsPerChange: 2, nlObjects: 4, nlGens: 1, nlLost: 1,
			cpuTotal: 2.3, wall: 58 * time.Second, rssProc: 84 << 20, rssTree: 85 << 20,
			nft: true, events: 21216, ruleChanges: 11095,
			syncsByResult: map[string]float64{"success": 47, "unchanged": 45}, syncResults: []string{"success", "unchanged"},
			noop:        noopResult{updates: 100, events: 100, ruleChanges: 1, kernelOps: 2, syncs: 3, nft: true},
			churnWindow: noopResult{events: 989, ruleChanges: 1021, kernelOps: 80, syncs: 40, nft: true},
			fpN:         ms(0.386, 0.758), fpDirect: ms(0.377, 0.606), fpBase: ms(0.243, 0.523), fpBaseDirect: ms(0.232, 0.3),
			probeFailures: fails{"timeout": 1},
			restartReady:  921 * time.Millisecond, restartOps: 7, restartRSS: 81 << 20,
			restartAttempts: 361, restartFailures: fails{"refused": 2},
		}
	}
	return &report{c: c, start: time.Date(2026, 11, 24, 11, 0, 0, 123456789, time.UTC),
		results: []*result{r("nftproxy", 1), r("kube-proxy", 10)}, baselineN: 1000,
		loadStart: "1.51 1.74 1.41", loadEnd: "3.60 2.32 1.77",
		floor: &listFloor{wall: 4250 * time.Millisecond, clientCPU: 3.5, apiCPU: 2.25, heap: 180 << 20}}
}

// notInDocument are the fields --json leaves out: where the logs, the
// CPU profiles and the document itself went.
var notInDocument = map[string]bool{"LogDir": true, "JSON": true, "CPUProfile": true}

// TestFilledReportIsFull keeps filledReport complete: a field added to
// result or config and not filled there (and so maybe not written by
// document) fails here.
func TestFilledReportIsFull(t *testing.T) {
	rep := filledReport()
	checkFull(t, "report", reflect.ValueOf(*rep), nil)
	checkFull(t, "config", reflect.ValueOf(rep.c), notInDocument)
	for _, r := range rep.results {
		checkFull(t, "result "+r.name, reflect.ValueOf(*r), nil)
	}
}

func checkFull(t *testing.T, what string, v reflect.Value, skip map[string]bool) {
	t.Helper()
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if !skip[f.Name] && v.Field(i).IsZero() {
			t.Errorf("%s: field %s is not filled", what, f.Name)
		}
	}
}

// TestJSONRoundTrip writes a filled report with --json's writer, reads it
// back and rebuilds the report: every measured value must survive.
func TestJSONRoundTrip(t *testing.T) {
	rep := filledReport()
	path := filepath.Join(t.TempDir(), "run.json")
	if err := benchdata.Write(path, rep.document("0123abcd", true)); err != nil {
		t.Fatal(err)
	}
	doc, err := benchdata.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if doc.Commit != "0123abcd" || !doc.Dirty {
		t.Errorf("commit %q dirty %v, want 0123abcd true", doc.Commit, doc.Dirty)
	}
	got := reportFromDocument(doc)
	want := *rep
	want.c.LogDir, want.c.JSON, want.c.CPUProfile = "", "", ""
	if !reflect.DeepEqual(got, &want) {
		for i := range want.results {
			if i < len(got.results) && !reflect.DeepEqual(got.results[i], want.results[i]) {
				t.Errorf("result %d:\n got %+v\nwant %+v", i, *got.results[i], *want.results[i])
			}
		}
		t.Fatalf("round trip:\n got %+v\nwant %+v", *got, want)
	}
}

// reportFromDocument is document's inverse, for the round trip.
func reportFromDocument(d *benchdata.Run) *report {
	c := d.Config
	rep := &report{c: config{Services: c.Services, Endpoints: c.Endpoints, Changes: c.Changes,
		ChurnChanges: c.ChurnChanges, ChurnRate: c.ChurnRate, MonitorChanges: c.MonitorChanges,
		NoopUpdates: c.NoopUpdates, Conns: c.Conns, Baseline: c.Baseline, Upstream: c.Upstream,
		MinSyncPeriod: c.MinSyncPeriod, ProxyEnv: c.ProxyEnv, Populate: c.Populate,
		Restart: c.Restart, ListFloor: c.ListFloor, Neighbours: c.Neighbours, NeighbourChanges: c.NeighbourChanges, Smoke: c.Smoke},
		start: d.Date, baselineN: d.BaselineServices, loadStart: d.LoadStart, loadEnd: d.LoadEnd}
	if fl := d.ListFloor; fl != nil {
		rep.floor = &listFloor{wall: duration(fl.Seconds), clientCPU: fl.ClientCPUSeconds, apiCPU: fl.APICPUSeconds, heap: fl.HeapBytes}
	}
	for _, p := range d.Proxies {
		rep.results = append(rep.results, resultFromDocument(p))
	}
	return rep
}

func resultFromDocument(p benchdata.Proxy) *result {
	return &result{name: p.Proxy, load: p.Load,
		ready: duration(p.ReadySeconds), readyDP: duration(p.ReadyDataPathSeconds),
		fullSync: p.FirstFullSyncSeconds, cpuReady: p.CPUReadySeconds,
		idle: durations(p.IdleSeconds), churn: durations(p.ChurnSeconds), idleSync: p.IdleSyncSeconds,
		idleSyncs: p.IdleSyncs, cpuPerChange: p.CPUPerChangeSeconds, churnRate: p.ChurnRate,
		churnMissed: p.ChurnMissed, churnCores: p.ChurnCores,
		listIdle: durations(p.ListIdleSeconds), listChurn: durations(p.ListChurnSeconds), listTimeouts: p.ListChurnTimeouts,
		churnListing: durations(p.ChurnListingSeconds),
		rulesetIdle:  duration(p.RulesetIdleSeconds), neighbours: neighboursFromDocument(p.Neighbours),
		repairStuck: duration(p.RepairStuckReaderSeconds),
		syncHist:    histFromDocument(p.SyncHistogram), kernelOpsPerChange: p.KernelOpsPerChange,
		nlObjects: p.NetlinkObjects, nlGens: p.NetlinkGenerations, nlLost: p.NetlinkLost,
		cpuTotal: p.CPUTotalSeconds, wall: duration(p.WallSeconds), rssProc: p.PeakRSSBytes, rssTree: p.PeakRSSTreeBytes,
		nft: p.NftproxyMetrics, events: p.Events, ruleChanges: p.RuleChanges,
		syncsByResult: p.SyncsByResult, syncResults: sortedKeys(p.SyncsByResult),
		noop: countsFromDocument(p.Noop), churnWindow: countsFromDocument(p.ChurnWindow),
		fpN: durations(p.FirstPacketSeconds), fpDirect: durations(p.FirstPacketDirectSeconds),
		fpBase: durations(p.FirstPacketBaseSeconds), fpBaseDirect: durations(p.FirstPacketBaseDirectSeconds),
		probeFailures: p.ProbeFailures,
		restartReady:  duration(p.RestartReadySeconds), restartOps: p.RestartKernelOps, restartRSS: p.RestartPeakRSSBytes,
		restartAttempts: p.RestartAttempts, restartFailures: p.RestartFailures,
	}
}

func neighboursFromDocument(ns []benchdata.Neighbour) []neighbourResult {
	var out []neighbourResult
	for _, n := range ns {
		out = append(out, neighbourResult{name: n.Name, changes: durations(n.ChangeSeconds),
			listings: neighbourListings{seconds: durations(n.ListingSeconds), timeouts: n.ListingTimeouts}})
	}
	return out
}

func histFromDocument(d benchdata.Histogram) promtext.Hist {
	h := promtext.Hist{Count: d.Count, Sum: d.Sum}
	for _, b := range d.Buckets {
		h.Le, h.Cum = append(h.Le, b.LE), append(h.Cum, b.Count)
	}
	h.Le, h.Cum = append(h.Le, math.Inf(1)), append(h.Cum, d.Count)
	return h
}

func countsFromDocument(c benchdata.Counts) noopResult {
	return noopResult{updates: c.Updates, events: c.Events, ruleChanges: c.RuleChanges,
		kernelOps: c.KernelOps, syncs: c.Syncs, nft: c.Nftproxy}
}

func duration(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }

func durations(ss []float64) []time.Duration {
	var ds []time.Duration
	for _, s := range ss {
		ds = append(ds, duration(s))
	}
	return ds
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
