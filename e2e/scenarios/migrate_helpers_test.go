package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// Helpers of TestMigrateFromKubeProxy: one bed; each subtest adds a node on
// which upstream kube-proxy and nftproxy take turns, with backend pods
// serving a dual-stack Service and a client pod.

// holdPort is the backends' port whose connections stay open (probe
// serve --echo); backendPort answers once per connection.
const holdPort = 8081

type migrateBed struct {
	bed       *testbed.Bed
	client    kubernetes.Interface
	probe     string
	nftproxy  string // binaries
	kubeProxy string
	ns        string
}

func newMigrateBed(t *testing.T) *migrateBed {
	testbed.RequirePrivileges(t)
	m := &migrateBed{probe: testbed.ProbePath(t), ns: "migrate",
		nftproxy: testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy")}
	m.bed = testbed.Start(t, testbed.Options{})
	m.kubeProxy = filepath.Join(testbed.EnsureBinaries(t), "kube-proxy")
	m.client = m.bed.Client()
	if _, err := m.client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: m.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return m
}

// backend adds a pod on n serving backendPort once per connection and
// holdPort echoing what the client sends, for as long as it keeps a connection.
func (m *migrateBed) backend(n *testbed.Node, name string) *testbed.Pod {
	p := n.AddPod(name)
	p.Start(m.probe, "serve", "--name", name, "--port", fmt.Sprint(backendPort), "--tcp")
	p.Start(m.probe, "serve", "--name", name, "--port", fmt.Sprint(holdPort), "--tcp", "--echo")
	return p
}

// service creates a dual-stack Service with ports "tcp" 80 (backendPort)
// and "hold" 81 (holdPort), and its EndpointSlices with pods.
func (m *migrateBed) service(t *testing.T, name string, pods ...*testbed.Pod) *v1.Service {
	t.Helper()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: m.ns},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{
			{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP},
			{Name: "hold", Port: 81, Protocol: v1.ProtocolTCP},
		}}}
	svc = createService(t, m.client, svc, true, nil)
	m.endpoints(t, svc, pods...)
	return svc
}

// endpoints writes the Service's EndpointSlices (one per family): pods,
// ready, on their nodes.
func (m *migrateBed) endpoints(t *testing.T, svc *v1.Service, pods ...*testbed.Pod) {
	t.Helper()
	for _, at := range []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6} {
		es := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: svc.Name + "-" + strings.ToLower(string(at)), Namespace: m.ns,
				Labels: map[string]string{discovery.LabelServiceName: svc.Name}},
			AddressType: at,
		}
		for _, p := range []struct {
			name string
			port int32
		}{{"tcp", backendPort}, {"hold", holdPort}} {
			proto := v1.ProtocolTCP
			es.Ports = append(es.Ports, discovery.EndpointPort{Name: &p.name, Protocol: &proto, Port: &p.port})
		}
		for _, p := range pods {
			addr, node, ready := p.IPv4.String(), p.Node.Name, true
			if at == discovery.AddressTypeIPv6 {
				addr = p.IPv6.String()
			}
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}, NodeName: &node,
				Conditions: discovery.EndpointConditions{Ready: &ready}})
		}
		ctx := context.Background()
		slices := m.client.DiscoveryV1().EndpointSlices(m.ns)
		if _, err := slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			if _, err := slices.Create(ctx, es, metav1.CreateOptions{}); err != nil {
				t.Fatalf("write EndpointSlice %s: %v", es.Name, err)
			}
		}
	}
}

// nftproxyArgs is nftproxy's command line on n (newCluster's flags) with
// extra flags.
func (m *migrateBed) nftproxyArgs(n *testbed.Node, extra ...string) []string {
	return append([]string{m.nftproxy, "--kubeconfig", m.bed.ProxyKubeconfig, "--hostname-override", n.Name,
		"--cluster-cidr", clusterCIDRs, "--iptables-min-sync-period", "0s",
		"--metrics-bind-address", "127.0.0.1:10249", "--v", "2"}, extra...)
}

// startKubeProxy starts upstream kube-proxy in mode on n, as
// TestDifferential does, and waits for its full sync of both families.
func (m *migrateBed) startKubeProxy(t *testing.T, n *testbed.Node, mode string) *testbed.Process {
	t.Helper()
	p := n.Start(append(testbed.KubeProxyArgs(m.kubeProxy, mode), "--kubeconfig", m.bed.ProxyKubeconfig,
		"--hostname-override", n.Name, "--cluster-cidr", clusterCIDRs, "--iptables-min-sync-period", "0s",
		"--metrics-bind-address", "127.0.0.1:10249", "--v", "2")...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for !testbed.FullSyncs(n.Netns) {
		select {
		case <-p.Done():
			t.Fatalf("kube-proxy (%s) on %s exited: %v\n%s", mode, n.Name, p.Err(), diffTail(p.Log(), 30))
		case <-ctx.Done():
			t.Fatalf("kube-proxy (%s) on %s: no full sync of both families within 2 minutes\n%s", mode, n.Name, diffTail(p.Log(), 30))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return p
}

// traffic waits until backend answers through both of the Service's
// ClusterIPs from client, then starts the switch traffic under step first.
func (m *migrateBed) traffic(t *testing.T, client *testbed.Pod, svc *v1.Service, backend, first string) *switchTraffic {
	t.Helper()
	var oneShot, held []netip.AddrPort
	for _, s := range svc.Spec.ClusterIPs {
		ip := netip.MustParseAddr(s)
		oneShot = append(oneShot, netip.AddrPortFrom(ip, 80))
		held = append(held, netip.AddrPortFrom(ip, 81))
	}
	for _, addr := range append(slices.Clone(oneShot), held...) {
		var lines []string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			out, err := client.Exec(context.Background(), m.probe, "dial", "--proto", "tcp", "--addr", addr.String())
			if lines = strings.Fields(out); err == nil && len(lines) == 2 && lines[0] == backend {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s does not answer through %s from %s: %q (%v)", backend, addr, client.Name, out, err)
			}
		}
	}
	return startSwitchTraffic(t, client.Netns, oneShot, held, first)
}

// dialN makes count connections to addr from client and returns probe
// dial's lines ("NAME PEER", "refused", …).
func (m *migrateBed) dialN(t *testing.T, client *testbed.Pod, addr netip.AddrPort, count int) []string {
	t.Helper()
	out := client.MustExec(t, m.probe, "dial", "--proto", "tcp", "--addr", addr.String(),
		"--timeout", "1s", "--count", strconv.Itoa(count))
	return strings.Split(strings.TrimSpace(out), "\n")
}

// waitNoEndpoints waits until nftproxy's table on n rejects ClusterIP ip
// for want of endpoints (map no-endpoint-services).
func (m *migrateBed) waitNoEndpoints(t *testing.T, n *testbed.Node, ip netip.Addr) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out := n.MustExec(t, "nft", "list", "map", "ip", "nftproxy", "no-endpoint-services")
		if strings.Contains(out, ip.String()+" . tcp . 80 ") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nftproxy on %s does not reject %s after 10 s:\n%s", n.Name, ip, out)
		}
	}
}

// waitAnswered waits until backend has answered new connections of the
// current step.
func (m *migrateBed) waitAnswered(t *testing.T, tr *switchTraffic, backend string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); tr.Answered(backend) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s answered no new connection within 10 s", backend)
		}
	}
}

func (m *migrateBed) waitLog(t *testing.T, p *testbed.Process, substr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.WaitForLog(ctx, substr); err != nil {
		t.Fatal(err)
	}
}

// wantTables checks `nft list tables` on n: every table of want is there,
// no table named in absent is.
func (m *migrateBed) wantTables(t *testing.T, n *testbed.Node, when string, want, absent []string) {
	t.Helper()
	out := n.MustExec(t, "nft", "list", "tables")
	var have []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		have = append(have, strings.TrimPrefix(l, "table "))
	}
	for _, w := range want {
		if !slices.Contains(have, w) {
			t.Errorf("%s: no table %s on %s; tables: %q", when, w, n.Name, have)
		}
	}
	for _, h := range have {
		for _, a := range absent {
			if strings.HasSuffix(h, " "+a) {
				t.Errorf("%s: table %s still on %s", when, h, n.Name)
			}
		}
	}
}

// iptablesSave returns iptables-nft-save and ip6tables-nft-save on n,
// without their comment lines (which carry the time).
func (m *migrateBed) iptablesSave(t *testing.T, n *testbed.Node) string {
	t.Helper()
	var b strings.Builder
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		for _, l := range strings.Split(n.MustExec(t, tool), "\n") {
			if !strings.HasPrefix(l, "#") {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// metric returns the value of series (name{labels} as the exposition
// writes it) from the proxy's /metrics on n; a series that is not there
// fails the test.
func (m *migrateBed) metric(t *testing.T, n *testbed.Node, series string) float64 {
	t.Helper()
	v, ok := m.scrape(t, n)[series]
	if !ok {
		t.Fatalf("no series %s on %s", series, n.Name)
	}
	return v
}

// wantMetrics compares series values on n with want; a counter that was
// never incremented is not exported, and counts as 0.
func (m *migrateBed) wantMetrics(t *testing.T, n *testbed.Node, want map[string]float64) {
	t.Helper()
	got := m.scrape(t, n)
	for series, w := range want {
		v, ok := got[series]
		name, _, _ := strings.Cut(series, "{")
		if !ok && !(w == 0 && strings.HasSuffix(name, "_total")) {
			t.Errorf("no series %s on %s", series, n.Name)
		} else if v != w {
			t.Errorf("%s = %v on %s, want %v", series, v, n.Name, w)
		}
	}
}

func (m *migrateBed) scrape(t *testing.T, n *testbed.Node) map[string]float64 {
	return scrapeMetrics(t, n)
}
