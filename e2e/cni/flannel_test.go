package cni

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

const (
	// backendPort is where the pods' probe servers listen; servicePort is
	// the Service's.
	backendPort = 8080
	servicePort = 80
	// clusterCIDRs is every pod CIDR of the bed, flannel's Network and
	// IPv6Network.
	clusterCIDRs = testbed.PodCIDRs
	// watchTable is the test's own table on each node: it counts packets
	// that leave with the masquerade mark bit (see markWatch).
	watchTable = "nfpcni"
	// controlPort: UDP to it from a node is marked by the watch table
	// itself, to show that the count sees a marked packet.
	controlPort = 9999
)

// vxlanDevices are flannel's VXLAN devices, IPv4 then IPv6 (the order of
// a node's PodCIDRs).
var vxlanDevices = []string{"flannel.1", "flannel-v6.1"}

// flannel's two modes: which of its traffic managers writes its rules.
var modes = []string{"iptables", "nftables"}

// The proxies: nftproxy, and upstream kube-proxy in its nftables mode
// beside it, on the same checks.
var proxies = []string{"nftproxy", "kube-proxy"}

// TestFlannelNeighbours runs flanneld (vxlan, --ip-masq) and nftproxy on
// two nodes, in each of flannel's modes and in both registration orders
// (which of the two writers' chains at the same hook and priority the
// kernel runs first), and checks what a user of both needs from their
// neighbourhood: flannel's rules left exactly as flannel wrote them; a
// pod's address preserved from pod to ClusterIP to a pod on the other
// node (no masquerade on top of flannel's routing); traffic from outside
// the cluster to a NodePort masqueraded exactly once; no packet leaving a
// node with the masquerade mark bit set (the mark survives VXLAN
// encapsulation: kubernetes#92035); and none of this lost while flanneld
// and the proxy restart under traffic. kube-proxy runs the same checks
// beside nftproxy.
func TestFlannelNeighbours(t *testing.T) {
	testbed.RequirePrivileges(t)
	bins := binaries{
		flanneld:  flanneldPath(t),
		nftproxy:  testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy"),
		kubeProxy: kubeProxyPath(t),
		probe:     testbed.ProbePath(t),
	}
	for _, proxy := range proxies {
		for _, mode := range modes {
			for _, flannelFirst := range []bool{true, false} {
				order := "proxy first"
				if flannelFirst {
					order = "flannel first"
				}
				t.Run(proxy+"/"+mode+"/"+order, func(t *testing.T) {
					b := newFlannelBed(t, proxy, mode, bins, flannelFirst)
					b.checkNeighbours("after the start")
					b.restartUnderTraffic()
					b.checkNeighbours("after the restarts")
				})
			}
		}
	}
}

// flanneldPath builds flanneld (e2e/tools/build.sh --flannel; a no-op
// when up to date) and returns its path.
func flanneldPath(t *testing.T) string {
	testbed.RunBuild(t, "--flannel")
	return filepath.Join(kubebin.Dir(kubebin.Pinned().Kubernetes), "flanneld")
}

// kubeProxyPath returns upstream kube-proxy's path (e2e/tools/build.sh).
func kubeProxyPath(t *testing.T) string {
	return filepath.Join(testbed.EnsureBinaries(t), "kube-proxy")
}

type binaries struct{ flanneld, nftproxy, kubeProxy, probe string }

// flannelBed is a bed of two nodes running flanneld and a proxy, with a
// probe server pod and a client pod on each, and one NodePort Service,
// dual-stack, whose endpoints are both servers.
type flannelBed struct {
	t         *testing.T
	bed       *testbed.Bed
	proxyIs   string   // nftproxy or kube-proxy
	proxyArgs []string // added to its command line
	mode      string
	bins      binaries
	dir       string
	nodes     []*testbed.Node
	flannel   map[string]*testbed.Process
	proxy     map[string]*testbed.Process
	servers   []*testbed.Pod // servers[i] on nodes[i]
	clients   []*testbed.Pod // clients[i] on nodes[i]
	svc       *v1.Service
	// flannelState is each node's rules other than the proxy's and the
	// test's, as they were once flannel had written them.
	flannelState map[string]string
}

// newFlannelBed starts a flannelBed; proxyArgs are added to the proxy's
// command line.
func newFlannelBed(t *testing.T, proxy, mode string, bins binaries, flannelFirst bool, proxyArgs ...string) *flannelBed {
	b := &flannelBed{t: t, bed: testbed.Start(t, testbed.Options{PodRoutes: testbed.PodRoutesNowhere}), proxyIs: proxy, mode: mode, bins: bins,
		proxyArgs: proxyArgs,
		dir:       t.TempDir(), flannel: map[string]*testbed.Process{}, proxy: map[string]*testbed.Process{}}
	conf := fmt.Sprintf(`{"Network": %q, "EnableIPv6": true, "IPv6Network": %q, "EnableNFTables": %v, "Backend": {"Type": "vxlan"}}`,
		strings.Split(clusterCIDRs, ",")[0], strings.Split(clusterCIDRs, ",")[1], mode == "nftables")
	if err := os.WriteFile(filepath.Join(b.dir, "net-conf.json"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"n1", "n2"} {
		n := b.bed.AddNode(name)
		markWatch(t, n)
		b.nodes = append(b.nodes, n)
	}
	if flannelFirst {
		b.startFlannels()
		b.startProxies()
	} else {
		b.startProxies()
		b.startFlannels()
	}
	b.flannelState = map[string]string{}
	for _, n := range b.nodes {
		b.flannelState[n.Name] = neighbourRules(t, n)
	}
	for i, n := range b.nodes {
		s := n.AddPod("s" + strconv.Itoa(i+1))
		s.Start(bins.probe, "serve", "--name", s.Name, "--port", strconv.Itoa(backendPort), "--tcp")
		b.servers = append(b.servers, s)
		b.clients = append(b.clients, n.AddPod("c"+strconv.Itoa(i+1)))
	}
	b.svc = b.createService()
	return b
}

// startFlannels starts flanneld on every node and waits until each has
// routed the other's pod CIDRs and written its masquerade rules.
func (b *flannelBed) startFlannels() {
	for _, n := range b.nodes {
		b.startFlannel(n)
	}
	for _, n := range b.nodes {
		b.waitFlannel(n)
	}
}

func (b *flannelBed) startFlannel(n *testbed.Node) {
	// NODE_NAME: flannel's kube subnet manager finds its node by it, where
	// its DaemonSet passes spec.nodeName.
	b.flannel[n.Name] = n.Start("env", "NODE_NAME="+n.Name, b.bins.flanneld, "--kube-subnet-mgr",
		"--kubeconfig-file", b.bed.AdminKubeconfig, "--iface", "eth0", "--ip-masq",
		"--subnet-file", filepath.Join(b.dir, n.Name+".env"),
		"--net-config-path", filepath.Join(b.dir, "net-conf.json"))
}

// waitFlannel waits until flanneld on n routes every other node's pod
// CIDRs over its VXLAN devices and has written its masquerade rules.
func (b *flannelBed) waitFlannel(n *testbed.Node) {
	b.t.Helper()
	b.waitFor(b.flannel[n.Name], "flanneld on "+n.Name, func() string { return b.flannelMissing(n) })
}

// waitFor polls missing, which says what process p (who) has not done yet
// ("" once it has), and fails the test when p exits first or a minute
// passes.
func (b *flannelBed) waitFor(p *testbed.Process, who string, missing func() string) {
	b.t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		what := missing()
		if what == "" {
			return
		}
		select {
		case <-p.Done():
			b.t.Fatalf("%s exited: %v\n%s", who, p.Err(), p.Log())
		default:
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: no %s after a minute\n%s", who, what, p.Log())
		}
	}
}

// flannelMissing says what flanneld on n has not set up yet ("" when all).
func (b *flannelBed) flannelMissing(n *testbed.Node) string {
	ctx := context.Background()
	for _, peer := range b.nodes {
		if peer == n {
			continue
		}
		for i, dev := range vxlanDevices {
			out, _ := n.Exec(ctx, "ip", []string{"-4", "-6"}[i], "route", "show", peer.PodCIDRs[i].String(), "dev", dev)
			if strings.TrimSpace(out) == "" {
				return "route to " + peer.PodCIDRs[i].String() + " over " + dev
			}
		}
	}
	var masq []string
	if b.mode == "nftables" {
		for _, table := range [][2]string{{"ip", "flannel-ipv4"}, {"ip6", "flannel-ipv6"}} {
			out, _ := n.Exec(ctx, "nft", "list", "chain", table[0], table[1], "postrtg")
			masq = append(masq, out)
		}
	} else {
		for _, tool := range []string{"iptables", "ip6tables"} {
			out, _ := n.Exec(ctx, tool, "-t", "nat", "-S", "FLANNEL-POSTRTG")
			masq = append(masq, strings.ToLower(out))
		}
	}
	for i, out := range masq {
		if !strings.Contains(out, "masquerade") {
			return fmt.Sprintf("masquerade rule of family %d", 4+2*i)
		}
	}
	return ""
}

func (b *flannelBed) startProxies() {
	for _, n := range b.nodes {
		b.startProxy(n)
	}
}

// startProxy starts the proxy on n and waits for its first full sync of
// both families.
func (b *flannelBed) startProxy(n *testbed.Node) {
	b.t.Helper()
	args := []string{b.bins.nftproxy}
	if b.proxyIs == "kube-proxy" {
		args = testbed.KubeProxyArgs(b.bins.kubeProxy, "nftables")
	}
	args = append(args, "--kubeconfig", b.bed.ProxyKubeconfig, "--hostname-override", n.Name,
		"--cluster-cidr", clusterCIDRs, "--iptables-min-sync-period", "0s",
		"--metrics-bind-address", "127.0.0.1:10249", "--v", "2")
	p := n.Start(append(args, b.proxyArgs...)...)
	b.proxy[n.Name] = p
	b.waitFor(p, b.proxyIs+" on "+n.Name, func() string {
		if testbed.FullSyncs(n.Netns) {
			return ""
		}
		return "full sync of both families"
	})
}

// createService creates the NodePort Service, dual-stack, with both
// servers as its endpoints, and waits until each node's nftproxy has
// programmed it.
func (b *flannelBed) createService() *v1.Service {
	b.t.Helper()
	ctx := context.Background()
	client := b.bed.Client()
	const ns = "default"
	pol := v1.IPFamilyPolicyRequireDualStack
	svc, err := client.CoreV1().Services(ns).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: ns},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort, IPFamilyPolicy: &pol,
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
			Ports: []v1.ServicePort{{Name: "tcp", Protocol: v1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(backendPort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	for _, fam := range []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6} {
		name, proto, port := "tcp", v1.ProtocolTCP, int32(backendPort)
		es := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "echo-" + strings.ToLower(string(fam)), Namespace: ns,
				Labels: map[string]string{discovery.LabelServiceName: svc.Name}},
			AddressType: fam,
			Ports:       []discovery.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		}
		for _, s := range b.servers {
			addr := s.IPv4
			if fam == discovery.AddressTypeIPv6 {
				addr = s.IPv6
			}
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr.String()}, NodeName: &s.Node.Name})
		}
		if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			b.t.Fatal(err)
		}
	}
	for _, c := range b.clients {
		for _, ip := range svc.Spec.ClusterIPs {
			b.eventually(c.Netns, netip.AddrPortFrom(netip.MustParseAddr(ip), servicePort))
		}
	}
	return svc
}

// eventually dials addr from ns until a server answers, for up to 10 s.
func (b *flannelBed) eventually(ns testbed.Netns, addr netip.AddrPort) {
	b.t.Helper()
	var lines []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if lines = b.dial(ns, addr, 1, 0); len(answers(lines)) == 1 {
			return
		}
	}
	b.t.Fatalf("%s from %s: no answer; last %q", addr, ns.NS, lines)
}

// dial runs `probe dial` over TCP and returns its lines ("SERVER PEER" for
// an answer).
func (b *flannelBed) dial(ns testbed.Netns, addr netip.AddrPort, count int, interval time.Duration) []string {
	b.t.Helper()
	out, err := ns.Exec(context.Background(), b.bins.probe, "dial", "--proto", "tcp", "--addr", addr.String(),
		"--timeout", "1s", "--count", strconv.Itoa(count), "--interval", interval.String())
	if err != nil {
		b.t.Fatalf("dial: %v", err)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

// answer is one answered dial: the server's name and the peer address it
// saw.
type answer struct {
	server string
	peer   netip.Addr
}

// answers returns the answered lines of a dial; the others are failures.
func answers(lines []string) []answer {
	var got []answer
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) != 2 {
			continue
		}
		if ap, err := netip.ParseAddrPort(f[1]); err == nil {
			got = append(got, answer{f[0], ap.Addr().Unmap()})
		}
	}
	return got
}

// checkNeighbours runs the neighbour checks once.
func (b *flannelBed) checkNeighbours(when string) {
	b.t.Helper()
	for i, c := range b.clients {
		for _, ip := range b.svc.Spec.ClusterIPs {
			b.checkPodToClusterIP(when, c, b.servers[1-i], netip.AddrPortFrom(netip.MustParseAddr(ip), servicePort))
		}
	}
	for i, n := range b.nodes {
		for f, addr := range []netip.Addr{n.IPv4, n.IPv6} {
			b.checkNodePortFromOutside(when, n, b.servers[1-i], f, netip.AddrPortFrom(addr, uint16(b.svc.Spec.Ports[0].NodePort)))
		}
	}
	for _, n := range b.nodes {
		if got := neighbourRules(b.t, n); got != b.flannelState[n.Name] {
			b.t.Errorf("%s: the rules on %s other than nftproxy's are not as flannel wrote them:\n--- then\n%s\n--- now\n%s",
				when, n.Name, b.flannelState[n.Name], got)
		}
		if marked := markedPackets(b.t, n); marked != 0 {
			b.t.Errorf("%s: %d packets left %s with the masquerade mark bit set\n%s", when, marked, n.Name,
				n.MustExec(b.t, "nft", "list", "table", "inet", watchTable))
		}
	}
}

// checkPodToClusterIP dials the ClusterIP from client until the server on
// the other node has answered, and wants every answer to have seen the
// client's own address.
func (b *flannelBed) checkPodToClusterIP(when string, client, remote *testbed.Pod, addr netip.AddrPort) {
	b.t.Helper()
	self := client.IPv4
	if addr.Addr().Is6() {
		self = client.IPv6
	}
	got := answers(b.dial(client.Netns, addr, 16, 0))
	sawRemote := false
	for _, a := range got {
		sawRemote = sawRemote || a.server == remote.Name
		if a.peer != self {
			b.t.Errorf("%s: %s → %s answered by %s seen from %s, want the pod's own address %s", when, client.Name, addr,
				a.server, a.peer, self)
		}
	}
	if len(got) != 16 || !sawRemote {
		b.t.Errorf("%s: %s → %s: %d of 16 answered, the other node's %s among them: %v", when, client.Name, addr,
			len(got), remote.Name, sawRemote)
	}
}

// checkNodePortFromOutside dials node n's NodePort from the control
// namespace (outside the cluster) and wants the other node's server to
// have seen n's address on flannel's VXLAN device of the family: one
// masquerade on n, none on the way or on the server's node.
func (b *flannelBed) checkNodePortFromOutside(when string, n *testbed.Node, remote *testbed.Pod, family int, addr netip.AddrPort) {
	b.t.Helper()
	dev := vxlanDevices[family]
	want := deviceAddr(b.t, n, dev)
	got := answers(b.dial(b.bed.Ctl, addr, 16, 0))
	sawRemote := false
	for _, a := range got {
		if a.server != remote.Name {
			continue
		}
		sawRemote = true
		if a.peer != want {
			b.t.Errorf("%s: outside → %s answered by %s on the other node seen from %s, want %s's %s address %s",
				when, addr, a.server, a.peer, n.Name, dev, want)
		}
	}
	if len(got) != 16 || !sawRemote {
		b.t.Errorf("%s: outside → %s: %d of 16 answered, the other node's %s among them: %v", when, addr, len(got),
			remote.Name, sawRemote)
	}
}

// deviceAddr is the address of n's device dev of global scope.
func deviceAddr(t *testing.T, n *testbed.Node, dev string) netip.Addr {
	t.Helper()
	out := n.MustExec(t, "ip", "-o", "addr", "show", "dev", dev, "scope", "global")
	for f := range strings.FieldsSeq(out) {
		if p, err := netip.ParsePrefix(f); err == nil {
			return p.Addr()
		}
	}
	t.Fatalf("%s on %s has no global address:\n%s", dev, n.Name, out)
	return netip.Addr{}
}

// restartUnderTraffic restarts flanneld on both nodes, then the proxy on
// both, while each client dials the ClusterIP of each family; not one
// dial may go unanswered.
func (b *flannelBed) restartUnderTraffic() {
	b.t.Helper()
	const count, interval = 150, 40 * time.Millisecond
	var wg sync.WaitGroup
	results := make([][]string, 0, 4)
	var mu sync.Mutex
	var firstDone time.Time // when the first of the dials ended
	for _, c := range b.clients {
		for _, ip := range b.svc.Spec.ClusterIPs {
			wg.Go(func() {
				lines := b.dial(c.Netns, netip.AddrPortFrom(netip.MustParseAddr(ip), servicePort), count, interval)
				mu.Lock()
				results = append(results, lines)
				if firstDone.IsZero() {
					firstDone = time.Now()
				}
				mu.Unlock()
			})
		}
	}
	time.Sleep(500 * time.Millisecond)
	for _, n := range b.nodes {
		b.flannel[n.Name].Stop(10 * time.Second)
		b.startFlannel(n)
	}
	for _, n := range b.nodes {
		b.waitFlannel(n)
	}
	for _, n := range b.nodes {
		b.proxy[n.Name].Stop(10 * time.Second)
		b.startProxy(n)
	}
	restarted := time.Now()
	wg.Wait()
	if firstDone.Before(restarted) {
		b.t.Errorf("a dial ended %v before the last restart did: the restarts were not all under traffic",
			restarted.Sub(firstDone).Round(time.Millisecond))
	}
	for _, lines := range results {
		if got := answers(lines); len(got) != len(lines) || len(lines) != count {
			b.t.Errorf("under the restarts, %d of %d dials answered:\n%s", len(got), count, strings.Join(lines, "\n"))
		}
	}
}

// markWatch creates the watch table on n: a named counter of the packets
// leaving the node (postrouting, after every other chain) with the
// masquerade mark bit set, and a control: UDP to controlPort is marked
// by the table itself, after the proxies' nat chains (which would clear
// the bit and masquerade it), and counted apart. Its chain foreign is
// empty but in TestFlannelForeignMark; its counter premasq counts the
// packets that reach the nat postrouting chains with the bit.
func markWatch(t *testing.T, n *testbed.Node) {
	t.Helper()
	rules := fmt.Sprintf(`table inet %[1]s {
	counter marked { }
	counter control { }
	counter premasq { }
	chain foreign {
		type filter hook prerouting priority -300; policy accept;
	}
	chain premasq {
		type filter hook postrouting priority 99; policy accept;
		meta mark & 0x4000 == 0x4000 counter name "premasq"
	}
	chain control {
		type filter hook postrouting priority 500; policy accept;
		udp dport %[2]d meta mark set meta mark | 0x4000
	}
	chain post {
		type filter hook postrouting priority 1000; policy accept;
		meta mark & 0x4000 == 0x4000 udp dport %[2]d counter name "control" accept
		meta mark & 0x4000 == 0x4000 counter name "marked"
	}
}
`, watchTable, controlPort)
	path := filepath.Join(t.TempDir(), "watch.nft")
	if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	n.MustExec(t, "nft", "-f", path)
}

var packetsRE = regexp.MustCompile(`packets (\d+)`)

// counterPackets reads a named counter of the watch table on n.
func counterPackets(t *testing.T, n *testbed.Node, name string) int {
	t.Helper()
	out := n.MustExec(t, "nft", "list", "counter", "inet", watchTable, name)
	m := packetsRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("counter %s on %s: %q", name, n.Name, out)
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

// markedPackets returns how many packets left n with the mark bit set,
// after checking with a packet of its own that the count sees them.
func markedPackets(t *testing.T, n *testbed.Node) int {
	t.Helper()
	before := counterPackets(t, n, "control")
	out, err := n.Exec(context.Background(), testbed.ProbePath(t), "dial", "--proto", "udp", "--addr",
		netip.AddrPortFrom(netip.MustParseAddr(testbed.ControlIPv4), controlPort).String(), "--timeout", "100ms")
	if after := counterPackets(t, n, "control"); after <= before {
		t.Fatalf("the watch table on %s did not count a packet it marked itself (%d, then %d; the dial: %q, %v)\n%s",
			n.Name, before, after, out, err, n.MustExec(t, "nft", "list", "ruleset"))
	}
	return counterPackets(t, n, "marked")
}

// tableRE matches the first line of a table in `nft list ruleset`.
var tableRE = regexp.MustCompile(`^table (\S+) (\S+) \{`)

// counterRE matches a rule's counter, whose values traffic changes.
var counterRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// neighbourRules returns the ruleset of n without the proxy's tables and
// the test's own, and without the counters' values: what flannel wrote
// (and the iptables-nft tables its iptables mode writes to).
func neighbourRules(t *testing.T, n *testbed.Node) string {
	t.Helper()
	var keep []string
	skip := false
	for line := range strings.Lines(n.MustExec(t, "nft", "list", "ruleset")) {
		if m := tableRE.FindStringSubmatch(line); m != nil {
			skip = m[2] == "nftproxy" || m[2] == "kube-proxy" || m[2] == watchTable
		}
		if !skip {
			keep = append(keep, counterRE.ReplaceAllString(line, "counter"))
		}
		if line == "}\n" {
			skip = false
		}
	}
	return strings.Join(keep, "")
}
