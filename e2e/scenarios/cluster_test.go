// Package scenarios drives real traffic through nftproxy on the e2e test bed:
// a real kube-apiserver and etcd, nodes and pods as network namespaces, and
// nftproxy programming each node's kernel over netlink.
package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// cluster is a bed with two nodes, each running nftproxy, and backend pods
// running the probe server on port 8080 (TCP, UDP, raw SCTP).
type cluster struct {
	t      *testing.T
	bed    *testbed.Bed
	client kubernetes.Interface
	nodes  []*testbed.Node
	proxy  map[string]*testbed.Process
	args   map[string][]string // each node's nftproxy command line
	// servers are the pods of probe servers named otherwise than their pod.
	servers map[string]*testbed.Pod
	probe   string
	ns      string
}

const backendPort = 8080

// clusterCIDRs hold every pod CIDR of the bed (10.244.N.0/24, fd00:244:N::/64).
const clusterCIDRs = "10.244.0.0/16,fd00:244::/32"

func newCluster(t *testing.T) *cluster { return newClusterWith(t, nil) }

// newClusterWith is newCluster with prepare run on each node before its
// nftproxy starts.
func newClusterWith(t *testing.T, prepare func(*testbed.Node)) *cluster {
	testbed.RequirePrivileges(t)
	bin := testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	c := &cluster{t: t, bed: testbed.Start(t, testbed.Options{}), probe: testbed.ProbePath(t),
		proxy: map[string]*testbed.Process{}, args: map[string][]string{}, servers: map[string]*testbed.Pod{}, ns: "e2e"}
	c.client = c.bed.Client()
	if _, err := c.client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"n1", "n2"} {
		n := c.bed.AddNode(name)
		if prepare != nil {
			prepare(n)
		}
		c.nodes = append(c.nodes, n)
		c.args[name] = []string{bin, "--kubeconfig", c.bed.ProxyKubeconfig, "--hostname-override", name,
			"--cluster-cidr", clusterCIDRs,
			"--iptables-min-sync-period", "0s", "--metrics-bind-address", "127.0.0.1:10249", "--v", "2"}
		c.proxy[name] = n.Start(c.args[name]...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for name, p := range c.proxy {
		if err := p.WaitForLog(ctx, "Synced"); err != nil {
			t.Fatalf("nftproxy on %s: %v", name, err)
		}
	}
	return c
}

// sub returns the cluster for use inside subtest t, so failures end the
// subtest rather than (illegally) its parent.
func (c *cluster) sub(t *testing.T) *cluster {
	cc := *c
	cc.t = t
	return &cc
}

// backend adds a pod on node i (0-based) running the probe server.
func (c *cluster) backend(i int, name string) *testbed.Pod {
	p := c.nodes[i].AddPod(name)
	p.Start(c.probe, "serve", "--name", name, "--port", fmt.Sprint(backendPort), "--tcp", "--udp", "--sctp-raw")
	return p
}

// service creates a selector-less Service with one port per protocol given
// and returns its ClusterIPs (IPv4 first).
func (c *cluster) service(name string, port int32, dualStack bool, protos ...v1.Protocol) []netip.Addr {
	c.t.Helper()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}}
	for _, p := range protos {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: strings.ToLower(string(p)), Port: port, Protocol: p})
	}
	got := createService(c.t, c.client, svc, dualStack, nil)
	var ips []netip.Addr
	for _, s := range got.Spec.ClusterIPs {
		ips = append(ips, netip.MustParseAddr(s))
	}
	return ips
}

// createService creates svc, dual-stack (IPv4 first) if asked, after
// mutate (nil: none) had its say, and returns what the API server made of
// it (allocated ClusterIPs, nodePort, healthCheckNodePort).
func createService(t testing.TB, client kubernetes.Interface, svc *v1.Service, dualStack bool, mutate func(*v1.Service)) *v1.Service {
	t.Helper()
	if dualStack {
		pol := v1.IPFamilyPolicyRequireDualStack
		svc.Spec.IPFamilyPolicy = &pol
		svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	}
	if mutate != nil {
		mutate(svc)
	}
	got, err := client.CoreV1().Services(svc.Namespace).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create service %s: %v", svc.Name, err)
	}
	return got
}

// endpoints writes the EndpointSlice(s) of a Service: the pods' addresses of
// each family, with every protocol of the Service on backendPort (or port).
func (c *cluster) endpoints(svcName string, port int32, pods ...*testbed.Pod) {
	c.t.Helper()
	if err := c.writeEndpoints(svcName, port, pods...); err != nil {
		c.t.Fatal(err)
	}
}

// writeEndpoints is endpoints for any goroutine: it returns what fails.
func (c *cluster) writeEndpoints(svcName string, port int32, pods ...*testbed.Pod) error {
	svc, err := c.client.CoreV1().Services(c.ns).Get(context.Background(), svcName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	for _, fam := range []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6} {
		es := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: svcName + "-" + strings.ToLower(string(fam)), Namespace: c.ns,
				Labels: map[string]string{discovery.LabelServiceName: svcName}},
			AddressType: fam,
		}
		for _, sp := range svc.Spec.Ports {
			name, proto, p := sp.Name, sp.Protocol, port
			es.Ports = append(es.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &p})
		}
		for _, pod := range pods {
			addr, node := pod.IPv4.String(), pod.Node.Name
			if fam == discovery.AddressTypeIPv6 {
				addr = pod.IPv6.String()
			}
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}, NodeName: &node})
		}
		ctx := context.Background()
		slices := c.client.DiscoveryV1().EndpointSlices(c.ns)
		if _, err := slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			if _, err := slices.Create(ctx, es, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("write EndpointSlice %s: %w", es.Name, err)
			}
		}
	}
	return nil
}

// dial runs `probe dial` in a namespace and returns one line per attempt.
func (c *cluster) dial(from testbed.Netns, proto string, addr netip.AddrPort, count int) []string {
	c.t.Helper()
	out, err := from.Exec(context.Background(), c.probe, "dial", "--proto", proto, "--addr", addr.String(),
		"--timeout", "1s", "--count", fmt.Sprint(count))
	if err != nil {
		c.t.Fatalf("dial: %v", err)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

// eventually dials until check accepts the lines, for up to 10 s.
func (c *cluster) eventually(from testbed.Netns, proto string, addr netip.AddrPort, count int, what string, check func([]string) bool) []string {
	c.t.Helper()
	var lines []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if lines = c.dial(from, proto, addr, count); check(lines) {
			return lines
		}
	}
	c.t.Fatalf("%s %s from %s: want %s, last got %q\n%s", proto, addr, from.NS, what, lines, c.ruleset(c.nodes[0]))
	return nil
}

func (c *cluster) ruleset(n *testbed.Node) string {
	out, err := n.Exec(context.Background(), "nft", "list", "table", "ip", "nftproxy")
	if err != nil {
		return err.Error()
	}
	return out
}

// answeredBy returns the server names in the lines ("NAME PEER").
func answeredBy(lines []string) map[string]int {
	names := map[string]int{}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 2 && strings.Contains(f[1], ":") {
			names[f[0]]++
		}
	}
	return names
}

func all(want string) func([]string) bool {
	return func(lines []string) bool {
		for _, l := range lines {
			if l != want {
				return false
			}
		}
		return len(lines) > 0
	}
}

func onlyFrom(names ...string) func([]string) bool {
	return func(lines []string) bool {
		got := answeredBy(lines)
		if len(got) != len(names) {
			return false
		}
		n := 0
		for _, name := range names {
			if got[name] == 0 {
				return false
			}
			n += got[name]
		}
		return n == len(lines)
	}
}

func vip(ips []netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(ips[0], port) }

// summarize counts probe lines by answer, without the peer's port, in the
// order first seen ("3x a@10.244.1.5, 1x timeout"): for logs and failures.
func summarize(lines []string) string {
	counts := map[string]int{}
	var order []string
	for _, l := range lines {
		key := l
		if f := strings.Fields(l); len(f) == 2 {
			if ap, err := netip.ParseAddrPort(f[1]); err == nil {
				key = f[0] + "@" + ap.Addr().String()
			}
		}
		if counts[key] == 0 {
			order = append(order, key)
		}
		counts[key]++
	}
	parts := make([]string, 0, len(order))
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%dx %s", counts[k], k))
	}
	return strings.Join(parts, ", ")
}
