package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/nft/nftnl"
)

// TestServiceTrafficMetrics: n1's proxy, restarted with
// --service-traffic-metrics=endpoints over the table it wrote without,
// counts on /metrics exactly the connections a client pod on n1 opened
// through a Service's ClusterIP and through its NodePort on n1 (every one
// answered: a retried SYN would be counted again), and the Service's
// endpoint series sum to all of them; the Service's packets and bytes are
// exactly what conntrack's accounting counted for those connections, both
// ways. n2's proxy, without the flag, serves no traffic series.
func TestServiceTrafficMetrics(t *testing.T) {
	c := newCluster(t)
	n1, n2 := c.nodes[0], c.nodes[1]
	a, b := c.backend(0, "a"), c.backend(1, "b")
	client := n1.AddPod("client")
	vipAddr, nodePort := c.ctNodePortService("web", 80, v1.ProtocolTCP)
	c.endpoints("web", backendPort, a, b)
	cluster := netip.AddrPortFrom(vipAddr, 80)
	np := netip.AddrPortFrom(n1.IPv4, uint16(nodePort))
	c.eventually(client.Netns, "tcp", cluster, 20, "a and b", onlyFrom("a", "b"))

	c.restartProxy(n1, withArgs(c.args[n1.Name], "--service-traffic-metrics=endpoints"))
	// Syncs after the restart rewrite no element: the counters keep counting.
	c.eventually(client.Netns, "tcp", cluster, 20, "a and b", onlyFrom("a", "b"))
	c.eventually(client.Netns, "tcp", np, 20, "a and b", onlyFrom("a", "b"))

	series := func(frontend string) string {
		return fmt.Sprintf(`nftproxy_service_new_connections_total{frontend=%q,namespace=%q,port="tcp",protocol="tcp",service="web"}`, frontend, c.ns)
	}
	before := scrapeMetrics(t, n1)
	const viaClusterIP, viaNodePort = 37, 23
	for _, d := range []struct {
		addr netip.AddrPort
		n    int
	}{{cluster, viaClusterIP}, {np, viaNodePort}} {
		if lines := c.dial(client.Netns, "tcp", d.addr, d.n); !onlyFrom("a", "b")(lines) {
			t.Fatalf("%d connections to %s: %s, want every one answered by a or b", d.n, d.addr, summarize(lines))
		}
	}
	after := scrapeMetrics(t, n1)
	for s, want := range map[string]float64{series("cluster-ip"): viaClusterIP, series("node-port"): viaNodePort} {
		if got := after[s] - before[s]; got != want {
			t.Errorf("%s grew by %v, want %v", s, got, want)
		}
	}
	endpoints := func(m map[string]float64) (sum float64, n int) {
		for s, v := range m {
			if strings.HasPrefix(s, "nftproxy_endpoint_new_connections_total{") && strings.Contains(s, `service="web"`) {
				sum, n = sum+v, n+1
			}
		}
		return sum, n
	}
	sumBefore, _ := endpoints(before)
	sumAfter, n := endpoints(after)
	if got := sumAfter - sumBefore; got != viaClusterIP+viaNodePort || n != 2 {
		t.Errorf("the endpoint series of web (%d of them) grew by %v, want 2 growing by %d", n, got, viaClusterIP+viaNodePort)
	}
	for s := range after {
		if strings.HasPrefix(s, "nftproxy_service_") || strings.HasPrefix(s, "nftproxy_endpoint_new_connections_total") {
			t.Logf("%s %v", s, after[s])
		}
	}
	trafficMatchesConntrack(t, c, n1, client.Netns, cluster, np)

	for s := range scrapeMetrics(t, n2) {
		if strings.Contains(s, "new_connections_total") || strings.Contains(s, "nftproxy_service_packets_total") {
			t.Errorf("n2, without the flag, serves %s", s)
		}
	}
}

// trafficMatchesConntrack checks that the packets and bytes n1's proxy
// counts for web through its ClusterIP and NodePort grow by exactly what
// conntrack's accounting counts, both ways, for a batch of new
// connections from client. A client port used again while conntrack still
// holds its earlier flow in TIME_WAIT (the server closed first) replaces
// that flow and its counts: a batch that lost a flow so is measured
// again.
func trafficMatchesConntrack(t *testing.T, c *cluster, n1 *testbed.Node, client testbed.Netns, cluster, np netip.AddrPort) {
	if _, err := n1.Exec(context.Background(), "sysctl", "-qw", "net.netfilter.nf_conntrack_acct=1"); err != nil {
		t.Fatal(err)
	}
	ours := func(f ctFlow) bool {
		return (f.origDst == cluster.Addr().String() && f.origDport == fmt.Sprint(cluster.Port())) ||
			(f.origDst == np.Addr().String() && f.origDport == fmt.Sprint(np.Port()))
	}
	packets := fmt.Sprintf(`nftproxy_service_packets_total{namespace=%q,port="tcp",protocol="tcp",service="web"}`, c.ns)
	bytes := fmt.Sprintf(`nftproxy_service_bytes_total{namespace=%q,port="tcp",protocol="tcp",service="web"}`, c.ns)
	const perFrontend, attempts = 15, 3
	for attempt := 1; ; attempt++ {
		for _, f := range c.ctFlows(n1) {
			if ours(f) {
				n1.Exec(context.Background(), "conntrack", "-D", "-p", "tcp", "-s", f.origSrc, "--sport", f.origSport, "-d", f.origDst, "--dport", f.origDport)
			}
		}
		before := scrapeMetrics(t, n1)
		for _, to := range []netip.AddrPort{cluster, np} {
			if lines := c.dial(client, "tcp", to, perFrontend); !onlyFrom("a", "b")(lines) {
				t.Fatalf("%d connections to %s: %s, want every one answered by a or b", perFrontend, to, summarize(lines))
			}
		}
		// The last ACKs may still be on their way: both counts are read
		// until they agree.
		var ct nftnl.Counter
		var flows int
		var got [2]float64
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ct, flows = nftnl.Counter{}, 0
			for _, f := range c.ctFlows(n1) {
				if ours(f) {
					ct, flows = ct.Add(nftnl.Counter{Packets: f.packets, Bytes: f.bytes}), flows+1
				}
			}
			m := scrapeMetrics(t, n1)
			got = [2]float64{m[packets] - before[packets], m[bytes] - before[bytes]}
			if got == [2]float64{float64(ct.Packets), float64(ct.Bytes)} || time.Now().After(deadline) {
				break
			}
		}
		t.Logf("%d flows: %v packets, %v bytes counted; conntrack: %d packets, %d bytes", flows, got[0], got[1], ct.Packets, ct.Bytes)
		if flows != 2*perFrontend && attempt < attempts {
			t.Logf("conntrack holds %d flows of %d (a client port used again): measuring again", flows, 2*perFrontend)
			continue
		}
		if flows != 2*perFrontend || ct.Packets < 4*uint64(flows) {
			t.Errorf("conntrack has %d flows of web with %d packets, want %d flows of at least 4 packets", flows, ct.Packets, 2*perFrontend)
		}
		if got != [2]float64{float64(ct.Packets), float64(ct.Bytes)} {
			t.Errorf("web's packets and bytes grew by %v and %v, want conntrack's %d and %d", got[0], got[1], ct.Packets, ct.Bytes)
		}
		return
	}
}

// scrapeMetrics returns the series of the proxy's /metrics on n.
func scrapeMetrics(t *testing.T, n *testbed.Node) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := n.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", n.Name, err)
	}
	series := map[string]float64{}
	for _, l := range strings.Split(body, "\n") {
		i := strings.LastIndexByte(l, ' ')
		if strings.HasPrefix(l, "#") || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
			series[l[:i]] = v
		}
	}
	return series
}
