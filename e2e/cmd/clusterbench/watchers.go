package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// The columns.
const (
	colNftproxy  = "nftproxy"
	colKubeProxy = "kube-proxy"
)

// statusAddr is where a hollow process answers GET /status, in the host
// node's namespace.
const statusAddr = "127.0.0.1:10300"

// watchers are one column's proxies: the hollow process and the real
// nodes' proxies.
type watchers struct {
	col    string
	hollow *testbed.Process
	real   []*testbed.Process
}

// startWatchers starts every proxy of col at once.
func (cl *cluster) startWatchers(col string) *watchers {
	w := &watchers{col: col}
	n := fmt.Sprint(cl.cfg.Hollow)
	// The hollow watchers run at the lowest priority: on a cluster, each
	// node's proxy has the node's CPU, not the API server's.
	nice := []string{"nice", "-n", "19"}
	switch col {
	case colNftproxy:
		w.hollow = cl.host.Start(append(nice, cl.bins.hollow, "--kubeconfig", cl.bed.ProxyKubeconfig, "--count", n,
			"--status", statusAddr, "--marker-slice", markerNS+"/"+markerSvc+"-1")...)
	case colKubeProxy:
		w.hollow = cl.host.Start(append(nice, cl.bins.hollowProxy, "--kubeconfig", cl.bed.ProxyKubeconfig, "--count", n,
			"--status", statusAddr, "--marker", markerNS+"/"+markerSvc)...)
	}
	for _, node := range cl.real {
		w.real = append(w.real, node.Start(cl.realProxyArgs(col, node)...))
	}
	return w
}

// realProxyArgs is the command line of col's proxy on a real node: the
// release's defaults, as a DaemonSet runs it, with what a node namespace
// needs (kube-proxy cannot set conntrack sysctls there).
func (cl *cluster) realProxyArgs(col string, node *testbed.Node) []string {
	common := []string{"--kubeconfig", cl.bed.ProxyKubeconfig, "--hostname-override", node.Name,
		"--cluster-cidr", testbed.PodCIDRs, "--metrics-bind-address", "127.0.0.1:10249"}
	if col == colNftproxy {
		return append([]string{cl.bins.nftproxy}, common...)
	}
	return append([]string{cl.bins.kubeProxy, "--proxy-mode", "nftables", "--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0", "--conntrack-tcp-timeout-close-wait", "0"}, common...)
}

// stopWatchers stops every proxy of w (SIGTERM, as a DaemonSet's pods are
// stopped) and removes what the real ones left in their nodes' kernels.
func (cl *cluster) stopWatchers(w *watchers) {
	var wg sync.WaitGroup
	for _, p := range append([]*testbed.Process{w.hollow}, w.real...) {
		wg.Go(func() { p.Stop(30 * time.Second) })
	}
	wg.Wait()
	for _, node := range cl.real {
		if out, err := node.Exec(context.Background(), "nft", "flush", "ruleset"); err != nil {
			cl.tb.Fatalf("flush the ruleset of %s: %v\n%s", node.Name, err, out)
		}
	}
}

// hollowStatus is a hollow watcher's state, as its process reports it.
type hollowStatus struct {
	Node     string    `json:"node"`
	Synced   bool      `json:"synced"`
	SyncedAt time.Time `json:"syncedAt"`
	Marker   int       `json:"marker"`
	MarkerAt time.Time `json:"markerAt"`
}

// hollowStatuses asks the hollow process for its watchers' states.
func (cl *cluster) hollowStatuses() ([]hollowStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, err := cl.host.HTTPGet(ctx, "http://"+statusAddr+"/status")
	if err != nil {
		return nil, err
	}
	var out struct {
		Instances []hollowStatus `json:"instances"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return out.Instances, nil
}

// arrival is when one watcher had the marker, after the phase's moment
// zero; missing if it never did within the limit.
type arrival struct {
	Node    string        `json:"node"`
	Real    bool          `json:"real"`
	After   time.Duration `json:"after"`
	Missing bool          `json:"missing,omitempty"`
}

// waitMarker waits until every watcher has the marker's current value:
// a hollow one when it reports the value (and has synced), a real node
// when a connection through the marker's ClusterIP reaches the marker pod
// the value names. It returns each watcher's arrival after zero.
func (cl *cluster) waitMarker(zero time.Time) []arrival {
	deadline := zero.Add(cl.cfg.Limit)
	want := cl.marker
	var mu sync.Mutex
	var out []arrival
	var wg sync.WaitGroup
	for _, node := range cl.real {
		wg.Go(func() {
			a := arrival{Node: node.Name, Real: true, Missing: true}
			pod := cl.markerPods[want%2].Name
			for time.Now().Before(deadline) {
				if name, err := answer(node, fmt.Sprintf("%s:80", markerIP)); err == nil && name == pod {
					a.After, a.Missing = time.Since(zero), false
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			out = append(out, a)
			mu.Unlock()
		})
	}
	hollow := cl.waitHollow(zero, deadline, want)
	wg.Wait()
	return append(hollow, out...)
}

// waitHollow polls the hollow process until every hollow watcher has
// synced and holds marker value want.
func (cl *cluster) waitHollow(zero, deadline time.Time, want int) []arrival {
	var last []hollowStatus
	for {
		st, err := cl.hollowStatuses()
		if err == nil {
			last = st
			if len(st) == cl.cfg.Hollow && !slices.ContainsFunc(st, func(s hollowStatus) bool { return !atMarker(s, want) }) {
				break
			}
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	var out []arrival
	for _, s := range last {
		a := arrival{Node: s.Node, Missing: !atMarker(s, want)}
		if !a.Missing {
			at := s.MarkerAt
			if s.SyncedAt.After(at) {
				at = s.SyncedAt
			}
			a.After = max(at.Sub(zero), 0)
		}
		out = append(out, a)
	}
	for i := len(last); i < cl.cfg.Hollow; i++ {
		out = append(out, arrival{Node: hollowName(i), Missing: true})
	}
	return out
}

func atMarker(s hollowStatus, want int) bool { return s.Synced && s.Marker == markerBase+want }

// answer opens a connection to addr from node and returns the name the
// probe server answers with.
func answer(node *testbed.Node, addr string) (string, error) {
	// Short: a SYN sent before the rules exist is lost, and its retransmit
	// would come only after a second; a new connection is tried instead.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	c, err := node.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	return name, nil
}

// bumpMarker moves the marker to its next value, retrying while the API
// server is not answering yet.
func (cl *cluster) bumpMarker(limit time.Duration) {
	var err error
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err = cl.writeMarker(cl.marker + 1); err == nil {
			return
		}
	}
	cl.tb.Fatalf("move the marker: %v", err)
}
