// Command hollow runs many hollow nftproxies in one process, for the
// cluster bench (e2e/cmd/clusterbench), as kubemark's hollow kube-proxy runs
// kube-proxy's: each one is nftproxy's own proxier (its API client,
// informers, change trackers, model, ruleset builder and editor) with a
// fake nft backend in place of the kernel, watching the API
// as node <node-prefix><index> on a connection of its own. Its client has
// nftproxy's settings (protobuf, kube-proxy's QPS 5 and burst 10, watch
// bodies read in large reads) and its proxier nftproxy's defaults (syncs
// spaced by their cost, a full sync an hour), so the API server serves
// each as it serves one node's nftproxy. The backend is nftfake.Discard,
// which keeps nothing and costs what the change costs, as the kernel does:
// nftfake.Fake copies its whole table at every transaction, and 200 of them
// spent about ten times the proxiers' own CPU doing it (docs/scale.md).
//
// What the bench reads, as of the watchers (what the API server has
// delivered; the data path is measured on the bench's real nodes): when
// each one's informers synced, and the latest value of the marker, the
// port "marker" of the marker EndpointSlice (--marker-slice) as its change
// tracker holds it, and when it arrived (read every markerPoll). GET
// /status on --status answers them as JSON, one entry per proxy in order,
// as the bench's hollow kube-proxy (e2e/tools/kube/cmd/hollowproxy) does.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// status is one hollow proxy's state, as GET /status reports it.
type status struct {
	Node     string    `json:"node"`
	Synced   bool      `json:"synced"`
	SyncedAt time.Time `json:"syncedAt,omitzero"`
	Marker   int32     `json:"marker"`
	MarkerAt time.Time `json:"markerAt,omitzero"`
}

// hollow is one hollow nftproxy: its trackers, read for the marker.
type hollow struct {
	trackers watch.Trackers
	marker   model.SliceKey

	mu sync.Mutex
	st status
}

// markerPoll is how often the trackers are read for the marker.
const markerPoll = 50 * time.Millisecond

// look records the marker's value if it changed.
func (h *hollow) look() {
	es, ok := h.trackers.Slices.Get(h.marker)
	if !ok {
		return
	}
	for _, p := range es.Ports {
		if p.Name != "marker" {
			continue
		}
		h.mu.Lock()
		if k := int32(p.Port); k != h.st.Marker {
			h.st.Marker, h.st.MarkerAt = k, time.Now()
		}
		h.mu.Unlock()
	}
}

func (h *hollow) listed() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.st.Synced, h.st.SyncedAt = true, time.Now()
}

func (h *hollow) status() status {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the proxies' user")
	count := flag.Int("count", 1, "hollow proxies to run")
	first := flag.Int("first", 0, "index of the first one (node <node-prefix><index>)")
	prefix := flag.String("node-prefix", "hollow-", "node name prefix")
	statusAddr := flag.String("status", "127.0.0.1:10300", "address of the status server (GET /status)")
	markerSlice := flag.String("marker-slice", "", "the marker EndpointSlice, namespace/name")
	klog.InitFlags(nil)
	flag.Parse()
	ns, name, ok := strings.Cut(*markerSlice, "/")
	if !ok {
		fmt.Fprintln(os.Stderr, "hollow: --marker-slice namespace/name is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var hollows []*hollow
	for i := *first; i < *first+*count; i++ {
		h := &hollow{trackers: watch.NewTrackers(time.Now()), marker: model.SliceKey{Namespace: ns, Name: name},
			st: status{Node: fmt.Sprintf("%s%d", *prefix, i)}}
		if err := start(ctx, *kubeconfig, h); err != nil {
			fmt.Fprintf(os.Stderr, "hollow: %s: %v\n", h.st.Node, err)
			os.Exit(1)
		}
		hollows = append(hollows, h)
	}
	go func() {
		for range time.Tick(markerPoll) {
			for _, h := range hollows {
				h.look()
			}
		}
	}()
	http.HandleFunc("/status", func(w http.ResponseWriter, _ *http.Request) {
		out := struct {
			Instances []status `json:"instances"`
		}{}
		for _, h := range hollows {
			out.Instances = append(out.Instances, h.status())
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	srv := &http.Server{Addr: *statusAddr}
	go func() {
		if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
			fmt.Fprintln(os.Stderr, "hollow: status server:", err)
			os.Exit(1)
		}
	}()
	<-ctx.Done()
	_ = srv.Close()
}

// start runs one hollow nftproxy: nftproxy's client settings and proxier
// defaults (cmd/nftproxy), on a connection of its own.
func start(ctx context.Context, kubeconfig string, h *hollow) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = 5, 10
	cfg.UserAgent = "hollow-nftproxy"
	cfg.Wrap(watch.BufferStreams)
	// A connection of its own, as a node's proxy has: client-go shares one
	// cached transport (one HTTP/2 connection) among clients of equal TLS
	// settings, so each proxy offers one more ALPN protocol, named after
	// it (the server picks h2 all the same). Its own clients still share
	// its connection, as a proxy's do. (A dialer of its own would do it
	// too, but then no client shares a transport, not even the proxy's
	// own: nftproxy's three clients would open three connections.)
	cfg.TLSClientConfig.NextProtos = []string{"h2", "http/1.1", "x-" + h.st.Node}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	p, err := proxier.New(proxier.Config{
		NodeName:      h.st.Node,
		ClusterCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		ServiceCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		MasqueradeBit: 14, IPv4: true,
		SyncPeriod: 30 * time.Second, SyncBusyShare: 0.1, FullSyncPeriod: time.Hour,
		MaxReaderWait: 0, ResyncPeriod: 15 * time.Minute,
	}, proxier.Deps{Client: client, ClientConfig: cfg, NFT: map[nft.Family]nft.Backend{nft.IPv4: &nftfake.Discard{}},
		Trackers: &h.trackers, Listed: h.listed})
	if err != nil {
		return err
	}
	go func() {
		if err := p.Run(ctx); err != nil {
			klog.ErrorS(err, "Hollow nftproxy ended", "node", h.st.Node)
		}
	}()
	return nil
}
