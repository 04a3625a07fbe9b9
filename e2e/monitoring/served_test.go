package monitoring

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftnl"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/proxyhealth"
)

// served is one scrape of a running nftproxy, shared by the tests of this
// file (the first one to ask runs it).
var served struct {
	once sync.Once
	s    Served
}

// scrapeNftproxy runs nftproxy's proxier on a kernel, in a network
// namespace of its own, with every part that updates a metric wired as
// cmd/nftproxy wires it (both families' netlink backends, the conntrack
// cleaner, the monitor of other processes' changes, the health server),
// takes it through what the dashboard and the alerts watch, and returns what the production /metrics handler then
// serves. The API is a fake clientset, which bypasses client-go's request
// metrics; one real request through client-go stands in for the API
// traffic.
func scrapeNftproxy(t *testing.T) Served {
	t.Helper()
	served.once.Do(func() { served.s = runAndScrape(t) })
	if served.s == nil {
		t.Fatal("running nftproxy failed (see the first test's log)")
	}
	return served.s
}

func runAndScrape(t *testing.T) Served {
	ns := netns.New(t, "nftproxy-mon", "nft")
	client := fake.NewClientset(node(), dnsService(), invalidService())
	health := proxyhealth.New(time.Minute, nil)
	runProxier(t, ns.Fd, client, health)
	waitFor(t, "the first sync of both families", func() bool {
		st := health.Status().Families
		return !st[metrics.IPv4].LastUpdated.IsZero() && !st[metrics.IPv6].LastUpdated.IsZero()
	})
	// Another process deletes the IPv4 table: nftproxy repairs it.
	if out, err := ns.Run("", "nft", "delete", "table", "ip", "nftproxy"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// Its series are served at 0 from the start: wait for a count.
	waitFor(t, "the repair", func() bool { return sum(t, "nftproxy_repairs_total") > 0 })
	// Endpoints written after the start: a network programming latency
	// and, the Service having a UDP port, a conntrack cleanup per family.
	ctx := context.Background()
	for _, es := range dnsSlices(time.Now()) {
		if _, err := client.DiscoveryV1().EndpointSlices(es.Namespace).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s := Served{}
	waitFor(t, "the latencies of the endpoints' sync", func() bool {
		s = scrape(t)
		return len(s["kubeproxy_network_programming_duration_seconds_count"]) == 2 &&
			len(s["kubeproxy_conntrack_reconciler_sync_duration_seconds_count"]) == 2
	})
	probeHealth(t, health)
	requestAPI(t)
	// What cmd/nftproxy's runProxy sets at start (from a package main,
	// which a test cannot import): the labels are the metric's own.
	metrics.BuildInfo.WithLabelValues("1", "36", "v0.0.0-test", "0000000", "clean", "1970-01-01T00:00:00Z",
		"go", "gc", "linux/amd64").Set(1)
	return scrape(t)
}

// runProxier starts the proxier as cmd/nftproxy does, programming the
// namespace netns.
func runProxier(t *testing.T, netns int, client kubernetes.Interface, health *proxyhealth.Health) {
	backends := map[nft.Family]nft.Backend{}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: netns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		backends[f] = n
	}
	ct, err := conntrack.NewNetlink(conntrack.NetlinkOptions{NetNSFd: netns})
	if err != nil {
		t.Fatal(err)
	}
	var ours []uint32
	for _, b := range backends {
		ours = append(ours, b.(*nftnl.Netlink).PortID())
	}
	mon, err := nftnl.NewMonitor(nftnl.NetlinkOptions{NetNSFd: netns}, ours...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mon.Close() })
	p, err := proxier.New(proxier.Config{NodeName: "n1", MasqueradeBit: 14, IPv4: true, IPv6: true,
		SyncPeriod: time.Minute, FullSyncPeriod: time.Hour,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/108")},
	}, proxier.Deps{Client: client, NFT: backends, Health: health, Conntrack: ct, Monitor: mon})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// probeHealth asks /healthz and /livez, as kubelet's probes do.
func probeHealth(t *testing.T, health *proxyhealth.Health) {
	mux := proxyhealth.HealthMux(health)
	for _, path := range []string{"/healthz", "/livez"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s = %d", path, rec.Code)
		}
	}
}

// requestAPI makes one request through client-go to a stand-in API
// server, which client-go's instrumentation counts.
func requestAPI(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
}

// scrape gets /metrics from the metrics server's handler.
// sum is the total of the series of counter name in the metrics registry.
func sum(t *testing.T, name string) float64 {
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

func scrape(t *testing.T) Served {
	rec := httptest.NewRecorder()
	proxyhealth.MetricsMux(metrics.Handler(), false).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics = %d: %s", rec.Code, rec.Body)
	}
	s, err := ParseExposition(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func node() *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec:       v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:244:1::/64"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeInternalIP, Address: "10.10.0.11"},
			{Type: v1.NodeInternalIP, Address: "fd00:10::11"},
		}},
	}
}

// dnsService is a dual-stack Service with a UDP and a TCP port.
func dnsService() *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "dns"},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
			Ports: []v1.ServicePort{
				{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, Protocol: v1.ProtocolTCP},
			},
		},
	}
}

// dnsSlices are dns's EndpointSlices, changed by the control plane at
// trigger.
func dnsSlices(trigger time.Time) []*discovery.EndpointSlice {
	var out []*discovery.EndpointSlice
	for fam, addr := range map[discovery.AddressType]string{discovery.AddressTypeIPv4: "10.244.1.20", discovery.AddressTypeIPv6: "fd00:244:1::20"} {
		udp, tcp, port := v1.ProtocolUDP, v1.ProtocolTCP, int32(5353)
		dns, dnsTCP, here := "dns", "dns-tcp", "n1"
		out = append(out, &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "dns-" + strings.ToLower(string(fam)),
				Labels:      map[string]string{discovery.LabelServiceName: "dns"},
				Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}},
			AddressType: fam,
			Endpoints:   []discovery.Endpoint{{Addresses: []string{addr}, NodeName: &here}},
			Ports:       []discovery.EndpointPort{{Name: &dns, Protocol: &udp, Port: &port}, {Name: &dnsTCP, Protocol: &tcp, Port: &port}},
		})
	}
	return out
}

// invalidService has an external IP the API server accepts but nftproxy
// cannot program (a multicast address).
func invalidService() *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "multicast"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
			ExternalIPs: []string{"239.1.1.1"},
			Ports:       []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
}
