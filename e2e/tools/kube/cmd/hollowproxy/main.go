// Command hollowproxy runs many of kubemark's hollow kube-proxies in one
// process, for the cluster bench (e2e/cmd/clusterbench): each one is
// upstream's own k8s.io/kubernetes/pkg/proxy/kubemark.NewHollowProxy, with
// the client kubemark's hollow node gives it (protobuf, QPS 10, burst 20,
// user agent hollow-proxy) on a connection of its own, so that the API
// server serves it as it serves one hollow node of a kubemark cluster.
//
// One thing is added to make it a node's kube-proxy: upstream's own
// NodeManager (k8s.io/kubernetes/pkg/proxy.NewNodeManager), which kubemark
// leaves out and every real kube-proxy runs, so each proxy watches its Node
// by field selector, as each of the bench's hollow nftproxies does. Without
// it the API server would serve one watch per node fewer in this column.
//
// The other addition is what the bench reads: each hollow proxy's handlers
// (kubemark's FakeProxier, which does nothing) are wrapped to record when
// the informers synced, and the latest value of the marker, the port named
// "marker" of the marker Service's EndpointSlices, and when it arrived.
// GET /status on --status answers them as JSON (one entry per proxy, in
// order; the bench's hollow nftproxy answers the same).
//
// It links k8s.io/kubernetes, so it lives in this nested module and
// e2e/tools/build.sh builds it beside kube-proxy.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/proxy"
	"k8s.io/kubernetes/pkg/proxy/kubemark"
)

// status is one hollow proxy's state, as GET /status reports it.
type status struct {
	Node     string    `json:"node"`
	Synced   bool      `json:"synced"`
	SyncedAt time.Time `json:"syncedAt,omitzero"`
	Marker   int32     `json:"marker"`
	MarkerAt time.Time `json:"markerAt,omitzero"`
}

// markerProxier is kubemark's FakeProxier, recording what the bench reads.
type markerProxier struct {
	kubemark.FakeProxier
	markerNS, markerSvc string

	mu                           sync.Mutex
	st                           status
	servicesSynced, slicesSynced bool
}

func (p *markerProxier) OnServiceSynced() { p.synced(func() { p.servicesSynced = true }) }

func (p *markerProxier) OnEndpointSlicesSynced() { p.synced(func() { p.slicesSynced = true }) }

func (p *markerProxier) synced(set func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set()
	if p.servicesSynced && p.slicesSynced && !p.st.Synced {
		p.st.Synced, p.st.SyncedAt = true, time.Now()
	}
}

func (p *markerProxier) OnEndpointSliceAdd(es *discoveryv1.EndpointSlice) { p.slice(es) }

func (p *markerProxier) OnEndpointSliceUpdate(_, es *discoveryv1.EndpointSlice) { p.slice(es) }

// slice records the marker carried by es, if es is the marker Service's.
func (p *markerProxier) slice(es *discoveryv1.EndpointSlice) {
	if es.Namespace != p.markerNS || es.Labels[discoveryv1.LabelServiceName] != p.markerSvc {
		return
	}
	for _, port := range es.Ports {
		if port.Name == nil || *port.Name != "marker" || port.Port == nil {
			continue
		}
		p.mu.Lock()
		if p.st.Marker != *port.Port {
			p.st.Marker, p.st.MarkerAt = *port.Port, time.Now()
		}
		p.mu.Unlock()
	}
}

func (p *markerProxier) status() status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the proxies' user")
	count := flag.Int("count", 1, "hollow proxies to run")
	first := flag.Int("first", 0, "index of the first one (node <node-prefix><index>)")
	prefix := flag.String("node-prefix", "hollow-", "node name prefix")
	statusAddr := flag.String("status", "127.0.0.1:10300", "address of the status server (GET /status)")
	marker := flag.String("marker", "", "the marker Service, namespace/name")
	klog.InitFlags(nil)
	flag.Parse()
	markerNS, markerSvc, ok := strings.Cut(*marker, "/")
	if !ok {
		fmt.Fprintln(os.Stderr, "hollowproxy: --marker namespace/name is required")
		os.Exit(2)
	}
	var proxiers []*markerProxier
	for i := *first; i < *first+*count; i++ {
		p := &markerProxier{markerNS: markerNS, markerSvc: markerSvc, st: status{Node: fmt.Sprintf("%s%d", *prefix, i)}}
		if err := start(*kubeconfig, p); err != nil {
			fmt.Fprintf(os.Stderr, "hollowproxy: %s: %v\n", p.st.Node, err)
			os.Exit(1)
		}
		proxiers = append(proxiers, p)
	}
	http.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		out := struct {
			Instances []status `json:"instances"`
		}{}
		for _, p := range proxiers {
			out.Instances = append(out.Instances, p.status())
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	go func() {
		if err := http.ListenAndServe(*statusAddr, nil); err != nil {
			fmt.Fprintln(os.Stderr, "hollowproxy: status server:", err)
			os.Exit(1)
		}
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}

// start runs one hollow proxy with kubemark's client settings
// (cmd/kubemark/app/hollow_node.go) on a connection of its own.
func start(kubeconfig string, p *markerProxier) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = 10, 20
	cfg.UserAgent = "hollow-proxy"
	// A connection of its own, as a node's proxy has: client-go shares one
	// cached transport (one HTTP/2 connection) among clients of equal TLS
	// settings, so each proxy offers one more ALPN protocol, named after
	// it (the server picks h2 all the same). Its own clients still share
	// its connection, as a proxy's do. (A dialer of its own would do it
	// too, but then no client shares a transport, not even the proxy's
	// own: nftproxy's three clients would open three connections.)
	cfg.TLSClientConfig.NextProtos = []string{"h2", "http/1.1", "x-" + p.st.Node}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	recorder := broadcaster.NewRecorder(legacyscheme.Scheme, "kube-proxy")
	hp := kubemark.NewHollowProxy(p.st.Node, client, client.CoreV1(), broadcaster, recorder)
	hp.ProxyServer.Proxier = p
	go func() {
		// As kube-proxy's newProxyServer does before it runs: list and
		// watch this node's Node, and wait for its addresses.
		nm, err := proxy.NewNodeManager(context.Background(), client, p.st.Node, hp.ProxyServer.Config)
		if err != nil {
			klog.ErrorS(err, "Hollow proxy's node manager", "node", p.st.Node)
			return
		}
		hp.ProxyServer.NodeManager = nm
		if err := hp.Run(); err != nil {
			klog.ErrorS(err, "Hollow proxy ended", "node", p.st.Node)
		}
	}()
	return nil
}
