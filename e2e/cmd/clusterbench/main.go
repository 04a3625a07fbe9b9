// Command clusterbench measures what a cluster's proxies cost its API
// server, nftproxy's beside upstream kube-proxy's, on one machine
// (docs/scale.md): one real kube-apiserver, etcd and kube-controller-manager
// (its Deployment, ReplicaSet, EndpointSlice and ServiceAccount controllers,
// so that EndpointSlices carry the trigger times a real cluster's do), a
// fake kubelet in this process that binds the Deployments' pods to nodes
// and reports them running and ready, and two kinds of proxy node:
//
//   - hollow nodes: --hollow watchers in one process, each with a client
//     and connection of its own: for nftproxy its real proxier with the fake
//     nft backend (e2e/cmd/hollow), for kube-proxy kubemark's hollow proxy
//     (e2e/tools/kube/cmd/hollowproxy, upstream's NewHollowProxy);
//   - real nodes: --real node namespaces running the real nftproxy binary,
//     or upstream kube-proxy in nftables mode, on kernel tables, scraped for
//     their metrics.
//
// Each column (nftproxy, then kube-proxy) runs the same phases on the same
// objects, after a fresh start of the API server:
//
//  1. start: every proxy started at once, until each has the current state;
//  2. churn: the controller-manager scales and rolls Deployments, as
//     ClusterLoader2's load test does; the real nodes' network programming
//     latency as ClusterLoader2 reads it;
//  3. restart: the API server restarted at once;
//  4. outage: the API server stopped for --outage, then started;
//  5. rollout: every proxy restarted at once, as a DaemonSet rollout with
//     maxUnavailable 100% does.
//
// "Has the current state" is read from a marker: the port "marker" of the
// marker Service's EndpointSlice, moved before each measurement. A hollow
// watcher reports when its informers hold the new value (nftproxy's: its
// change tracker; kube-proxy's: its handler was called), what the API
// server is responsible for; a real node when a connection through the
// marker's ClusterIP reaches the marker pod the new value names (real
// traffic through the node's kernel rules). Per phase: the time until every watcher is back,
// the API server's CPU seconds, peak RSS and bytes sent to the nodes, its
// 429s and the lists it served from etcd and from its watch cache.
//
// Usage (as root; make cluster-bench):
//
//	clusterbench --hollow 200 --real 8 --services 2000 --endpoints 5 --doc docs/scale.md
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// config is what the flags set.
type config struct {
	Hollow, Real        int
	Services, Endpoints int
	Deployments         int
	Replicas            int
	Churn               time.Duration // length of the churn phase
	ChurnEvery          time.Duration // one scale or rollout this often
	Outage              time.Duration
	Columns             []string // "nftproxy", "kube-proxy"
	Runs                int      // the columns in turn, this many times
	Doc                 string   // docs/scale.md: its tables are rewritten
	JSON                string   // every figure, as JSON
	Limit               time.Duration
}

func defaultConfig() config {
	return config{Hollow: 200, Real: 8, Services: 2000, Endpoints: 5, Deployments: 20, Replicas: 10,
		Churn: 3 * time.Minute, ChurnEvery: time.Second, Outage: time.Minute,
		Columns: []string{colNftproxy, colKubeProxy}, Runs: 1, Limit: 10 * time.Minute}
}

func main() {
	c := defaultConfig()
	flag.IntVar(&c.Hollow, "hollow", c.Hollow, "hollow nodes (watchers in one process)")
	flag.IntVar(&c.Real, "real", c.Real, "real nodes (node namespaces with the real proxy binary)")
	flag.IntVar(&c.Services, "services", c.Services, "static Services, selector-less")
	flag.IntVar(&c.Endpoints, "endpoints", c.Endpoints, "endpoints per static Service")
	flag.IntVar(&c.Deployments, "deployments", c.Deployments, "Deployments, each with a Service, that the churn scales and rolls")
	flag.IntVar(&c.Replicas, "replicas", c.Replicas, "replicas of each Deployment (the churn scales between half and one and a half times)")
	flag.DurationVar(&c.Churn, "churn", c.Churn, "length of the churn phase")
	flag.DurationVar(&c.ChurnEvery, "churn-every", c.ChurnEvery, "one Deployment scaled or rolled this often")
	flag.DurationVar(&c.Outage, "outage", c.Outage, "how long the API server is down in the outage phase")
	flag.DurationVar(&c.Limit, "limit", c.Limit, "longest wait for every watcher in a phase")
	flag.IntVar(&c.Runs, "runs", c.Runs, "measure the columns in turn this many times on the same cluster; the tables show each figure's median")
	cols := flag.String("columns", strings.Join(c.Columns, ","), "the columns, in order: nftproxy, kube-proxy")
	flag.StringVar(&c.Doc, "doc", "", "rewrite the tables of this page (docs/scale.md) with the results")
	flag.StringVar(&c.JSON, "json", "", "write every figure as JSON into this file")
	flag.Parse()
	c.Columns = strings.Split(*cols, ",")
	for _, col := range c.Columns {
		if col != colNftproxy && col != colKubeProxy {
			fmt.Fprintf(os.Stderr, "clusterbench: unknown column %q\n", col)
			os.Exit(2)
		}
	}
	os.Exit(testbed.Main(func(tb testbed.TB) { run(tb, c) }))
}

// run sets the cluster up and measures every column on it.
func run(tb testbed.TB, c config) {
	started := time.Now()
	cl := newCluster(tb, c)
	res := &results{Config: c, Machine: machine()}
	for range c.Runs {
		var run []columnResult
		for _, col := range c.Columns {
			run = append(run, cl.measureColumn(col))
		}
		res.Runs = append(res.Runs, run)
	}
	res.Took = time.Since(started)
	tb.Logf("\n%s", res.markdown())
	if c.JSON != "" {
		if err := res.writeJSON(c.JSON); err != nil {
			tb.Fatal(err)
		}
	}
	if c.Doc != "" {
		if err := res.rewriteDoc(c.Doc); err != nil {
			tb.Fatal(err)
		}
		tb.Logf("tables written into %s", c.Doc)
	}
}
