package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sort"
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

// Helpers of TestDifferential: one bed where node n1 runs nftproxy and node
// n2 runs upstream kube-proxy (nftables mode) on the same API state; every
// probe is run "through n1" and "through n2" and its outcome is normalised
// relative to that node, so the two can be compared.

// diffBed is the differential test bed.
type diffBed struct {
	t      *testing.T
	bed    *testbed.Bed
	client kubernetes.Interface
	probe  string
	ns     string
	sides  [2]*diffSide // n1 (nftproxy), n2 (kube-proxy)
	n3     *testbed.Node
	ext    *testbed.Node
	b3     *testbed.Pod
	podOn  map[string]string // backend pod name → node name

	routeMu    sync.Mutex
	routeLocks map[netip.Addr]*sync.Mutex
}

// diffSide is one proxied node with its pods.
type diffSide struct {
	proxy   string // "nftproxy" or "kube-proxy"
	table   string // the proxy's nftables table name
	node    *testbed.Node
	backend *testbed.Pod // aX: probe server
	client  *testbed.Pod // cX: client only
	proc    *testbed.Process
}

// diffNewBed creates the bed, the nodes (n1, n2, n3, ext) and the pods, and
// starts the probe servers. The proxies are started by diffStartProxies.
func diffNewBed(t *testing.T) *diffBed {
	testbed.RequirePrivileges(t)
	d := &diffBed{t: t, probe: testbed.ProbePath(t), ns: "diff", routeLocks: map[netip.Addr]*sync.Mutex{},
		podOn: map[string]string{}}
	d.bed = testbed.Start(t, testbed.Options{})
	d.client = d.bed.Client()
	if _, err := d.client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: d.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d.sides[0] = &diffSide{proxy: "nftproxy", table: "nftproxy", node: d.bed.AddNode("n1")}
	d.sides[1] = &diffSide{proxy: "kube-proxy", table: "kube-proxy", node: d.bed.AddNode("n2")}
	d.n3 = d.bed.AddNode("n3")
	d.ext = d.bed.AddNode("ext")
	for i, s := range d.sides {
		// ext reaches external and cluster IPs through a node, which then
		// forwards to a remote endpoint out of the interface the packet came
		// in on and so sends ICMP redirects to ext. Redirects reset the
		// per-destination state the kernel rate limits ICMP errors with, so
		// kube-proxy's ICMP rejects towards ext were lost for seconds
		// (IcmpOutRateLimitHost). Nodes on a shared L2 routing for each other
		// have no use for redirects; turn them off on both.
		if _, err := s.node.Exec(context.Background(), "sysctl", "-q", "-w",
			"net.ipv4.conf.all.send_redirects=0", "net.ipv4.conf.eth0.send_redirects=0"); err != nil {
			t.Fatal(err)
		}
		s.backend = d.serve(s.node, fmt.Sprintf("a%d", i+1))
		s.client = s.node.AddPod(fmt.Sprintf("c%d", i+1))
	}
	d.b3 = d.serve(d.n3, "b3")
	return d
}

func (d *diffBed) serve(n *testbed.Node, name string) *testbed.Pod {
	p := n.AddPod(name)
	p.Start(d.probe, "serve", "--name", name, "--port", fmt.Sprint(backendPort), "--tcp", "--udp")
	d.podOn[name] = n.Name
	return p
}

// diffStartProxies starts nftproxy on n1 (newCluster's flags) and upstream
// kube-proxy on n2 with equivalent flags (cmd/bench's, plus the same
// cluster CIDRs, NodePort addresses and min sync period), and waits for
// each one's first sync.
func (d *diffBed) startProxies() {
	t := d.t
	n1, n2 := d.sides[0], d.sides[1]
	nft := testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	kp := filepath.Join(testbed.EnsureBinaries(t), "kube-proxy")
	common := func(n *testbed.Node) []string {
		return []string{"--kubeconfig", d.bed.ProxyKubeconfig, "--hostname-override", n.Name,
			"--cluster-cidr", clusterCIDRs,
			"--iptables-min-sync-period", "0s", "--metrics-bind-address", "127.0.0.1:10249"}
	}
	n1.proc = n1.node.Start(append(append([]string{nft}, common(n1.node)...), "--v", "2")...)
	n2.proc = n2.node.Start(append(append(testbed.KubeProxyArgs(kp, "nftables"), common(n2.node)...), "--v", "2")...)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n1.proc.WaitForLog(ctx, "Synced"); err != nil {
		t.Fatalf("nftproxy on n1: %v", err)
	}
	for {
		if testbed.FullSyncs(n2.node.Netns) {
			return
		}
		select {
		case <-n2.proc.Done():
			t.Fatalf("kube-proxy on n2 exited: %v\n%s", n2.proc.Err(), diffTail(n2.proc.Log(), 30))
		case <-ctx.Done():
			t.Fatalf("kube-proxy on n2: no full sync of both families within 2 minutes\n%s", diffTail(n2.proc.Log(), 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// --- API objects -----------------------------------------------------------

// create makes a selector-less Service with port "tcp" 80/TCP (and "udp"
// 80/UDP if udp), after mutate, and returns what the API server made of it.
func (d *diffBed) create(name string, typ v1.ServiceType, dual, udp bool, mutate func(*v1.Service)) *v1.Service {
	d.t.Helper()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.ns},
		Spec: v1.ServiceSpec{Type: typ, Ports: []v1.ServicePort{{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP}}}}
	if udp {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: "udp", Port: 80, Protocol: v1.ProtocolUDP})
	}
	return createService(d.t, d.client, svc, dual, mutate)
}

// slices writes one EndpointSlice per family of the Service: the pods (ready,
// with nodeName) on backendPort for every port of the Service. No pods: an
// empty slice, as the EndpointSlice controller writes it.
func (d *diffBed) slices(svc *v1.Service, pods ...*testbed.Pod) {
	d.t.Helper()
	for _, fam := range svc.Spec.IPFamilies {
		at := discovery.AddressTypeIPv4
		if fam == v1.IPv6Protocol {
			at = discovery.AddressTypeIPv6
		}
		es := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: svc.Name + "-" + strings.ToLower(string(at)), Namespace: d.ns,
				Labels: map[string]string{discovery.LabelServiceName: svc.Name}},
			AddressType: at,
		}
		for _, sp := range svc.Spec.Ports {
			name, proto, port := sp.Name, sp.Protocol, int32(backendPort)
			es.Ports = append(es.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		for _, p := range pods {
			addr, node, ready := p.IPv4.String(), p.Node.Name, true
			if at == discovery.AddressTypeIPv6 {
				addr = p.IPv6.String()
			}
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}, NodeName: &node,
				Conditions: discovery.EndpointConditions{Ready: &ready}})
		}
		if _, err := d.client.DiscoveryV1().EndpointSlices(d.ns).Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
			d.t.Fatalf("create EndpointSlice %s: %v", es.Name, err)
		}
	}
}

// setIngress writes status.loadBalancer.ingress, as a cloud controller would.
func (d *diffBed) setIngress(svc *v1.Service, ip netip.Addr) *v1.Service {
	d.t.Helper()
	svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip.String()}}
	got, err := d.client.CoreV1().Services(d.ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{})
	if err != nil {
		d.t.Fatalf("update status of service %s: %v", svc.Name, err)
	}
	return got
}

func diffClusterIP(svc *v1.Service, fam v1.IPFamily) netip.Addr {
	for _, s := range svc.Spec.ClusterIPs {
		if a := netip.MustParseAddr(s); a.Is6() == (fam == v1.IPv6Protocol) {
			return a
		}
	}
	panic(fmt.Sprintf("service %s has no %s ClusterIP", svc.Name, fam))
}

func diffNodePort(svc *v1.Service, proto v1.Protocol) uint16 {
	for _, p := range svc.Spec.Ports {
		if p.Protocol == proto && p.NodePort != 0 {
			return uint16(p.NodePort)
		}
	}
	panic(fmt.Sprintf("service %s has no %s nodePort", svc.Name, proto))
}

// --- probes ----------------------------------------------------------------

// diffRow is one probe kind, run once through each node.
type diffRow struct {
	what   string // the Service feature and destination
	from   string // "pod" (cX), "node" (nX), "ext" (the outside node), "self" (backend aX)
	proto  string // "tcp", "udp" or "http" (GET, status and health JSON compared)
	target func(s *diffSide) netip.AddrPort
	route  bool // from ext: `ip route replace <ip> via <nX>` first (external, LB, cluster IPs)
	sticky bool // session affinity: one backend for every attempt, whichever
}

func (r diffRow) key() string { return r.what + " " + r.proto + " from " + r.from }

// fromNS returns the namespace to dial from and the client's own address in
// the family of dst.
func (d *diffBed) fromNS(s *diffSide, from string, dst netip.Addr) (testbed.Netns, netip.Addr) {
	pick := func(v4, v6 netip.Addr) netip.Addr {
		if dst.Is6() {
			return v6
		}
		return v4
	}
	switch from {
	case "pod":
		return s.client.Netns, pick(s.client.IPv4, s.client.IPv6)
	case "node":
		return s.node.Netns, pick(s.node.IPv4, s.node.IPv6)
	case "ext":
		return d.ext.Netns, pick(d.ext.IPv4, d.ext.IPv6)
	case "self":
		return s.backend.Netns, pick(s.backend.IPv4, s.backend.IPv6)
	}
	panic("unknown client kind " + from)
}

// routeLock serialises probes from ext that need a route for dst via one node.
func (d *diffBed) routeLock(dst netip.Addr) *sync.Mutex {
	d.routeMu.Lock()
	defer d.routeMu.Unlock()
	if d.routeLocks[dst] == nil {
		d.routeLocks[dst] = &sync.Mutex{}
	}
	return d.routeLocks[dst]
}

// diffOutcome is what one probe through one node gave.
type diffOutcome struct {
	norm string   // normalised, comparable across nodes
	raw  []string // the probe's lines
}

// measure runs row through side s: one attempt, and when a backend answered,
// 11 more (enough to see both of two random endpoints, or to prove
// stickiness). A probe that only fails is judged on its one attempt, which
// keeps ICMP rate limits and timeouts cheap.
func (d *diffBed) measure(row diffRow, s *diffSide) diffOutcome {
	dst := row.target(s)
	ns, self := d.fromNS(s, row.from, dst.Addr())
	if row.route {
		mu := d.routeLock(dst.Addr())
		mu.Lock()
		defer mu.Unlock()
		gw := s.node.IPv4
		if dst.Addr().Is6() {
			gw = s.node.IPv6
		}
		if _, err := d.ext.Exec(context.Background(), "ip", "route", "replace",
			netip.PrefixFrom(dst.Addr(), dst.Addr().BitLen()).String(), "via", gw.String()); err != nil {
			return diffOutcome{norm: "error: " + err.Error()}
		}
	}
	if row.proto == "http" {
		return d.httpOutcome(ns, dst)
	}
	lines := d.dial(ns, row.proto, dst, 1)
	if len(answeredBy(lines)) > 0 {
		lines = append(lines, d.dial(ns, row.proto, dst, 11)...)
	}
	return diffOutcome{norm: d.normalise(s, row, self, lines), raw: lines}
}

func (d *diffBed) dial(ns testbed.Netns, proto string, dst netip.AddrPort, count int) []string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count)*5*time.Second+30*time.Second)
	defer cancel()
	out, err := ns.Exec(ctx, d.probe, "dial", "--proto", proto, "--addr", dst.String(),
		"--timeout", "2s", "--count", fmt.Sprint(count))
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

// normalise turns probe lines into a set of words relative to the node s:
// each answer as BACKEND/SOURCE, with BACKEND "self" (the client itself),
// "local" (a pod on s), "remote" (the pod on the other proxied node) or "n3",
// and SOURCE "client" (the backend saw the client's own address), "node"
// (s's address) or "other"; each failure as its word (refused, timeout, ...).
// Failures made of refusals and timeouts count as "refused": no DROP rule
// ever refuses, while the kernel rate limits the ICMP errors a REJECT sends
// (README: "TCP is refused with a reset").
func (d *diffBed) normalise(s *diffSide, row diffRow, self netip.Addr, lines []string) string {
	set := map[string]bool{}
	backends := map[string]bool{}
	answers := 0
	for _, l := range lines {
		f := strings.Fields(l)
		var peer netip.AddrPort
		var err error
		if len(f) == 2 {
			peer, err = netip.ParseAddrPort(f[1])
		}
		if len(f) != 2 || err != nil {
			if strings.HasPrefix(l, "error") { // keep the reason, not the addresses
				l = "error: " + l[strings.LastIndex(l, ": ")+2:]
			}
			set[l] = true
			continue
		}
		answers++
		backend := "remote"
		switch {
		case row.from == "self" && f[0] == s.backend.Name:
			backend = "self"
		case d.podOn[f[0]] == s.node.Name:
			backend = "local"
		case d.podOn[f[0]] == "n3":
			backend = "n3"
		case d.podOn[f[0]] == "":
			backend = "unknown(" + f[0] + ")"
		}
		src := "other"
		switch peer.Addr().Unmap() {
		case self:
			src = "client"
		case s.node.IPv4, s.node.IPv6:
			src = "node"
		}
		backends[backend] = true
		set[backend+"/"+src] = true
	}
	if answers == 0 && set["refused"] && set["timeout"] {
		delete(set, "timeout")
	}
	if row.sticky && answers > 0 {
		for k := range set {
			if i := strings.Index(k, "/"); i > 0 {
				delete(set, k)
				if len(backends) == 1 {
					set["sticky/"+k[i+1:]] = true
				} else {
					set["NOT-sticky/"+k[i+1:]] = true
				}
			}
		}
	}
	var words []string
	for k := range set {
		words = append(words, k)
	}
	sort.Strings(words)
	return strings.Join(words, "+")
}

// httpOutcome GETs http://dst/ (a health check node port or the proxy's
// healthz) and keeps the status code and the JSON fields that do not carry
// times.
func (d *diffBed) httpOutcome(ns testbed.Netns, dst netip.AddrPort) diffOutcome {
	path := "/"
	if dst.Port() == 10256 {
		path = "/healthz"
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return ns.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
	resp, err := hc.Get("http://" + dst.String() + path)
	if err != nil {
		return diffOutcome{norm: "error", raw: []string{err.Error()}}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		return diffOutcome{norm: fmt.Sprintf("%d non-JSON", resp.StatusCode), raw: []string{string(body)}}
	}
	diffUntime(m)
	var keys []string
	for k, v := range m {
		b, _ := json.Marshal(v) // maps marshal with sorted keys
		keys = append(keys, k+"="+string(b))
	}
	sort.Strings(keys)
	return diffOutcome{norm: fmt.Sprintf("%d %s", resp.StatusCode, strings.Join(keys, " ")), raw: []string{string(body)}}
}

// diffUntime replaces the values of time fields (lastUpdated, currentTime)
// anywhere in a decoded JSON object by "T": they differ between any two
// proxies.
func diffUntime(m map[string]any) {
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			diffUntime(v)
		case string:
			if k == "lastUpdated" || k == "currentTime" {
				m[k] = "T"
			}
		}
	}
}

// --- comparison ------------------------------------------------------------

// diffKnown is a documented deliberate difference: the outcome through the
// nftproxy node and through the kube-proxy node for one probe.
type diffKnown struct {
	key, nftproxy, upstream, reason string
}

// diffResult is one row of the comparison.
type diffResult struct {
	row      diffRow
	out      [2]diffOutcome
	verdict  string // "same", "deliberate", "DIFF"
	known    *diffKnown
	attempts int
	earlier  []string // outcomes of the runs before the last, "n1 | n2"
}

// compare runs a row through both nodes until the outcomes agree (or match
// a deliberate difference), at most 5 times 2 s apart: a single run may
// miss one of two random backends, or meet an ICMP rate limit or a slow
// machine.
func (d *diffBed) compare(row diffRow, known map[string]*diffKnown) diffResult {
	r := diffResult{row: row, known: known[row.key()]}
	for r.attempts = 1; ; r.attempts++ {
		var wg sync.WaitGroup
		for i, s := range d.sides {
			wg.Add(1)
			go func() { defer wg.Done(); r.out[i] = d.measure(row, s) }()
		}
		wg.Wait()
		switch {
		case r.known != nil && r.out[0].norm == r.known.nftproxy && r.out[1].norm == r.known.upstream:
			r.verdict = "deliberate"
			return r
		case r.known == nil && r.out[0].norm == r.out[1].norm:
			r.verdict = "same"
			return r
		case r.attempts == 5:
			r.verdict = "DIFF"
			return r
		}
		r.earlier = append(r.earlier, r.out[0].norm+" ["+summarize(r.out[0].raw)+"] | "+r.out[1].norm+" ["+summarize(r.out[1].raw)+"]")
		time.Sleep(2 * time.Second)
	}
}

// compareAll runs every row, a few at a time.
func (d *diffBed) compareAll(rows []diffRow, known []diffKnown) []diffResult {
	byKey := map[string]*diffKnown{}
	for i := range known {
		byKey[known[i].key] = &known[i]
	}
	results := make([]diffResult, len(rows))
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for i, row := range rows {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = d.compare(row, byKey)
		}()
	}
	wg.Wait()
	return results
}

// ruleset lists a proxy's table of one family on its node.
func (d *diffBed) ruleset(s *diffSide, fam string) string {
	out, err := s.node.Exec(context.Background(), "nft", "list", "table", fam, s.table)
	if err != nil {
		return err.Error()
	}
	return out
}

func diffTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
