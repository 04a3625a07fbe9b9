// Package benchdata is the JSON document one run of e2e/cmd/bench writes
// with --json: its configuration and every value it measured for each
// proxy. The bench writes it and e2e/benchplot (a module of its own, so
// that its plotting library stays out of nftproxy's dependencies) reads
// it; one definition keeps the two from drifting apart.
//
// Times are seconds (float64) and sizes bytes, so that the document reads
// without knowing Go's time.Duration.
package benchdata

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// Version is the document's schema version; Read rejects any other.
const Version = 1

// Run is one bench run: one size, one or both proxies.
type Run struct {
	Version int       `json:"version"`
	Date    time.Time `json:"date"`   // when the run started
	Commit  string    `json:"commit"` // git HEAD of the tree the proxies were built from ("" when unknown)
	Dirty   bool      `json:"dirty"`  // that tree had uncommitted changes
	Config  Config    `json:"config"`
	// BaselineServices is the size at which first packets were also timed
	// (0: none; the Proxy.FirstPacketBase* lists are then empty).
	BaselineServices int    `json:"baselineServices"`
	LoadStart        string `json:"loadStart"` // /proc/loadavg, 1, 5 and 15 minutes
	LoadEnd          string `json:"loadEnd"`
	// ListFloor is a bare client's list of the objects (--list-floor;
	// nil when not timed).
	ListFloor *ListFloor `json:"listFloor,omitempty"`
	Proxies   []Proxy    `json:"proxies"` // nftproxy first
}

// ListFloor is what a bare client-go client took to list every Service
// and EndpointSlice into informers: the floor of any proxy's start.
type ListFloor struct {
	Seconds          float64 `json:"seconds"`
	ClientCPUSeconds float64 `json:"clientCPUSeconds"`
	APICPUSeconds    float64 `json:"apiCPUSeconds"` // API server and etcd
	HeapBytes        uint64  `json:"heapBytes"`     // live heap the decoded objects take
}

// Config is the bench's flags.
type Config struct {
	Services         int      `json:"services"`
	Endpoints        int      `json:"endpoints"`
	Changes          int      `json:"changes"`      // idle single changes
	ChurnChanges     int      `json:"churnChanges"` // single changes under churn
	ChurnRate        float64  `json:"churnRate"`    // EndpointSlice updates/s asked for
	MonitorChanges   int      `json:"monitorChanges"`
	NoopUpdates      int      `json:"noopUpdates"`
	Conns            int      `json:"conns"`
	Baseline         int      `json:"baseline"`
	Upstream         bool     `json:"upstream"`
	MinSyncPeriod    string   `json:"minSyncPeriod,omitempty"` // "": the proxies' default
	ProxyEnv         []string `json:"proxyEnv,omitempty"`
	Populate         string   `json:"populate"`
	Restart          bool     `json:"restart"`
	ListFloor        bool     `json:"listFloor"`
	Neighbours       bool     `json:"neighbours,omitempty"`
	NeighbourChanges int      `json:"neighbourChanges,omitempty"`
	Smoke            bool     `json:"smoke"`
}

// Proxy is what one proxy's run measured.
type Proxy struct {
	Proxy string `json:"proxy"` // "nftproxy" or "kube-proxy"
	Load  string `json:"load"`  // load average when its measurement began

	ReadySeconds         float64 `json:"readySeconds"`         // start → first full sync done
	ReadyDataPathSeconds float64 `json:"readyDataPathSeconds"` // start → first answer through a ClusterIP
	FirstFullSyncSeconds float64 `json:"firstFullSyncSeconds"` // the first full sync (own histogram)
	CPUReadySeconds      float64 `json:"cpuReadySeconds"`      // CPU until ready, children included

	// Single changes: data-path latency of each, idle and under churn.
	IdleSeconds         []float64 `json:"idleSeconds"`
	ChurnSeconds        []float64 `json:"churnSeconds"`
	IdleSyncSeconds     []float64 `json:"idleSyncSeconds"` // own partial-sync duration per idle change
	IdleSyncs           float64   `json:"idleSyncs"`       // syncs (all families) during the idle changes
	CPUPerChangeSeconds float64   `json:"cpuPerChangeSeconds"`
	ChurnRate           float64   `json:"churnRate"` // background updates/s achieved
	ChurnMissed         int64     `json:"churnMissed"`
	ChurnCores          float64   `json:"churnCores"` // CPU seconds per second during the churn changes

	// `nft list table` of the proxy's table, idle and under churn (one
	// after the other; an unfinished one counts as its timeout), and the
	// single changes timed while they ran.
	ListIdleSeconds     []float64 `json:"listIdleSeconds,omitempty"`
	ListChurnSeconds    []float64 `json:"listChurnSeconds,omitempty"`
	ListChurnTimeouts   int       `json:"listChurnTimeouts,omitempty"`
	ChurnListingSeconds []float64 `json:"churnListingSeconds,omitempty"`

	// Other processes reading the ruleset under churn: `nft list ruleset`
	// on the idle node, the single changes timed beside each neighbour,
	// and how long a deleted table took to answer again with a reader
	// stuck in a dump.
	RulesetIdleSeconds       float64     `json:"rulesetIdleSeconds,omitempty"`
	Neighbours               []Neighbour `json:"neighbours,omitempty"`
	RepairStuckReaderSeconds float64     `json:"repairStuckReaderSeconds,omitempty"`

	SyncHistogram      Histogram `json:"syncHistogram"` // all IPv4 syncs
	KernelOpsPerChange float64   `json:"kernelOpsPerChange"`
	NetlinkObjects     float64   `json:"netlinkObjects"`     // kernel notifications per monitored change
	NetlinkGenerations float64   `json:"netlinkGenerations"` // transactions per monitored change
	NetlinkLost        int       `json:"netlinkLost"`        // notification overflows

	CPUTotalSeconds  float64 `json:"cpuTotalSeconds"`
	WallSeconds      float64 `json:"wallSeconds"`
	PeakRSSBytes     int64   `json:"peakRSSBytes"`     // the proxy's VmHWM
	PeakRSSTreeBytes int64   `json:"peakRSSTreeBytes"` // proxy + children, sampled

	NftproxyMetrics bool               `json:"nftproxyMetrics"` // the nftproxy_* metrics exist
	Events          float64            `json:"events"`
	RuleChanges     float64            `json:"ruleChanges"`
	SyncsByResult   map[string]float64 `json:"syncsByResult,omitempty"`
	Noop            Counts             `json:"noop"`        // the no-op updates
	ChurnWindow     Counts             `json:"churnWindow"` // while the churn changes were timed

	FirstPacketSeconds           []float64      `json:"firstPacketSeconds"`       // via the ClusterIP, at Services
	FirstPacketDirectSeconds     []float64      `json:"firstPacketDirectSeconds"` // to the pod, at Services
	FirstPacketBaseSeconds       []float64      `json:"firstPacketBaseSeconds"`   // via the ClusterIP, at BaselineServices
	FirstPacketBaseDirectSeconds []float64      `json:"firstPacketBaseDirectSeconds"`
	ProbeFailures                map[string]int `json:"probeFailures,omitempty"` // by kind: refused, timeout…

	RestartReadySeconds float64        `json:"restartReadySeconds"` // the new process's start → first full sync
	RestartKernelOps    float64        `json:"restartKernelOps"`
	RestartPeakRSSBytes int64          `json:"restartPeakRSSBytes"`
	RestartAttempts     int            `json:"restartAttempts"`
	RestartFailures     map[string]int `json:"restartFailures,omitempty"`
}

// Neighbour is one process reading the ruleset beside the churn: the
// single changes timed meanwhile and, if it lists, its listings (an
// unfinished one counts as its timeout).
type Neighbour struct {
	Name            string    `json:"name"`
	ChangeSeconds   []float64 `json:"changeSeconds"`
	ListingSeconds  []float64 `json:"listingSeconds,omitempty"`
	ListingTimeouts int       `json:"listingTimeouts,omitempty"`
}

// Histogram is a Prometheus histogram. Buckets holds the finite upper
// bounds (JSON has no +Inf); the +Inf bucket's count is Count.
type Histogram struct {
	Count   float64  `json:"count"`
	Sum     float64  `json:"sum"`
	Buckets []Bucket `json:"buckets"`
}

// Bucket is one cumulative bucket.
type Bucket struct {
	LE    float64 `json:"le"`
	Count float64 `json:"count"`
}

// Counts are counter deltas over a phase of the run.
type Counts struct {
	Updates     int     `json:"updates,omitempty"`
	Events      float64 `json:"events"`
	RuleChanges float64 `json:"ruleChanges"`
	KernelOps   float64 `json:"kernelOps"`
	Syncs       float64 `json:"syncs"`
	Nftproxy    bool    `json:"nftproxy"` // the nftproxy_* counters exist
}

// Write writes run to path, indented.
func Write(path string, run *Run) error {
	b, err := json.MarshalIndent(run, "", "  ")
	if err != nil {
		return fmt.Errorf("encode bench results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write bench results: %w", err)
	}
	return nil
}

// Read reads a document Write wrote.
func Read(path string) (*Run, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var run Run
	if err := json.Unmarshal(b, &run); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if run.Version != Version {
		return nil, fmt.Errorf("%s: schema version %d, want %d", path, run.Version, Version)
	}
	return &run, nil
}
