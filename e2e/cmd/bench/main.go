// Command bench measures nftproxy, and with --upstream upstream kube-proxy
// (the newest release of e2e/tools/versions) in nftables mode, on the e2e test bed: a real kube-apiserver with N
// selector-less Services of M endpoints each (EndpointSlices written
// directly), each proxy in its own node namespace, one proxy after the other
// (the first is stopped before the second starts, so neither competes with
// the other for the 2 CPUs), on the same API state.
//
// Per proxy it measures, and prints side by side with ratios:
//
//   - time from process start to the first full sync (the proxy's own
//     metric) and to the first answer through a ClusterIP, and the first
//     full sync's duration;
//   - single-change latency in the data path: an EndpointSlice update moves
//     one Service to another server pod while a client pod on the proxy's
//     node connects to the ClusterIP until that pod answers; p50/p99 over
//     --changes changes with the proxy idle, and again (--churn-changes)
//     while a background writer updates other Services' EndpointSlices at
//     --churn-rate per second;
//   - the sync duration histogram, the syncs after the idle changes, CPU
//     seconds and peak RSS including child processes (upstream runs `nft`),
//     nftproxy's kernel operations per change and, for both, the nftables
//     objects the kernel reports changed per change (netlink notifications);
//   - nftproxy's API events received versus Service rule changes and syncs,
//     and what API updates that change no rule cost each proxy;
//   - connect+first-byte latency of new TCP connections through a ClusterIP
//     at --baseline (1000) Services and at N.
//
// Usage (as root):
//
//	bench --services 10000 --endpoints 5 --changes 20 --upstream
//	bench --services 1000 --upstream --json bench-1000.json   # also every value as JSON, for e2e/benchplot
//	bench --smoke   # 50×2, 3 changes, with upstream; exits 1 if nftproxy's numbers are missing or absurd
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
	"github.com/nftproxy/nftproxy/e2e/procstat"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// config is what the flags set.
type config struct {
	Services, Endpoints int
	Changes             int     // idle single changes
	ChurnChanges        int     // single changes under churn
	ChurnRate           float64 // EndpointSlice updates per second on other Services
	MonitorChanges      int     // single changes with netlink notifications counted
	NoopUpdates         int     // API updates that change no rule
	Conns               int     // connections for first-packet latency
	Baseline            int     // also measure first-packet latency at this many Services
	Upstream            bool
	MinSyncPeriod       string   // --iptables-min-sync-period for both proxies ("" = their default, 1s)
	ProxyEnv            []string // KEY=VALUE settings added to both proxies' environment (GOMEMLIMIT…)
	CPUProfile          string   // nftproxy's CPU profile of each start is written to <CPUProfile>-<n>.pprof
	LogDir              string
	Smoke               bool
	Populate            string // "api", "etcd" or "auto" (etcd above etcdAbove Services)
	ListFloor           bool   // time a bare client's list first (listfloor.go)
	Restart             bool   // phase 6: restart the proxy with the API state unchanged
	Neighbours          bool   // processes reading the ruleset beside the churn (neighbours.go)
	NeighbourChanges    int    // single changes timed beside each of them
	JSON                string // --json: write every measured value into this file (e2e/benchdata)
}

// etcdAbove is the number of Services above which --populate auto writes
// them into etcd: creating them through the API costs O(N²) (etcd.go).
const etcdAbove = 20000

func (c config) populateEtcd() bool {
	return c.Populate == "etcd" || (c.Populate == "auto" && c.Services > etcdAbove)
}

func defaultConfig() config {
	return config{Services: 1000, Endpoints: 5, Changes: 20, ChurnChanges: -1, ChurnRate: 50,
		MonitorChanges: 3, NoopUpdates: 100, Conns: 200, Baseline: 1000, Populate: "auto", Restart: true, ListFloor: true,
		Neighbours: true, NeighbourChanges: 10}
}

// smokeConfig is --smoke: small and quick, both proxies.
func smokeConfig() config {
	c := defaultConfig()
	c.Services, c.Endpoints, c.Changes, c.ChurnChanges = 50, 2, 3, 3
	c.MonitorChanges, c.NoopUpdates, c.Conns, c.Baseline, c.NeighbourChanges = 1, 20, 20, 0, 2
	c.Upstream, c.Smoke = true, true
	return c
}

func main() {
	c := defaultConfig()
	flag.IntVar(&c.Services, "services", c.Services, "number of Services (N)")
	flag.IntVar(&c.Endpoints, "endpoints", c.Endpoints, "endpoints per Service (M)")
	flag.IntVar(&c.Changes, "changes", c.Changes, "single changes timed with the proxy idle")
	flag.IntVar(&c.ChurnChanges, "churn-changes", c.ChurnChanges, "single changes timed under churn (-1: as --changes)")
	flag.Float64Var(&c.ChurnRate, "churn-rate", c.ChurnRate, "background EndpointSlice updates per second during the churn changes")
	flag.IntVar(&c.MonitorChanges, "monitor-changes", c.MonitorChanges, "single changes whose kernel notifications are counted (0: skip)")
	flag.IntVar(&c.NoopUpdates, "noop-updates", c.NoopUpdates, "API updates that change no rule (annotations)")
	flag.IntVar(&c.Conns, "conns", c.Conns, "new connections timed for first-packet latency")
	flag.IntVar(&c.Baseline, "baseline", c.Baseline, "also time first packets with this many Services (0: only at N)")
	flag.BoolVar(&c.Upstream, "upstream", false, "also run upstream kube-proxy (nftables mode)")
	flag.StringVar(&c.MinSyncPeriod, "min-sync-period", "", "--iptables-min-sync-period for both proxies (default: theirs, 1s)")
	flag.StringVar(&c.LogDir, "logs", "", "keep the logs of every process in this directory")
	flag.BoolVar(&c.ListFloor, "list-floor", c.ListFloor, "first time a bare client listing the Services and EndpointSlices (the floor of every proxy's start)")
	flag.BoolVar(&c.Restart, "restart", c.Restart, "restart each proxy at the end with the API state unchanged, probing its ClusterIP meanwhile")
	flag.IntVar(&c.NeighbourChanges, "neighbour-changes", c.NeighbourChanges, "single changes timed beside each process reading the ruleset (--neighbours)")
	flag.BoolVar(&c.Neighbours, "neighbours", c.Neighbours, "time changes under churn beside processes reading the ruleset (nft monitor, nft list ruleset every 2 s and back to back, a reader stuck in a dump), and a deleted table's repair with the stuck reader")
	flag.Func("populate", fmt.Sprintf("how Services and EndpointSlices are created: api, etcd (written into etcd: creating N Services through the API costs O(N²)) or auto (etcd above %d Services; the default)", etcdAbove),
		func(v string) error {
			if v != "api" && v != "etcd" && v != "auto" {
				return fmt.Errorf("%q: want api, etcd or auto", v)
			}
			c.Populate = v
			return nil
		})
	flag.StringVar(&c.CPUProfile, "cpu-profile", "", "write nftproxy's CPU profile of the first 9 seconds of each start (--profiling) to PREFIX-1.pprof, PREFIX-2.pprof…")
	flag.Func("proxy-env", "KEY=VALUE added to both proxies' environment, e.g. GOMEMLIMIT=80MiB (repeatable)",
		func(v string) error {
			if !strings.Contains(v, "=") {
				return fmt.Errorf("%q: want KEY=VALUE", v)
			}
			c.ProxyEnv = append(c.ProxyEnv, v)
			return nil
		})
	flag.StringVar(&c.JSON, "json", "", "also write every measured value, both proxies, into this file as JSON (read by e2e/benchplot)")
	smoke := flag.Bool("smoke", false, "small quick run (50×2, 3 changes, with upstream) that fails if nftproxy's numbers are missing or absurd")
	flag.Parse()
	if *smoke {
		logs, json := c.LogDir, c.JSON
		c = smokeConfig()
		c.LogDir, c.JSON = logs, json
	}
	commit, dirty := gitHead() // now: the proxies are built from this tree before anything is measured
	os.Exit(testbed.Main(func(tb testbed.TB) {
		rep := run(tb, c)
		if c.JSON != "" {
			must(tb, benchdata.Write(c.JSON, rep.document(commit, dirty)))
			fmt.Printf("results written to %s\n", c.JSON)
		}
		if c.Smoke {
			if problems := rep.validate(); len(problems) > 0 {
				tb.Fatalf("smoke: nftproxy's numbers are missing or absurd:\n  %s", strings.Join(problems, "\n  "))
			}
			fmt.Println("smoke: nftproxy's numbers are complete and plausible")
		}
	}))
}

// bench is one run.
type bench struct {
	tb     testbed.TB
	c      config
	bed    *testbed.Bed
	client kubernetes.Interface

	nftproxyBin, kubeProxyBin, probeBin string

	servers               []*testbed.Pod // srv-0 … srv-3 on node "backends"
	stableAddr, moverAddr string         // ClusterIP:80 of svc-0 and svc-1
	moves                 int            // single changes so far
	profiles              int            // CPU profiles taken (config.CPUProfile)
	gen                   atomic.Int64   // churn generations
	churnNext             int
}

func run(tb testbed.TB, c config) *report {
	if c.ChurnChanges < 0 {
		c.ChurnChanges = c.Changes
	}
	if c.Services < firstOther+1 {
		tb.Fatalf("--services must be at least %d", firstOther+1)
	}
	b := &bench{tb: tb, c: c}
	rep := &report{c: c, start: time.Now(), loadStart: loadAvg()}
	fmt.Printf("load average at start: %s\n", rep.loadStart)

	// Everything built before anything is measured.
	b.nftproxyBin = testbed.GoBuild(tb, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	b.probeBin = testbed.ProbePath(tb)
	if c.Upstream {
		b.kubeProxyBin = filepath.Join(testbed.EnsureBinaries(tb), "kube-proxy")
	}

	b.bed = testbed.Start(tb, testbed.Options{LogDir: c.LogDir})
	rc := b.bed.RESTConfig()
	rc.QPS, rc.Burst = 5000, 10000
	var err error
	b.client, err = kubernetes.NewForConfig(rc)
	must(tb, err)
	_, err = b.client.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(tb, err)

	// Server pods on a node without a proxy.
	backends := b.bed.AddNode("backends")
	for j := 0; j < nServers; j++ {
		name := fmt.Sprintf("srv-%d", j)
		pod := backends.AddPod(name)
		proc := pod.Start(b.probeBin, "serve", "--name", name, "--port", fmt.Sprint(serverPort), "--tcp")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		must(tb, proc.WaitForLog(ctx, "ready"))
		cancel()
		b.servers = append(b.servers, pod)
	}

	kinds := []string{"nftproxy"}
	if c.Upstream {
		kinds = append(kinds, "kube-proxy")
	}
	first := c.Services
	if c.Baseline > 0 && c.Baseline < c.Services {
		first = c.Baseline
	}
	b.populate(0, first)
	var baseline [][][]time.Duration
	if first < c.Services {
		rep.baselineN = first
		for _, k := range kinds {
			fmt.Printf("\n== %s with %d Services: first-packet latency (load %s)\n", k, first, loadAvg())
			baseline = append(baseline, b.baselineFirstPacket(k))
		}
		b.populate(first, c.Services)
	}
	if c.ListFloor {
		fmt.Printf("\n== API list floor with %d Services × %d endpoints\n", c.Services, c.Endpoints)
		fl := b.measureListFloor()
		rep.floor = &fl
	}
	for i, k := range kinds {
		r := b.measure(k)
		if baseline != nil {
			r.fpBase, r.fpBaseDirect = baseline[i][0], baseline[i][1]
		}
		rep.results = append(rep.results, r)
	}
	rep.loadEnd = loadAvg()
	rep.print(os.Stdout)
	return rep
}

// podAddr is srv-0's address, the pod behind svc-0.
func (b *bench) podAddr() string { return fmt.Sprintf("%s:%d", b.servers[0].IPv4, serverPort) }

// command is the proxy's command line on node.
func (b *bench) command(kind string, node *testbed.Node) []string {
	common := []string{"--kubeconfig", b.bed.ProxyKubeconfig, "--hostname-override", node.Name,
		"--cluster-cidr", "10.244.0.0/16,fd00:244::/32", "--metrics-bind-address", "127.0.0.1:10249"}
	if b.c.MinSyncPeriod != "" {
		common = append(common, "--iptables-min-sync-period", b.c.MinSyncPeriod)
	}
	var env []string // env execs the proxy: the process measured is the proxy's
	if len(b.c.ProxyEnv) > 0 {
		env = append([]string{"env"}, b.c.ProxyEnv...)
	}
	if kind == "nftproxy" {
		if b.c.CPUProfile != "" {
			common = append(common, "--profiling")
		}
		return append(append(env, b.nftproxyBin, "--v", "2"), common...)
	}
	return append(append(env, b.kubeProxyBin, "--proxy-mode", "nftables",
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0"), common...)
}

func nodeName(kind string) string {
	if kind == "nftproxy" {
		return "nftproxy"
	}
	return "upstream"
}

// started is a proxy process with a client pod on its node.
type started struct {
	kind   string
	node   *testbed.Node
	proc   *testbed.Process
	client *nsThread
	mon    *sampler
	t0     time.Time
}

func (b *bench) start(kind, nodeSuffix string) *started {
	node := b.bed.AddNode(nodeName(kind) + nodeSuffix)
	pod := node.AddPod("client")
	cl, err := newNSThread(pod.NS)
	must(b.tb, err)
	args := b.command(kind, node)
	s := &started{kind: kind, node: node, client: cl, t0: time.Now()}
	s.proc = node.Start(args...)
	s.mon = startSampler(s.proc.Pid())
	if kind == "nftproxy" && b.c.CPUProfile != "" {
		b.profiles++
		go profileStart(node, fmt.Sprintf("%s-%d.pprof", b.c.CPUProfile, b.profiles))
	}
	return s
}

// profileStart writes the proxy's CPU profile of its first seconds to
// path, from as soon as its metrics server answers.
func profileStart(node *testbed.Node, path string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		body, err := node.HTTPGet(ctx, "http://127.0.0.1:10249/debug/pprof/profile?seconds=9")
		if err == nil {
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				fmt.Printf("CPU profile: %v\n", err)
			}
			fmt.Printf("CPU profile of the proxy's first 9 s written to %s\n", path)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFirstSync waits for the first IPv4 full sync in the proxy's metrics
// and returns the time since start and the sync's own duration.
func (b *bench) waitFirstSync(s *started) (time.Duration, float64) {
	deadline := s.t0.Add(15 * time.Minute)
	for time.Now().Before(deadline) {
		if m, err := scrapeMetrics(s.node); err == nil {
			if h, ok := m.Histogram("kubeproxy_sync_full_proxy_rules_duration_seconds", ipv4); ok && h.Count >= 1 {
				return time.Since(s.t0), h.Sum / h.Count
			}
		}
		select {
		case <-s.proc.Done():
			b.tb.Fatalf("%s exited: %v\n%s", s.kind, s.proc.Err(), tail(s.proc.Log()))
		case <-time.After(min(max(time.Since(s.t0)/100, 10*time.Millisecond), 200*time.Millisecond)):
		}
	}
	b.tb.Fatalf("%s: no full sync within 15 minutes\n%s", s.kind, tail(s.proc.Log()))
	return 0, 0
}

// baselineFirstPacket starts the proxy on a node of its own while only the
// first Services exist, times first packets through svc-0, and stops it.
func (b *bench) baselineFirstPacket(kind string) [][]time.Duration {
	s := b.start(kind, "-base")
	defer s.client.close()
	ready, _ := b.waitFirstSync(s)
	_, _, err := s.client.waitAnswer(b.stableAddr, "srv-0", time.Now(), 100*time.Millisecond, 2*time.Millisecond, time.Minute)
	must(b.tb, err)
	b.waitQuiet(s, 1100*time.Millisecond)
	fps, failures := s.client.firstPacket([]string{b.stableAddr, b.podAddr()}, "srv-0", b.c.Conns)
	fp := fps[0]
	s.mon.stop()
	s.proc.Stop(10 * time.Second)
	fmt.Printf("%s: ready after %v; first packet p50 %v p99 %v; direct to pod p50 %v p99 %v (failed: %v)\n", kind, ready.Round(time.Millisecond),
		pct(fp, 0.5), pct(fp, 0.99), pct(fps[1], 0.5), pct(fps[1], 0.99), failures)
	if failures.total() > 0 {
		b.tb.Fatalf("%s: connections to %s failed: %v of %d", kind, b.stableAddr, failures, b.c.Conns)
	}
	return fps
}

// settle waits, before a proxy starts, until the API server and etcd
// have been quiet (under a fifth of a core) for 2 s: after populate's
// writes they work on for a while (at 100,000 Services written into etcd,
// tens of seconds), and a proxy started meanwhile competes with them for
// the 2 CPUs. At least 5 s, at most 5 minutes.
func (b *bench) settle() {
	t0 := time.Now()
	cpu := b.controlPlaneCPU
	time.Sleep(3 * time.Second)
	for prev := cpu(); time.Since(t0) < 5*time.Minute; {
		time.Sleep(2 * time.Second)
		cur := cpu()
		if cur-prev < 0.4 && time.Since(t0) >= 5*time.Second {
			break
		}
		prev = cur
	}
	fmt.Printf("API server and etcd quiet after %v (load %s)\n", time.Since(t0).Round(time.Second), loadAvg())
}

// controlPlaneCPU is the CPU time of the API server and etcd so far, in
// seconds.
func (b *bench) controlPlaneCPU() float64 {
	var s float64
	for _, pid := range b.bed.ControlPlanePIDs() {
		if st, ok := procstat.Read(pid); ok {
			s += st.CPU()
		}
	}
	return s
}

// measure runs one proxy through every phase and stops it.
func (b *bench) measure(kind string) *result {
	c := b.c
	r := &result{name: kind, load: loadAvg()}
	fmt.Printf("\n== %s with %d Services × %d endpoints (load %s)\n", kind, c.Services, c.Endpoints, r.load)
	b.settle()
	s := b.start(kind, "")
	defer s.client.close()
	stopped := false
	defer func() {
		if !stopped {
			s.mon.stop()
			s.proc.Stop(10 * time.Second)
		}
	}()

	// 1. Start-up: metrics and data path.
	type answer struct {
		d   time.Duration
		err error
	}
	dp := make(chan answer, 1)
	go func() {
		d, _, err := s.client.waitAnswer(b.stableAddr, "srv-0", s.t0, 25*time.Millisecond, 2*time.Millisecond, 15*time.Minute)
		dp <- answer{d, err}
	}()
	r.ready, r.fullSync = b.waitFirstSync(s)
	r.cpuReady = s.mon.cpu()
	a := <-dp
	must(b.tb, a.err)
	r.readyDP = a.d
	fmt.Printf("rules programmed %v after start (first answer through the ClusterIP after %v); first full sync %.3fs; CPU %.2fs\n",
		r.ready.Round(time.Millisecond), r.readyDP.Round(time.Millisecond), r.fullSync, r.cpuReady)

	// 5. First packets, through the ClusterIP and directly to the pod.
	// Once the proxy has not synced for a while: right after start-up both
	// proxies may run a second sync.
	b.waitQuiet(s, 1100*time.Millisecond)
	fps, f := s.client.firstPacket([]string{b.stableAddr, b.podAddr()}, "srv-0", c.Conns)
	r.fpN, r.fpDirect = fps[0], fps[1]
	r.probeFailures = r.probeFailures.merge(f)
	fmt.Printf("first packet via ClusterIP p50 %v p99 %v; direct to pod p50 %v p99 %v\n",
		pct(r.fpN, 0.5), pct(r.fpN, 0.99), pct(r.fpDirect, 0.5), pct(r.fpDirect, 0.99))

	// 2. Idle single changes, each when the proxy has not synced for longer
	// than the default min sync period.
	b.waitQuiet(s, 1100*time.Millisecond)
	before := b.counters(s)
	cpu0 := s.mon.cpu()
	for i := 0; i < c.Changes; i++ {
		lat, syncD := b.timedChange(s, r)
		r.idle = append(r.idle, lat)
		r.idleSync = append(r.idleSync, syncD)
		time.Sleep(1100 * time.Millisecond) // beyond the default min sync period: each change finds the proxy idle
	}
	after := b.counters(s)
	if c.Changes > 0 {
		r.cpuPerChange = (s.mon.cpu() - cpu0) / float64(c.Changes)
		r.idleSyncs = after.syncs - before.syncs
		if after.nft {
			r.kernelOpsPerChange = (after.kernelOps - before.kernelOps) / float64(c.Changes)
		}
		fmt.Printf("idle changes: data path p50 %v p99 %v; sync median %s; %.1f syncs\n",
			pct(r.idle, 0.5), pct(r.idle, 0.99), fmtSec(median(r.idleSync)), r.idleSyncs)
	}

	// 4. API updates that change no rule.
	if c.NoopUpdates > 0 {
		b.waitQuiet(s, 2*time.Second)
		n0 := b.counters(s)
		b.noopUpdates(c.NoopUpdates)
		b.waitQuiet(s, 3*time.Second)
		n1 := b.counters(s)
		r.noop = noopResult{updates: c.NoopUpdates, events: n1.events - n0.events, ruleChanges: n1.ruleChanges - n0.ruleChanges,
			kernelOps: n1.kernelOps - n0.kernelOps, syncs: n1.syncs - n0.syncs, nft: n1.nft}
		fmt.Printf("%d no-op updates: %.0f syncs, %.0f API events, %.0f rule changes, %.0f kernel operations\n",
			c.NoopUpdates, r.noop.syncs, r.noop.events, r.noop.ruleChanges, r.noop.kernelOps)
	}

	// 3. Kernel notifications per single change.
	if c.MonitorChanges > 0 {
		nl, err := startNLCounter(s.node.NS)
		must(b.tb, err)
		for i := 0; i < c.MonitorChanges; i++ {
			b.timedChange(s, r, func() string {
				out, err := s.node.Exec(context.Background(), "nft", "list", "ruleset")
				return fmt.Sprintf("nft list ruleset (%v):\n%s", err, out)
			})
			time.Sleep(1100 * time.Millisecond)
		}
		objs, gens, lost := nl.read()
		nl.stop()
		r.nlObjects = float64(objs) / float64(c.MonitorChanges)
		r.nlGens = float64(gens) / float64(c.MonitorChanges)
		r.nlLost = lost
		fmt.Printf("kernel notifications per change: %.1f objects in %.1f transactions (%d overflows)\n", r.nlObjects, r.nlGens, lost)
	}

	// 2. Single changes under churn, and listings of the proxy's table.
	if c.ChurnChanges > 0 {
		b.listIdle(s, r)
		if c.Neighbours {
			b.rulesetIdle(s, r)
		}
		ch := b.startChurn(c.ChurnRate)
		time.Sleep(2 * time.Second)
		cpu1, t1, k0 := s.mon.cpu(), time.Now(), b.counters(s)
		rnd := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < c.ChurnChanges; i++ {
			lat, failures, err := b.move(s.client)
			must(b.tb, err)
			r.probeFailures = r.probeFailures.merge(failures)
			r.churn = append(r.churn, lat)
			time.Sleep(time.Duration(rnd.Int64N(int64(time.Second)))) // not in step with the proxy's syncs
		}
		r.churnCores = (s.mon.cpu() - cpu1) / time.Since(t1).Seconds()
		k1 := b.counters(s)
		r.churnWindow = noopResult{events: k1.events - k0.events, ruleChanges: k1.ruleChanges - k0.ruleChanges,
			kernelOps: k1.kernelOps - k0.kernelOps, syncs: k1.syncs - k0.syncs, nft: k1.nft}
		b.listUnderChurn(s, r)
		if c.Neighbours {
			b.measureNeighbours(s, r)
		}
		var failures int64
		r.churnRate, failures, r.churnMissed = ch.stop()
		if failures > 0 {
			b.tb.Fatalf("%d churn updates failed", failures)
		}
		fmt.Printf("under churn (%.1f updates/s): data path p50 %v p99 %v; proxy used %.2f cores\n",
			r.churnRate, pct(r.churn, 0.5), pct(r.churn, 0.99), r.churnCores)
	}

	// Totals, then stop (or restart).
	final := b.counters(s)
	r.syncHist = final.syncHist
	r.nft = final.nft
	r.events, r.ruleChanges = final.events, final.ruleChanges
	r.syncsByResult, r.syncResults = final.syncsByResult, final.syncsByResultK
	r.cpuTotal = s.mon.cpu()
	r.wall = time.Since(s.t0)
	r.rssProc, r.rssTree = s.mon.stop()
	stopped = true
	if c.Restart {
		b.restart(s, r)
	} else {
		s.proc.Stop(10 * time.Second)
	}
	if c.Neighbours {
		b.repairWithStuckReader(s, r)
	}
	fmt.Printf("%s: CPU %.1fs in %v; peak RSS %.0f MB (with children %.0f MB)\n", kind, r.cpuTotal, r.wall.Round(time.Second),
		mb(r.rssProc), mb(r.rssTree))
	return r
}

// restart is phase 6: with the API state unchanged, the proxy is stopped
// (SIGTERM) and started again on its node, while a client connects to
// svc-0's ClusterIP every 10 ms, from before the stop until 2 s after the
// new process's first full sync. The rules stay in the kernel meanwhile
// (neither proxy removes them on exit); what the new process does with
// them shows in its kernel operations and its time to programmed.
//
// The client is a pod of its own. The first client's connections before
// the rules existed left conntrack entries without NAT, unanswered, for
// the 120 s of nf_conntrack_tcp_timeout_syn_sent; a later connection that
// happens to reuse one of those source ports is taken for a retransmitted
// SYN of it, skips the NAT hook and is refused (seen with `nft monitor
// trace` and `conntrack -E` at 100,000 Services). nftproxy's first sync
// deletes such entries, kube-proxy does not: a fresh client measures the
// restart alone, for both.
func (b *bench) restart(s *started, r *result) {
	client, err := newNSThread(s.node.AddPod("client-restart").NS)
	must(b.tb, err)
	defer client.close()
	stop := make(chan struct{})
	res := make(chan probed, 1)
	go func() { res <- client.probe(b.stableAddr, "srv-0", 10*time.Millisecond, stop) }()
	time.Sleep(time.Second)
	stopAt := time.Now()
	s.proc.Stop(10 * time.Second)
	s2 := &started{kind: s.kind, node: s.node, client: client, t0: time.Now()}
	s2.proc = s.node.Start(b.command(s.kind, s.node)...)
	s2.mon = startSampler(s2.proc.Pid())
	if s.kind == "nftproxy" && b.c.CPUProfile != "" {
		b.profiles++
		go profileStart(s.node, fmt.Sprintf("%s-%d.pprof", b.c.CPUProfile, b.profiles))
	}
	r.restartReady, _ = b.waitFirstSync(s2)
	k := b.counters(s2)
	r.restartOps = k.kernelOps
	ops := "kernel operations not counted"
	if k.nft {
		ops = fmt.Sprintf("%.0f kernel operations", k.kernelOps)
	}
	time.Sleep(2 * time.Second)
	close(stop)
	p := <-res
	r.restartAttempts, r.restartFailures = p.attempts, p.failures
	r.restartRSS, _ = s2.mon.stop()
	s2.proc.Stop(10 * time.Second)
	fmt.Printf("restart: rules programmed %v after start, %s; peak RSS %.0f MB; %d of %d connections through the ClusterIP without answer (%v)\n",
		r.restartReady.Round(time.Millisecond), ops, mb(r.restartRSS), p.failures.total(), p.attempts, p.failures)
	if !p.first.IsZero() {
		fmt.Printf("restart: failed connections from %v to %v after the stop began (new process started %v after it)\n",
			p.first.Sub(stopAt).Round(time.Millisecond), p.last.Sub(stopAt).Round(time.Millisecond), s2.t0.Sub(stopAt).Round(time.Millisecond))
	}
}

// timedChange is one idle single change: data-path latency and the
// proxy's own duration of the partial sync(s) it caused.
func (b *bench) timedChange(s *started, r *result, diag ...func() string) (time.Duration, float64) {
	before := b.counters(s).partial
	lat, failures, err := b.move(s.client)
	if err != nil {
		for _, d := range diag {
			fmt.Println(d())
		}
	}
	must(b.tb, err)
	r.probeFailures = r.probeFailures.merge(failures)
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if p := b.counters(s).partial; p.Count > before.Count {
			return lat, (p.Sum - before.Sum) / (p.Count - before.Count)
		}
		// Every scrape costs the proxy CPU: poll less often the longer it takes.
		time.Sleep(min(max(time.Since(deadline.Add(-5*time.Minute))/50, 5*time.Millisecond), 250*time.Millisecond))
	}
	b.tb.Fatalf("%s: no partial sync after a change within 5 minutes", s.kind)
	return 0, 0
}

func (b *bench) counters(s *started) counters {
	var last error
	for i := 0; i < 5; i++ {
		c, err := readCounters(s.node)
		if err == nil {
			return c
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	b.tb.Fatalf("%s: /metrics: %v", s.kind, last)
	return counters{}
}

// waitQuiet waits until the proxy has not synced for quiet (at most 5
// minutes).
func (b *bench) waitQuiet(s *started, quiet time.Duration) {
	last, since := b.counters(s).syncs, time.Now()
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(250 * time.Millisecond)
		if n := b.counters(s).syncs; n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= quiet {
			return
		}
	}
}

func tail(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

func must(tb testbed.TB, err error) {
	if err != nil {
		tb.Helper()
		tb.Fatal(err)
	}
}
