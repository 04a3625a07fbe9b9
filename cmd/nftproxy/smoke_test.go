package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
)

// smokeProxyArgs are the flags of the smoke tests' proxy, kube-proxy's as
// a DaemonSet gives them; localhost NodePorts are proxied in userspace
// (the gate and "localhost"). Each test adds its own.
var smokeProxyArgs = []string{
	"--hostname-override=smoke-node",
	"--cluster-cidr=10.244.0.0/16,fd00:244::/32",
	"--nodeport-addresses=primary,localhost",
	"--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true",
	"--v=2",
}

// The addresses the smoke tests connect to (testdata/smoke/cluster.yaml).
var (
	webTCP      = netip.MustParseAddrPort("10.96.0.10:80")
	webTCP6     = netip.MustParseAddrPort("[fd00:96::10]:80")
	webUDP      = netip.MustParseAddrPort("10.96.0.10:53")
	webSCTP     = netip.MustParseAddrPort("10.96.0.10:132")
	localTCP    = netip.MustParseAddrPort("10.96.0.11:80")
	stickyTCP   = netip.MustParseAddrPort("10.96.0.13:80")
	emptyTCP    = netip.MustParseAddrPort("10.96.0.14:80")
	emptyUDP    = netip.MustParseAddrPort("10.96.0.14:53")
	changingTCP = netip.MustParseAddrPort("10.96.0.15:80")
	changingUDP = netip.MustParseAddrPort("10.96.0.15:53")
	internalTCP = netip.MustParseAddrPort("10.96.0.17:80")
	metricsAddr = netip.MustParseAddrPort("127.0.0.1:10249")
	healthzAddr = netip.MustParseAddrPort("127.0.0.1:10256")
)

// allEndpoints are web's and sticky's endpoint pods.
var allEndpoints = []string{"ep-a", "ep-b", "ep-c", "ep-d"}

// startSmokeProxy starts the proxy on the recorded API and waits for its
// first sync: web's ClusterIP answering and /healthz saying 200.
func (c *smokeCluster) startSmokeProxy(t *testing.T, extraArgs ...string) *smokeProxy {
	t.Helper()
	start := time.Now()
	proxy := c.startProxy(t, loadSmokeAPI(t), append(append([]string(nil), smokeProxyArgs...), extraArgs...)...)
	// /healthz first: a connection attempt before the rules are there
	// would wait for its SYN to be sent again.
	eventually(t, "the proxy's first sync (/healthz 200)", func() (bool, string) {
		proxy.alive(t)
		code, body, err := httpGet(t, c.node.ns, healthzAddr, "/healthz")
		return err == nil && code == 200, fmt.Sprintf("/healthz: %d %s %v", code, body, err)
	})
	eventually(t, "web's ClusterIP answering", func() (bool, string) {
		_, err := askTCP(t, c.client.ns, webTCP)()
		return err == nil, fmt.Sprint(err)
	})
	t.Logf("the proxy's start and first sync: %v", time.Since(start).Round(time.Millisecond))
	return proxy
}

// TestSmoke runs nftproxy as shipped (main's entry, flags, both
// families' netlink backends, the change monitor, the readers gate,
// conntrack cleanup, health servers, the localhost NodePort proxy) in a
// node's network namespace, on a fake API holding a recorded cluster
// (testdata/smoke/cluster.yaml), and sends real traffic through the rules
// it programs: every kind of Service there answers as it should, a change
// of the API and a table tampered with reach the data path, and the
// node's nft lists, prints as JSON, reloads and monitors the ruleset.
func TestSmoke(t *testing.T) {
	start := time.Now()
	c := newSmokeCluster(t)
	c.startEndpoints(t)
	t.Logf("namespaces, links and endpoint servers: %v", time.Since(start).Round(time.Millisecond))
	// Not owned, the table can be changed by nft: the tampering checks.
	proxy := c.startSmokeProxy(t, "--own-tables=false")
	client, remote, node := c.client.ns, c.remote.ns, c.node.ns
	nodePort := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(c.node.ipv4, port) }

	t.Run("ClusterIP", func(t *testing.T) {
		seen := answered(t, "TCP to web's ClusterIP", 64, sawClient(t, askTCP(t, client, webTCP), c.client.ipv4), allEndpoints...)
		t.Logf("TCP: %v", seen)
		answered(t, "TCP to web's IPv6 ClusterIP", 64, sawClient(t, askTCP(t, client, webTCP6), c.client.ipv6), "ep-a", "ep-c")
		answered(t, "UDP to web's ClusterIP", 64, sawClient(t, askUDP(t, client, webUDP), c.client.ipv4), allEndpoints...)
	})
	t.Run("SCTP", func(t *testing.T) {
		if ok, why := sctpSupported(); !ok {
			t.Skipf("this kernel has no SCTP sockets: %s", why)
		}
		answered(t, "SCTP to web's ClusterIP", 64, sawClient(t, askSCTP(t, client, webSCTP), c.client.ipv4), allEndpoints...)
		answered(t, "SCTP to web's NodePort", 64, askSCTP(t, remote, nodePort(30132)), allEndpoints...)
	})
	t.Run("NodePort", func(t *testing.T) {
		answered(t, "TCP to web's NodePort from smoke-remote", 64, askTCP(t, remote, nodePort(30080)), allEndpoints...)
		answered(t, "UDP to web's NodePort from smoke-remote", 64, askUDP(t, remote, nodePort(30053)), allEndpoints...)
		// KubeProxyNFTablesLocalhostNodePorts with "localhost": proxied
		// in userspace by the proxy process.
		answeredBy(t, "TCP to web's NodePort on 127.0.0.1 from the node", 4,
			askTCP(t, node, netip.MustParseAddrPort("127.0.0.1:30080")), allEndpoints...)
		answered(t, "TCP to lb's ingress IP from smoke-remote (in its source ranges)", 64,
			askTCP(t, remote, netip.AddrPortFrom(lbIngressIP, 80)), "ep-a", "ep-d")
	})
	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) {
		answeredBy(t, "TCP to local's NodePort from smoke-remote", 16,
			sawClient(t, askTCP(t, remote, nodePort(30081)), c.remote.ipv4), "ep-b")
		answered(t, "TCP to local's ClusterIP from a pod", 64, askTCP(t, client, localTCP), "ep-b", "ep-c")
		healthCheck(t, remote, nodePort(32081), 200, 1)
		healthCheck(t, remote, nodePort(32082), 503, 0)
	})
	t.Run("InternalTrafficPolicyLocal", func(t *testing.T) {
		answeredBy(t, "TCP to internal's ClusterIP from a pod", 16, askTCP(t, client, internalTCP), "ep-b")
	})
	t.Run("SessionAffinity", func(t *testing.T) {
		seen := answeredBy(t, "TCP to sticky's ClusterIP", 12, askTCP(t, client, stickyTCP), allEndpoints...)
		if len(seen) != 1 {
			t.Errorf("sticky: answered by %v, want one pod for every connection of one client", seen)
		}
	})
	t.Run("NoEndpoints", func(t *testing.T) {
		refused(t, "TCP to empty's ClusterIP", askTCP(t, client, emptyTCP))
		refused(t, "UDP to empty's ClusterIP", askUDP(t, client, emptyUDP))
	})
	t.Run("APIChange", func(t *testing.T) {
		testAPIChange(t, c, proxy, "ep-d")
	})
	t.Run("Tampering", func(t *testing.T) {
		testTampering(t, c, proxy)
	})
	t.Run("nft", func(t *testing.T) {
		testNftReadsRuleset(t, node)
	})
	t.Logf("TestSmoke: %v", time.Since(start).Round(time.Millisecond))
}

// healthCheck fails the test unless the health check node port at addr
// answers status with localEndpoints endpoints, as upstream's does.
func healthCheck(t *testing.T, ns *netns.NS, addr netip.AddrPort, status, localEndpoints int) {
	t.Helper()
	code, body, err := httpGet(t, ns, addr, "/")
	if err != nil {
		t.Fatalf("health check node port %v: %v", addr, err)
	}
	var r struct {
		LocalEndpoints      int  `json:"localEndpoints"`
		ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || code != status || r.LocalEndpoints != localEndpoints || !r.ServiceProxyHealthy {
		t.Errorf("health check node port %v: %d %s (%v), want %d with localEndpoints %d and serviceProxyHealthy",
			addr, code, body, err, status, localEndpoints)
	}
}

// testAPIChange moves Service changing's one endpoint from ep-a to pod
// to through the fake API, and checks that new TCP connections and an
// existing UDP flow (its conntrack entry deleted by the proxy) reach the
// new endpoint, and that nft monitor saw the change.
func testAPIChange(t *testing.T, c *smokeCluster, proxy *smokeProxy, to string) {
	client := c.client.ns
	answeredBy(t, "TCP to changing's ClusterIP before the change", 2, askTCP(t, client, changingTCP), "ep-a")
	udp := dialUDP(t, client, changingUDP)
	defer udp.Close()
	if r, err := askOn(udp); err != nil || r.pod != "ep-a" {
		t.Fatalf("UDP to changing's ClusterIP before the change: %v %v, want ep-a", r, err)
	}
	monitor := startMonitor(t, c.node.ns)
	start := time.Now()
	proxy.update(t, withEndpoints(proxy.api.slice(t, "changing-v4"), c.pods[to]))
	eventually(t, "TCP to changing's ClusterIP answered by "+to, func() (bool, string) {
		proxy.alive(t)
		r, err := askTCP(t, client, changingTCP)()
		return err == nil && r.pod == to, fmt.Sprint(r, err)
	})
	t.Logf("an EndpointSlice updated in the API → TCP answered by the new endpoint: %v", time.Since(start).Round(time.Millisecond))
	eventually(t, "the UDP flow to changing's ClusterIP answered by "+to+" (the flow to ep-a deleted)", func() (bool, string) {
		r, err := askOn(udp)
		if err == nil && r.pod == to {
			return true, ""
		}
		out, _ := c.node.ns.Run("", "conntrack", "-L", "-p", "udp", "--orig-dst", changingUDP.Addr().String())
		return false, fmt.Sprintf("%v %v; conntrack -L: %s", r, err, out)
	})
	answeredBy(t, "a new UDP flow to changing's ClusterIP", 2, askUDP(t, client, changingUDP), to)
	t.Run("monitor", func(t *testing.T) { monitor.shows(t, c.pods[to].ipv4.String()) })
}

// smokeMonitor is `nft monitor` running in a namespace.
type smokeMonitor struct {
	ns     *netns.NS
	cmd    *exec.Cmd
	output *syncBuffer
	exited chan struct{} // closed once nft monitor exited
}

// shows waits until nft monitor has printed text. If nft monitor
// aborted, on an nft that cannot read counted elements in a map's
// declaration (Debian 11's 0.9.8 aborts on the elements of the maps that
// --service-traffic-metrics counts), the test is skipped, naming that
// nft; otherwise it fails.
func (m *smokeMonitor) shows(t *testing.T, text string) {
	t.Helper()
	eventually(t, "nft monitor showing "+text, func() (bool, string) {
		out := m.output.String()
		if strings.Contains(out, text) {
			return true, ""
		}
		select {
		case <-m.exited:
			if lacks := nftLacksCounterInMap(m.ns); lacks != "" {
				t.Skipf("nft monitor exited: %s, which the maps of --service-traffic-metrics use (%s)", lacks, lastLines(out, 1))
			}
			t.Fatalf("nft monitor exited (%v):\n%s", m.cmd.ProcessState, lastLines(out, 20))
		default:
		}
		return false, lastLines(out, 20)
	})
}

// startMonitor starts nft monitor in ns and returns once it prints
// changes (a table of its own added and deleted); it is stopped when the
// test ends.
func startMonitor(t *testing.T, ns *netns.NS) *smokeMonitor {
	t.Helper()
	m := &smokeMonitor{ns: ns, output: &syncBuffer{}, exited: make(chan struct{})}
	m.cmd = exec.Command("ip", "netns", "exec", ns.Name, "nft", "monitor")
	m.cmd.Stdout, m.cmd.Stderr = m.output, m.output
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := m.cmd.Start(); err != nil {
		t.Fatalf("nft monitor: %v", err)
	}
	go func() {
		m.cmd.Wait()
		close(m.exited)
	}()
	t.Cleanup(func() {
		m.cmd.Process.Kill()
		<-m.exited
		if t.Failed() {
			t.Logf("nft monitor's output (last 40 lines):\n%s", lastLines(m.output.String(), 40))
		}
	})
	const probe = "smoke-monitor-probe"
	eventually(t, "nft monitor to show a table added", func() (bool, string) {
		if _, err := ns.Run("add table ip "+probe+"\ndelete table ip "+probe+"\n", "nft", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		out := m.output.String()
		return strings.Contains(out, probe), out
	})
	return m
}

// testTampering deletes an element of the proxy's table, then the whole
// table, with nft, and checks that the proxy repairs each at once
// (nftproxy_repairs_total counts it: the monitor heard of it) and that
// traffic flows again.
func testTampering(t *testing.T, c *smokeCluster, proxy *smokeProxy) {
	node := c.node.ns
	for _, tc := range []struct {
		kind, nft, listing, want string
	}{
		{"element", "delete element ip nftproxy service-ips { 10.96.0.10 . tcp . 80 }", "list map ip nftproxy service-ips", "10.96.0.10 . tcp . 80 "},
		{"table", "delete table ip nftproxy", "list table ip nftproxy", "10.96.0.10 . tcp . 80 "},
	} {
		series := map[string]string{"ip_family": "IPv4", "kind": tc.kind}
		before := scrape(t, node).sum("nftproxy_repairs_total", series)
		start := time.Now()
		if _, err := node.Run("", strings.Fields("nft "+tc.nft)...); err != nil {
			t.Fatalf("tampering: %v", err)
		}
		eventually(t, "the proxy to repair "+tc.nft, func() (bool, string) {
			proxy.alive(t)
			repairs := scrape(t, node).sum("nftproxy_repairs_total", series)
			out, err := node.Run("", strings.Fields("nft "+tc.listing)...)
			return repairs > before && err == nil && strings.Contains(out, tc.want),
				fmt.Sprintf("repairs %v (before %v); nft %s: %v", repairs, before, tc.listing, err)
		})
		t.Logf("%s: repaired in %v", tc.nft, time.Since(start).Round(time.Millisecond))
		answered(t, "TCP to web's ClusterIP after "+tc.nft, 64, askTCP(t, c.client.ns, webTCP), allEndpoints...)
		answeredBy(t, "UDP to web's ClusterIP after "+tc.nft, 2, askUDP(t, c.client.ns, webUDP), allEndpoints...)
	}
}

// testNftReadsRuleset checks that the node's nft lists the ruleset, prints
// it as valid JSON, and that the listing loads into a fresh namespace.
func testNftReadsRuleset(t *testing.T, node *netns.NS) {
	listing, err := node.Run("", "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset: %v", err)
	}
	for _, want := range []string{"table ip nftproxy {", "table ip6 nftproxy {", "10.96.0.10 . tcp . 80 "} {
		if !strings.Contains(listing, want) {
			t.Errorf("nft list ruleset lacks %q:\n%s", want, listing)
		}
	}
	js, err := node.Run("", "nft", "-j", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft -j list ruleset: %v", err)
	}
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal([]byte(js), &doc); err != nil {
		t.Fatalf("nft -j list ruleset: not JSON: %v\n%s", err, lastLines(js, 20))
	}
	tables := 0
	for _, o := range doc.Nftables {
		var table struct{ Name string }
		if raw, ok := o["table"]; ok && json.Unmarshal(raw, &table) == nil && table.Name == "nftproxy" {
			tables++
		}
	}
	if tables != 2 {
		t.Errorf("nft -j list ruleset: %d tables named nftproxy, want 2", tables)
	}
	// A reload on top of the live table is not expected to work (the pick
	// maps); into a fresh namespace it must. An owned table's flag is
	// dropped: the fresh table would be owned by nft's socket, gone at once.
	fresh := netns.New(t, "nftproxy-smokereload", "nft")
	reload := regexp.MustCompile(`(?m)^\s*flags owner.*\n`).ReplaceAllString(listing, "")
	if _, err := fresh.Run(reload, "nft", "-f", "-"); err != nil {
		if lacks := nftLacksNumgenInConcat(fresh); lacks != "" {
			t.Skipf("nft -f of the listing into a fresh namespace: %s, which nftproxy's pick maps use (%s)", lacks, firstLine(err.Error()))
		}
		t.Fatalf("nft -f of the listing into a fresh namespace: %v", err)
	}
	again, err := fresh.Run("", "nft", "list", "map", "ip", "nftproxy", "service-ips")
	if err != nil || !strings.Contains(again, "10.96.0.10 . tcp . 80 ") {
		t.Errorf("the reloaded table: %v\n%s", err, again)
	}
}

// nftLacksCounterInMap says, when the nft on the PATH cannot read a
// map declared with counters on its elements (Debian 11's 0.9.8), which
// nft lacks it; "" when it can.
func nftLacksCounterInMap(ns *netns.NS) string {
	const counted = "table ip t {\n\tmap m {\n\t\ttype ipv4_addr : verdict\n\t\tcounter\n\t}\n}\n"
	return nftLacks(ns, counted, "counter in a map's declaration")
}

// nftLacks is "<nft's version> cannot read <feature>" when the nft on the
// PATH refuses ruleset (nft -c -f, nothing committed), "" when it reads
// it.
func nftLacks(ns *netns.NS, ruleset, feature string) string {
	if _, err := ns.Run(ruleset, "nft", "-c", "-f", "-"); err == nil {
		return ""
	}
	version, _ := ns.Run("", "nft", "--version")
	return strings.TrimSpace(version) + " cannot read " + feature
}

// nftLacksNumgenInConcat says, when the nft on the PATH cannot read a
// map keyed by a concatenation that ends in a numgen expression (Debian
// 11's 0.9.8 cannot: it lists such a map but cannot load its listing),
// which nft lacks it; "" when it can.
func nftLacksNumgenInConcat(ns *netns.NS) string {
	const pick = "table ip t {\n\tmap m {\n\t\ttypeof ip daddr . tcp dport . numgen random mod 2 : ip daddr . tcp dport\n\t}\n}\n"
	return nftLacks(ns, pick, "a numgen expression in a concatenation")
}

// metricsScrape is the text of one scrape of the proxy's /metrics.
type metricsScrape string

// scrape reads the proxy's /metrics from inside the node's namespace.
func scrape(t *testing.T, node *netns.NS) metricsScrape {
	t.Helper()
	code, body, err := httpGet(t, node, metricsAddr, "/metrics")
	if err != nil || code != 200 {
		t.Fatalf("GET /metrics: %d %v", code, err)
	}
	return metricsScrape(body)
}

// sum is the sum of the series of metric name whose labels include
// labels, and -1 when there is none.
func (s metricsScrape) sum(name string, labels map[string]string) float64 {
	total, found := 0.0, false
	for _, line := range strings.Split(string(s), "\n") {
		i := strings.LastIndexByte(line, ' ')
		if i < 0 || strings.HasPrefix(line, "#") {
			continue
		}
		series, value := line[:i], line[i+1:]
		metric, labelText, _ := strings.Cut(strings.TrimSuffix(series, "}"), "{")
		if metric != name {
			continue
		}
		matches := true
		for k, v := range labels {
			matches = matches && strings.Contains(","+labelText+",", ","+k+"="+strconv.Quote(v)+",")
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(value), 64); matches && err == nil {
			total, found = total+f, true
		}
	}
	if !found {
		return -1
	}
	return total
}
