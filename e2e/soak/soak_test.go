// Package soak runs nftproxy under continuous churn for a long time and
// checks that nothing drifts: memory and goroutines stay flat, no sync
// fails, no connection through a stable Service is lost, and at the end the
// tables equal what a fresh proxy writes. `make test` runs it for five
// minutes; `make soak` for an hour (NFTPROXY_SOAK=1h).
package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

const (
	ns          = "soak"
	backendPort = 8080
	// churnNames is the pool of Services the churn creates, changes and
	// deletes; churnRate its operations per second.
	churnNames = 300
	churnRate  = 20
)

// firewall is another program's table beside nftproxy's.
const firewall = "add table ip soak-fw; " +
	"add set ip soak-fw blocked { type ipv4_addr; elements = { 192.0.2.1 } }; " +
	"add chain ip soak-fw input { type filter hook input priority 0; policy accept; }; " +
	"add rule ip soak-fw input tcp dport 9999 drop; " +
	"add rule ip soak-fw input ip saddr @blocked drop"

func soakDuration(t *testing.T) time.Duration {
	if s := os.Getenv("NFTPROXY_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("NFTPROXY_SOAK=%q: %v", s, err)
		}
		return d
	}
	if testing.Short() {
		return time.Minute
	}
	return 5 * time.Minute
}

func TestSoak(t *testing.T) {
	d := soakDuration(t)
	bin := testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	probe := testbed.ProbePath(t)
	bed := testbed.Start(t, testbed.Options{})
	client := bed.Client()
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := bed.AddNode("n1")
	n.MustExec(t, "nft", firewall)
	fw := n.MustExec(t, "nft", "list", "table", "ip", "soak-fw")
	var pods []*testbed.Pod
	for _, name := range []string{"soak-a", "soak-b"} {
		p := n.AddPod(name)
		p.Start(probe, "serve", "--name", name, "--port", fmt.Sprint(backendPort), "--tcp", "--echo")
		pods = append(pods, p)
	}
	clientPod := n.AddPod("soak-client")
	// --profiling: the sampler asks /debug/pprof/heap?gc=1 for a collection
	// before it reads the live heap.
	args := []string{bin, "--kubeconfig", bed.ProxyKubeconfig, "--hostname-override", n.Name,
		"--cluster-cidr", "10.244.0.0/16,fd00:244::/32", "--metrics-bind-address", "127.0.0.1:10249",
		"--profiling", "--v", "2"}
	proxy := n.Start(args...)
	waitLog(t, proxy, `"Informers synced`)

	web := createService(t, client, "web", pods, 0)
	addr := netip.AddrPortFrom(web, 80)
	waitAnswered(t, clientPod, probe, addr)
	load := testbed.StartLoad(t, clientPod, probe, addr, 100, 20)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	ch := &churn{client: client, rnd: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)), live: map[int]bool{}}
	wg.Go(func() { ch.run(stop) })
	samples := sample(t, n, d, stop)
	wg.Wait()

	if lost, summary := load.Stop().Lost(); lost {
		t.Errorf("through the stable Service: %s", summary)
	} else {
		t.Logf("SOAK load: %s", summary)
	}
	t.Logf("SOAK churn: %d operations, %d errors", ch.ops, len(ch.errs))
	if len(ch.errs) > 0 {
		t.Errorf("churn errors: %v", ch.errs[:min(len(ch.errs), 5)])
	}
	judge(t, samples, d)
	if failures, _ := testbed.Metric(n.Netns, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"); failures != 0 {
		t.Errorf("%v failed syncs", failures)
	}
	expectFresh(t, n, proxy, args)
	if got := n.MustExec(t, "nft", "list", "table", "ip", "soak-fw"); got != fw {
		t.Errorf("the firewall table changed:\n%s\nwant\n%s", got, fw)
	}
}

// churn creates, changes and deletes Services and their EndpointSlices at
// churnRate operations per second, among churnNames names.
type churn struct {
	client kubernetes.Interface
	rnd    *rand.Rand
	live   map[int]bool
	ops    int
	errs   []error
}

func (c *churn) run(stop <-chan struct{}) {
	tick := time.NewTicker(time.Second / churnRate)
	defer tick.Stop()
	for gen := 1; ; gen++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		i := c.rnd.IntN(churnNames)
		var err error
		switch {
		case !c.live[i]:
			err = c.create(i, gen)
			c.live[i] = err == nil
		case c.rnd.IntN(4) == 0:
			err = c.delete(i)
			c.live[i] = err != nil
		default:
			err = c.update(i, gen)
		}
		c.ops++
		if err != nil {
			c.errs = append(c.errs, err)
		}
	}
}

func churnName(i int) string { return fmt.Sprintf("churn-%d", i) }

func (c *churn) create(i, gen int) error {
	ctx := context.Background()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: churnName(i), Namespace: ns},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	if _, err := c.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := c.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, unanswered(churnName(i), i, gen), metav1.CreateOptions{})
	return err
}

func (c *churn) update(i, gen int) error {
	_, err := c.client.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), unanswered(churnName(i), i, gen),
		metav1.UpdateOptions{})
	return err
}

func (c *churn) delete(i int) error {
	ctx := context.Background()
	if err := c.client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, churnName(i)+"-1", metav1.DeleteOptions{}); err != nil {
		return err
	}
	return c.client.CoreV1().Services(ns).Delete(ctx, churnName(i), metav1.DeleteOptions{})
}

// unanswered is Service name's EndpointSlice of generation gen: one to
// three endpoints in 10.128.0.0/9 (never sent traffic).
func unanswered(name string, i, gen int) *discovery.EndpointSlice {
	port, proto, pname := int32(backendPort), v1.ProtocolTCP, "http"
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for j := range 1 + gen%3 {
		n := uint32(10<<24|128<<16) + uint32((i*3+j+gen*7919)%(1<<23))
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{
			Addresses: []string{netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}).String()}})
	}
	return es
}

// createService creates Service name with pods as its endpoints (port 80 to
// backendPort) and returns its ClusterIP.
func createService(t *testing.T, client kubernetes.Interface, name string, pods []*testbed.Pod, _ int) netip.Addr {
	t.Helper()
	ctx := context.Background()
	svc, err := client.CoreV1().Services(ns).Create(ctx, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	port, proto, pname := int32(backendPort), v1.ProtocolTCP, "http"
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for _, p := range pods {
		node := p.Node.Name
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{p.IPv4.String()}, NodeName: &node})
	}
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return netip.MustParseAddr(svc.Spec.ClusterIP)
}

// waitAnswered waits until addr answers from pod.
func waitAnswered(t *testing.T, pod *testbed.Pod, probe string, addr netip.AddrPort) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _ := pod.Exec(context.Background(), probe, "dial", "--proto", "tcp", "--addr", addr.String())
		if f := strings.Fields(out); len(f) == 2 && strings.HasPrefix(f[0], "soak-") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not answer: %q", addr, out)
		}
	}
}

func waitLog(t *testing.T, p *testbed.Process, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := p.WaitForLog(ctx, s); err != nil {
		t.Fatal(err)
	}
}

// expectFresh checks that n's tables equal what a fresh nftproxy writes for
// the same API state (see testbed.ResolveSlots).
func expectFresh(t *testing.T, n *testbed.Node, proxy *testbed.Process, args []string) {
	t.Helper()
	time.Sleep(2 * time.Second) // the churn's last changes synced (minimum sync period 1 s)
	got, err := testbed.Tables(n.Netns)
	if err != nil {
		t.Fatal(err)
	}
	proxy.Stop(10 * time.Second)
	n.MustExec(t, args[0], "--cleanup")
	fresh := n.Start(args...)
	waitLog(t, fresh, `"Synced" ipFamily="IPv6"`)
	waitLog(t, fresh, `"Synced" ipFamily="IPv4"`)
	want, err := testbed.Tables(n.Netns)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("after the soak the tables differ from a fresh proxy's:\n%s", testbed.FirstDifferences(got, want, 10))
	}
}
