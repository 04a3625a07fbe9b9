package main

import (
	"github.com/nftproxy/nftproxy/e2e/promtext"
	"math"
	"os/exec"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
)

// document is the report as --json writes it (e2e/benchdata): every
// measured value, lists of latencies in full.
func (rep *report) document(commit string, dirty bool) *benchdata.Run {
	c := rep.c
	run := &benchdata.Run{
		Version: benchdata.Version, Date: rep.start.UTC(), Commit: commit, Dirty: dirty,
		Config: benchdata.Config{Services: c.Services, Endpoints: c.Endpoints, Changes: c.Changes,
			ChurnChanges: c.ChurnChanges, ChurnRate: c.ChurnRate, MonitorChanges: c.MonitorChanges,
			NoopUpdates: c.NoopUpdates, Conns: c.Conns, Baseline: c.Baseline, Upstream: c.Upstream,
			MinSyncPeriod: c.MinSyncPeriod, ProxyEnv: c.ProxyEnv, Populate: c.Populate,
			Restart: c.Restart, ListFloor: c.ListFloor, Neighbours: c.Neighbours, NeighbourChanges: c.NeighbourChanges, Smoke: c.Smoke},
		BaselineServices: rep.baselineN, LoadStart: rep.loadStart, LoadEnd: rep.loadEnd,
	}
	if fl := rep.floor; fl != nil {
		run.ListFloor = &benchdata.ListFloor{Seconds: fl.wall.Seconds(), ClientCPUSeconds: fl.clientCPU, APICPUSeconds: fl.apiCPU, HeapBytes: fl.heap}
	}
	for _, r := range rep.results {
		run.Proxies = append(run.Proxies, r.document())
	}
	return run
}

func (r *result) document() benchdata.Proxy {
	return benchdata.Proxy{
		Proxy: r.name, Load: r.load,
		ReadySeconds: r.ready.Seconds(), ReadyDataPathSeconds: r.readyDP.Seconds(),
		FirstFullSyncSeconds: r.fullSync, CPUReadySeconds: r.cpuReady,

		IdleSeconds: seconds(r.idle), ChurnSeconds: seconds(r.churn), IdleSyncSeconds: r.idleSync,
		IdleSyncs: r.idleSyncs, CPUPerChangeSeconds: r.cpuPerChange, ChurnRate: r.churnRate,
		ChurnMissed: r.churnMissed, ChurnCores: r.churnCores,
		ListIdleSeconds: seconds(r.listIdle), ListChurnSeconds: seconds(r.listChurn), ListChurnTimeouts: r.listTimeouts,
		ChurnListingSeconds: seconds(r.churnListing),
		RulesetIdleSeconds:  r.rulesetIdle.Seconds(), Neighbours: neighboursDocument(r.neighbours),
		RepairStuckReaderSeconds: r.repairStuck.Seconds(),

		SyncHistogram: histDocument(r.syncHist), KernelOpsPerChange: r.kernelOpsPerChange,
		NetlinkObjects: r.nlObjects, NetlinkGenerations: r.nlGens, NetlinkLost: r.nlLost,

		CPUTotalSeconds: r.cpuTotal, WallSeconds: r.wall.Seconds(),
		PeakRSSBytes: r.rssProc, PeakRSSTreeBytes: r.rssTree,

		NftproxyMetrics: r.nft, Events: r.events, RuleChanges: r.ruleChanges,
		SyncsByResult: r.syncsByResult, Noop: r.noop.document(), ChurnWindow: r.churnWindow.document(),

		FirstPacketSeconds: seconds(r.fpN), FirstPacketDirectSeconds: seconds(r.fpDirect),
		FirstPacketBaseSeconds: seconds(r.fpBase), FirstPacketBaseDirectSeconds: seconds(r.fpBaseDirect),
		ProbeFailures: r.probeFailures,

		RestartReadySeconds: r.restartReady.Seconds(), RestartKernelOps: r.restartOps,
		RestartPeakRSSBytes: r.restartRSS, RestartAttempts: r.restartAttempts,
		RestartFailures: r.restartFailures,
	}
}

func neighboursDocument(ns []neighbourResult) []benchdata.Neighbour {
	var out []benchdata.Neighbour
	for _, n := range ns {
		out = append(out, benchdata.Neighbour{Name: n.name, ChangeSeconds: seconds(n.changes),
			ListingSeconds: seconds(n.listings.seconds), ListingTimeouts: n.listings.timeouts})
	}
	return out
}

// histDocument is h as the JSON document holds it.
func histDocument(h promtext.Hist) benchdata.Histogram {
	d := benchdata.Histogram{Count: h.Count, Sum: h.Sum, Buckets: []benchdata.Bucket{}}
	for i, le := range h.Le {
		if i < len(h.Cum) && !math.IsInf(le, 1) {
			d.Buckets = append(d.Buckets, benchdata.Bucket{LE: le, Count: h.Cum[i]})
		}
	}
	return d
}

func (n noopResult) document() benchdata.Counts {
	return benchdata.Counts{Updates: n.updates, Events: n.events, RuleChanges: n.ruleChanges,
		KernelOps: n.kernelOps, Syncs: n.syncs, Nftproxy: n.nft}
}

// seconds is ds in seconds; never nil, so that JSON shows an empty list
// rather than null.
func seconds(ds []time.Duration) []float64 {
	s := make([]float64, 0, len(ds))
	for _, d := range ds {
		s = append(s, d.Seconds())
	}
	return s
}

// gitHead is the commit of the tree the bench runs in (the proxies are
// built from it) and whether that tree has uncommitted changes; "" when
// git cannot tell.
func gitHead() (string, bool) {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "", false
	}
	status, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
	return strings.TrimSpace(string(out)), err == nil && len(strings.TrimSpace(string(status))) > 0
}
