package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// Helpers of TestSemantics: nodes whose nftproxy runs with other flags,
// Services and EndpointSlices written field by field, and checks on who
// answered, whom the backend saw, and what is left in the kernel's tables.

// semAddNode adds a node to the cluster whose nftproxy runs with newCluster's
// flags plus extra, and waits for its first sync.
func (c *cluster) semAddNode(name string, extra ...string) *testbed.Node {
	c.t.Helper()
	bin := testbed.GoBuild(c.t, "github.com/nftproxy/nftproxy/cmd/nftproxy") // memoized
	n := c.bed.AddNode(name)
	args := append([]string{bin, "--kubeconfig", c.bed.ProxyKubeconfig, "--hostname-override", name,
		"--cluster-cidr", clusterCIDRs,
		"--iptables-min-sync-period", "0s", "--metrics-bind-address", "127.0.0.1:10249", "--v", "2"}, extra...)
	p := n.Start(args...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.WaitForLog(ctx, "Synced"); err != nil {
		c.t.Fatalf("nftproxy on %s: %v", name, err)
	}
	c.nodes = append(c.nodes, n)
	c.proxy[name] = p
	return n
}

// semServe starts one more probe server in pod p.
func (c *cluster) semServe(p *testbed.Pod, name string, port int, protos ...string) {
	args := []string{c.probe, "serve", "--name", name, "--port", fmt.Sprint(port)}
	for _, proto := range protos {
		args = append(args, "--"+proto)
	}
	p.Start(args...)
	c.servers[name] = p
}

func semPort(name string, port int32, proto v1.Protocol) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: proto}
}

// semCreate creates a selector-less IPv4 Service with these ports;
// mutate (if not nil) adjusts it before creation.
func (c *cluster) semCreate(name string, mutate func(*v1.Service), ports ...v1.ServicePort) *v1.Service {
	c.t.Helper()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns}, Spec: v1.ServiceSpec{Ports: ports}}
	if mutate != nil {
		mutate(svc)
	}
	got, err := c.client.CoreV1().Services(c.ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create service %s: %v", name, err)
	}
	return got
}

// semUpdate applies mutate to the current Service (retrying on conflicts).
func (c *cluster) semUpdate(name string, mutate func(*v1.Service)) *v1.Service {
	c.t.Helper()
	var got *v1.Service
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.client.CoreV1().Services(c.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(svc)
		got, err = c.client.CoreV1().Services(c.ns).Update(ctx, svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		c.t.Fatalf("update service %s: %v", name, err)
	}
	return got
}

// semSetLBIP writes the Service's status.loadBalancer.ingress.
func (c *cluster) semSetLBIP(name string, ip netip.Addr) {
	c.t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.client.CoreV1().Services(c.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip.String()}}
		_, err = c.client.CoreV1().Services(c.ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		c.t.Fatalf("update status of service %s: %v", name, err)
	}
}

// semSetZone sets (zone != "") or removes the node's topology.kubernetes.io/zone label.
func (c *cluster) semSetZone(n *testbed.Node, zone string) {
	c.t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		obj, err := c.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if zone == "" {
			delete(obj.Labels, v1.LabelTopologyZone)
		} else {
			obj.Labels[v1.LabelTopologyZone] = zone
		}
		_, err = c.client.CoreV1().Nodes().Update(ctx, obj, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		c.t.Fatalf("label node %s: %v", n.Name, err)
	}
}

// semEndpoint is one endpoint of an EndpointSlice written by semSlice.
type semEndpoint struct {
	pod                         *testbed.Pod
	ready, serving, terminating bool
	zones                       []string // hints.forZones
}

func semReady(p *testbed.Pod, zones ...string) semEndpoint {
	return semEndpoint{pod: p, ready: true, serving: true, zones: zones}
}

// semTerminating is a terminating endpoint, serving or not (never ready).
func semTerminating(p *testbed.Pod, serving bool) semEndpoint {
	return semEndpoint{pod: p, serving: serving, terminating: true}
}

// semSlice writes the Service's IPv4 EndpointSlice "<svc>-sem": one port per
// Service port (same name and protocol) with target port targets[name], or
// backendPort; the endpoints with their conditions, node and zone hints.
func (c *cluster) semSlice(svcName string, targets map[string]int32, eps ...semEndpoint) {
	c.t.Helper()
	ctx := context.Background()
	svc, err := c.client.CoreV1().Services(c.ns).Get(ctx, svcName, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svcName + "-sem", Namespace: c.ns,
			Labels: map[string]string{discovery.LabelServiceName: svcName}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   []discovery.Endpoint{},
	}
	for _, sp := range svc.Spec.Ports {
		name, proto, port := sp.Name, sp.Protocol, int32(backendPort)
		if p, ok := targets[name]; ok {
			port = p
		}
		es.Ports = append(es.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	for _, e := range eps {
		node := e.pod.Node.Name
		ready, serving, terminating := e.ready, e.serving, e.terminating
		d := discovery.Endpoint{Addresses: []string{e.pod.IPv4.String()}, NodeName: &node,
			Conditions: discovery.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
		if len(e.zones) > 0 {
			d.Hints = &discovery.EndpointHints{}
			for _, z := range e.zones {
				d.Hints.ForZones = append(d.Hints.ForZones, discovery.ForZone{Name: z})
			}
		}
		es.Endpoints = append(es.Endpoints, d)
	}
	slices := c.client.DiscoveryV1().EndpointSlices(c.ns)
	if _, err := slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		if _, err := slices.Create(ctx, es, metav1.CreateOptions{}); err != nil {
			c.t.Fatalf("write EndpointSlice %s: %v", es.Name, err)
		}
	}
}

// semAwait dials from `from` until check accepts the lines, for up to 15 s; on
// failure it shows the IPv4 table of node (the node `from` is on).
func (c *cluster) semAwait(node *testbed.Node, from testbed.Netns, proto string, addr netip.AddrPort, count int, what string, check func([]string) bool) []string {
	c.t.Helper()
	var lines []string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if lines = c.dial(from, proto, addr, count); check(lines) {
			c.explained(from, proto, addr, lines)
			return lines
		}
	}
	c.t.Fatalf("%s %s from %s: want %s, last got %q\nnft list table ip nftproxy on %s:\n%s",
		proto, addr, from.NS, what, lines, node.Name, c.ruleset(node))
	return nil
}

// semAnswer is one parsed "NAME PEER" line.
type semAnswer struct {
	name string
	peer netip.AddrPort
}

func semParse(line string) (semAnswer, bool) {
	f := strings.Fields(line)
	if len(f) != 2 {
		return semAnswer{}, false
	}
	peer, err := netip.ParseAddrPort(f[1])
	if err != nil {
		return semAnswer{}, false
	}
	return semAnswer{name: f[0], peer: peer}, true
}

// semNoAnswer: no backend answered any attempt (the kernel refused, nothing
// came back, or the destination was unreachable).
func semNoAnswer(lines []string) bool {
	for _, l := range lines {
		switch l {
		case "refused", "timeout", "unreachable":
		default:
			return false
		}
	}
	return len(lines) > 0
}

// semRefusedOrTimeout: every attempt was refused by the kernel or timed out.
func semRefusedOrTimeout(lines []string) bool {
	for _, l := range lines {
		if l != "refused" && l != "timeout" {
			return false
		}
	}
	return len(lines) > 0
}

// semSticky: every attempt was answered, all by the same backend.
func semSticky(lines []string) bool {
	return len(answeredBy(lines)) == 1 && semAllAnswered(lines)
}

// semSeveral: every attempt was answered, by at least two backends.
func semSeveral(lines []string) bool {
	return len(answeredBy(lines)) >= 2 && semAllAnswered(lines)
}

func semAllAnswered(lines []string) bool {
	for _, l := range lines {
		if _, ok := semParse(l); !ok {
			return false
		}
	}
	return len(lines) > 0
}

// semSeenAs: every attempt was answered by backend name, which saw the client
// as source address src.
func semSeenAs(name string, src netip.Addr) func([]string) bool {
	return func(lines []string) bool {
		for _, l := range lines {
			a, ok := semParse(l)
			if !ok || a.name != name || a.peer.Addr() != src {
				return false
			}
		}
		return len(lines) > 0
	}
}

// semStray gives pod p a second address, outside every node's pod CIDR
// but inside the cluster CIDR, as the source of its connections to the
// service CIDR; its node routes that address back to the pod.
func (c *cluster) semStray(p *testbed.Pod, addr netip.Addr) {
	c.t.Helper()
	ctx := context.Background()
	for _, cmd := range []struct {
		ns   testbed.Netns
		args []string
	}{
		{p.Netns, []string{"ip", "addr", "add", addr.String() + "/32", "dev", "eth0"}},
		{p.Netns, []string{"ip", "route", "add", "10.96.0.0/12", "via", "169.254.1.1", "dev", "eth0", "src", addr.String()}},
		{p.Node.Netns, []string{"ip", "route", "add", addr.String() + "/32", "dev", p.HostVeth}},
	} {
		if _, err := cmd.ns.Exec(ctx, cmd.args...); err != nil {
			c.t.Fatal(err)
		}
	}
}

// semBridge moves pod p from its routed veth onto a bridge in its node
// (created on first use), as a bridge-based CNI would attach it: the node
// then sees the pod's packets arrive on the bridge. The bridge lives in the
// node's namespace and goes with it.
func (c *cluster) semBridge(p *testbed.Pod, bridge string) {
	c.t.Helper()
	ctx := context.Background()
	n := p.Node.Netns
	if _, err := n.Exec(ctx, "ip", "link", "show", bridge); err != nil {
		for _, args := range [][]string{
			{"ip", "link", "add", bridge, "type", "bridge"},
			{"ip", "link", "set", bridge, "up"},
			{"sysctl", "-q", "-w", "net.ipv4.conf." + bridge + ".proxy_arp=1", "net.ipv4.neigh." + bridge + ".proxy_delay=0"},
		} {
			if _, err := n.Exec(ctx, args...); err != nil {
				c.t.Fatal(err)
			}
		}
	}
	for _, args := range [][]string{
		{"ip", "link", "set", p.HostVeth, "master", bridge},
		{"ip", "route", "replace", p.IPv4.String() + "/32", "dev", bridge},
	} {
		if _, err := n.Exec(ctx, args...); err != nil {
			c.t.Fatal(err)
		}
	}
}

// semTable lists nftproxy's table of family ("ip" or "ip6") on node n.
func (c *cluster) semTable(n *testbed.Node, family string) string {
	c.t.Helper()
	out, err := n.Exec(context.Background(), "nft", "list", "table", family, "nftproxy")
	if err != nil {
		c.t.Fatalf("nft list table %s nftproxy on %s: %v", family, n.Name, err)
	}
	return out
}

// semMentions returns the lines of a ruleset that name Service svc: chain and
// set names ("<kind>-HASH-ns/name/proto/port") and element comments
// ("ns/name:port", or "ns/name" for an unnamed port).
func (c *cluster) semMentions(ruleset, svc string) []string {
	re := regexp.MustCompile(regexp.QuoteMeta(c.ns+"/"+svc) + `([/:"]|$)`)
	var out []string
	for _, l := range strings.Split(ruleset, "\n") {
		if re.MatchString(l) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// semTables waits (up to 10 s) until check accepts the IPv4 and IPv6
// tables of every node; check returns what is wrong, or "".
func (c *cluster) semTables(what string, check func(n *testbed.Node, family, ruleset string) string) {
	c.t.Helper()
	var problem, table string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		problem = ""
	nodes:
		for _, n := range c.nodes {
			for _, fam := range []string{"ip", "ip6"} {
				table = c.semTable(n, fam)
				if p := check(n, fam, table); p != "" {
					problem = fmt.Sprintf("node %s, table %s nftproxy: %s", n.Name, fam, p)
					break nodes
				}
			}
		}
		if problem == "" {
			return
		}
	}
	c.t.Fatalf("%s: %s\n%s", what, problem, table)
}

// semNoMention waits until no node's tables name Service svc nor contain any
// of the strings in gone (addresses, "tcp . <nodeport>", ...).
func (c *cluster) semNoMention(svc string, gone ...string) {
	c.t.Helper()
	c.semTables("nothing stale of "+svc, func(_ *testbed.Node, _, rs string) string {
		if m := c.semMentions(rs, svc); len(m) > 0 {
			return fmt.Sprintf("still mentions %s/%s: %q", c.ns, svc, m)
		}
		for _, g := range gone {
			if semContainsToken(rs, g) {
				return fmt.Sprintf("still contains %q", g)
			}
		}
		return ""
	})
}

// semClusterIP parses a Service's ClusterIP.
func semClusterIP(t *testing.T, svc *v1.Service) netip.Addr {
	t.Helper()
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatalf("service %s: ClusterIP %q: %v", svc.Name, svc.Spec.ClusterIP, err)
	}
	return ip
}

// semOnlyClusterIP waits until, on every node, the only line of the IPv4
// table naming Service svc is its one service-ips element for vip:80, to
// the pick chain of its number of endpoints (no chain of its own, no
// external, firewall, no-endpoint or NodePort leftovers), the IPv6 table
// names it nowhere, and no table contains any of gone.
func (c *cluster) semOnlyClusterIP(svc string, vip netip.Addr, gone ...string) {
	c.t.Helper()
	elem := fmt.Sprintf(`%s . tcp . 80 comment "%s/%s:http" : goto pick-tcp-`, vip, c.ns, svc)
	c.semTables("only the ClusterIP rules of "+svc, func(_ *testbed.Node, fam, rs string) string {
		m := c.semMentions(rs, svc)
		for _, l := range m {
			if fam != "ip" || !strings.HasPrefix(strings.TrimPrefix(l, "elements = { "), elem) {
				return "stale: " + l
			}
		}
		if fam == "ip" && len(m) != 1 {
			return fmt.Sprintf("want one service-ips element, got %q", m)
		}
		for _, g := range gone {
			if semContainsToken(rs, g) {
				return fmt.Sprintf("still contains %q", g)
			}
		}
		return ""
	})
}

// semContainsToken reports whether s occurs in text not as part of a longer
// number or address (10.96.0.1 does not match in 10.96.0.10).
func semContainsToken(text, s string) bool {
	return regexp.MustCompile(`(^|[^0-9.])` + regexp.QuoteMeta(s) + `([^0-9]|$)`).MatchString(text)
}
