// Command bench measures proxies on the e2e test bed with N Services of M
// endpoints each (selector-less, EndpointSlices written directly): time from
// process start to the first full sync, the full-sync duration, the duration
// of syncs after single EndpointSlice changes, and peak RSS. With --upstream
// it runs upstream kube-proxy (nftables mode) beside nftproxy, each in its
// own node namespace on the same API state, and prints ratios.
//
//	bench --services 10000 --endpoints 5 --changes 10 [--upstream]
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

var (
	services  = flag.Int("services", 1000, "number of Services")
	endpoints = flag.Int("endpoints", 5, "endpoints per Service")
	changes   = flag.Int("changes", 10, "single EndpointSlice changes to time")
	upstream  = flag.Bool("upstream", false, "also run upstream kube-proxy (nftables mode) side by side")
	logDir    = flag.String("logs", "", "keep the logs of every process in this directory")
)

const ns = "bench"

func main() {
	flag.Parse()
	os.Exit(testbed.Main(run))
}

// proxy is one proxy under test, in its own node namespace.
type proxy struct {
	name    string
	node    *testbed.Node
	proc    *testbed.Process
	started time.Time
	ready   time.Duration // process start → first full sync done
	full    float64       // first full sync, seconds (the proxy's own histogram)
	partial []float64     // syncs after single changes, seconds
	rssMB   float64
}

func run(tb testbed.TB) {
	bed := testbed.Start(tb, testbed.Options{LogDir: *logDir})
	client := bed.Client()
	ctx := context.Background()
	_, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(tb, err)

	t0 := time.Now()
	populate(tb, client)
	fmt.Printf("created %d Services and EndpointSlices (%d endpoints each) in %v\n", *services, *endpoints, time.Since(t0).Round(time.Second))

	proxies := []*proxy{{name: "nftproxy", node: bed.AddNode("nftproxy")}}
	if *upstream {
		proxies = append(proxies, &proxy{name: "kube-proxy", node: bed.AddNode("upstream")})
	}
	// One at a time, so that neither start-up competes with the other for
	// the CPU.
	for _, p := range proxies {
		args := command(tb, bed, p) // may build: not part of the measurement
		p.started = time.Now()
		p.proc = p.node.Start(args...)
		waitFirstSync(tb, p)
		fmt.Printf("%s: rules programmed %v after start; first full sync %.3fs\n", p.name, p.ready.Round(time.Millisecond), p.full)
	}
	for i := 0; i < *changes; i++ {
		before := map[*proxy]histogram{}
		for _, p := range proxies {
			before[p] = partialSyncs(tb, p)
		}
		moveEndpoint(tb, client, i)
		for _, p := range proxies {
			p.partial = append(p.partial, waitPartialSync(tb, p, before[p]))
		}
		time.Sleep(1100 * time.Millisecond) // upstream's default min sync period
	}
	for _, p := range proxies {
		p.rssMB = peakRSS(p.proc.Pid())
	}
	report(proxies)
}

func command(tb testbed.TB, bed *testbed.Bed, p *proxy) []string {
	common := []string{"--kubeconfig", bed.ProxyKubeconfig, "--hostname-override", p.node.Name,
		"--cluster-cidr", "10.244.0.0/16", "--metrics-bind-address", "127.0.0.1:10249"}
	if p.name == "nftproxy" {
		return append([]string{testbed.GoBuild(tb, "github.com/nftproxy/nftproxy/cmd/nftproxy"), "--v", "2"}, common...)
	}
	return append([]string{filepath.Join(testbed.EnsureBinaries(tb), "kube-proxy"), "--proxy-mode", "nftables",
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0"}, common...)
}

// populate creates the Services and EndpointSlices with 64 workers.
func populate(tb testbed.TB, client kubernetes.Interface) {
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := createService(client, i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < *services; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	must(tb, firstErr)
}

func createService(client kubernetes.Interface, i int) error {
	ctx := context.Background()
	name := fmt.Sprintf("svc-%d", i)
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	if _, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(i, 0), metav1.CreateOptions{})
	return err
}

// slice is Service i's EndpointSlice in generation gen: endpoint addresses
// come from 10.128.0.0/9 (never sent traffic), gen shifts the first one.
func slice(i, gen int) *discovery.EndpointSlice {
	name, port, proto := "http", int32(8080), v1.ProtocolTCP
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d-1", i), Namespace: ns, Labels: map[string]string{discovery.LabelServiceName: fmt.Sprintf("svc-%d", i)}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	base := uint32(10<<24|128<<16) + uint32(i**endpoints)
	for j := 0; j < *endpoints; j++ {
		n := base + uint32(j)
		if j == 0 && gen > 0 {
			n = uint32(10<<24|200<<16) + uint32(gen)
		}
		addr := netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}).String()
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}})
	}
	return es
}

// moveEndpoint moves one endpoint of one Service to a new address.
func moveEndpoint(tb testbed.TB, client kubernetes.Interface, k int) {
	i := (k * 7919) % *services
	_, err := client.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), slice(i, k+1), metav1.UpdateOptions{})
	must(tb, err)
}

type histogram struct{ count, sum float64 }

func metric(tb testbed.TB, p *proxy, name string) (histogram, bool) {
	body, err := p.node.HTTPGet(context.Background(), "http://127.0.0.1:10249/metrics")
	if err != nil {
		return histogram{}, false
	}
	var h histogram
	found := false
	for _, l := range strings.Split(body, "\n") {
		var v float64
		switch {
		case !strings.Contains(l, `ip_family="IPv4"`):
			continue // the Services are IPv4
		case strings.HasPrefix(l, name+"_count"):
			fmt.Sscan(l[strings.LastIndex(l, " ")+1:], &v)
			h.count += v
			found = true
		case strings.HasPrefix(l, name+"_sum"):
			fmt.Sscan(l[strings.LastIndex(l, " ")+1:], &v)
			h.sum += v
		}
	}
	return h, found
}

func waitFirstSync(tb testbed.TB, p *proxy) {
	deadline := time.Now().Add(10 * time.Minute)
	for time.Now().Before(deadline) {
		if h, ok := metric(tb, p, "kubeproxy_sync_full_proxy_rules_duration_seconds"); ok && h.count >= 1 {
			p.ready = time.Since(p.started)
			p.full = h.sum / h.count
			return
		}
		select {
		case <-p.proc.Done():
			tb.Fatalf("%s exited: %v\n%s", p.name, p.proc.Err(), tail(p.proc.Log()))
		case <-time.After(20 * time.Millisecond):
		}
	}
	tb.Fatalf("%s: no full sync within 10 minutes\n%s", p.name, tail(p.proc.Log()))
}

func partialSyncs(tb testbed.TB, p *proxy) histogram {
	h, _ := metric(tb, p, "kubeproxy_sync_partial_proxy_rules_duration_seconds")
	return h
}

func waitPartialSync(tb testbed.TB, p *proxy, before histogram) float64 {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if h := partialSyncs(tb, p); h.count > before.count {
			return (h.sum - before.sum) / (h.count - before.count)
		}
		time.Sleep(5 * time.Millisecond)
	}
	tb.Fatalf("%s: no partial sync after a change within 2 minutes", p.name)
	return 0
}

func peakRSS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			var kb float64
			fmt.Sscan(strings.TrimSpace(strings.TrimPrefix(l, "VmHWM:")), &kb)
			return kb / 1024
		}
	}
	return 0
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

func report(ps []*proxy) {
	fmt.Printf("\n%d Services x %d endpoints, %d single changes\n", *services, *endpoints, *changes)
	fmt.Printf("%-34s", "")
	for _, p := range ps {
		fmt.Printf("%14s", p.name)
	}
	if len(ps) == 2 {
		fmt.Printf("%14s", "ratio")
	}
	fmt.Println()
	row := func(label string, f func(*proxy) float64, unit string) {
		fmt.Printf("%-34s", label)
		for _, p := range ps {
			fmt.Printf("%12.4g%2s", f(p), unit)
		}
		if len(ps) == 2 && f(ps[0]) > 0 {
			fmt.Printf("%13.1fx", f(ps[1])/f(ps[0]))
		}
		fmt.Println()
	}
	row("start to rules programmed", func(p *proxy) float64 { return p.ready.Seconds() }, "s")
	row("first full sync", func(p *proxy) float64 { return p.full }, "s")
	row("single-change sync, median", func(p *proxy) float64 { return median(p.partial) * 1000 }, "ms")
	row("single-change sync, max", func(p *proxy) float64 { return maxOf(p.partial) * 1000 }, "ms")
	row("peak RSS (proxy process)", func(p *proxy) float64 { return p.rssMB }, "MB")
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
		tb.Fatal(err)
	}
}
