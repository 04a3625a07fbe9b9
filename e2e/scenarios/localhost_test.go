package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestLocalhostNodePorts proves kube-proxy 1.37's localhost NodePorts
// (feature gate KubeProxyNFTablesLocalhostNodePorts) with real
// connections from processes on the nodes to 127.0.0.1 and ::1.
//
// n1 runs with --nodeport-addresses=primary,localhost: its userspace
// proxy serves the TCP NodePort on both loopback addresses and carries the
// connections to the Service's pods on either node; UDP there is refused
// by the rules. n2 runs with the gate and the default (primary): every
// protocol is refused on loopback, even with a process of the node
// listening at the port, which answers once the Service is gone. The
// metrics count the listeners and the refused packets.
func TestLocalhostNodePorts(t *testing.T) {
	c := newExtCluster(t) // ICMP rate limits lifted: every UDP refusal is answered
	n1, n2 := c.nodes[0], c.nodes[1]
	gate := "--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true"
	c.restartProxy(n1, withArgs(c.args[n1.Name], gate, "--nodeport-addresses=primary,localhost"))
	c.restartProxy(n2, withArgs(c.args[n2.Name], gate))
	a, b := c.backend(0, "a"), c.backend(1, "b")
	ext := c.bed.AddNode("ext")
	lo4, lo6 := netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()
	at := func(ip netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(ip, port) }

	svc := c.extCreate("web", v1.ServiceTypeNodePort, true, extWithUDP)
	np, npUDP := extNodePort(t, svc), uint16(svc.Spec.Ports[1].NodePort)
	// A process on n2 listens at the TCP NodePort on every address, one on
	// n1 at the UDP one: the refusals below are the rules', not an empty
	// port's.
	n2.Start(c.probe, "serve", "--name", "n2-host", "--port", fmt.Sprint(np), "--tcp")
	n1.Start(c.probe, "serve", "--name", "n1-host-udp", "--port", fmt.Sprint(npUDP), "--udp")
	c.endpoints("web", backendPort, a, b)

	// n1: TCP through the userspace proxy, to both pods, in both families.
	c.eventually(n1.Netns, "tcp", at(lo4, np), 30, "a and b through the proxy on 127.0.0.1", onlyFrom("a", "b"))
	c.eventually(n1.Netns, "tcp", at(lo6, np), 30, "a and b through the proxy on ::1", onlyFrom("a", "b"))
	// Only the loopback address itself listens, not 127.0.0.0/8, and the
	// NodePort still answers on the node's address from outside.
	c.eventually(n1.Netns, "tcp", at(netip.MustParseAddr("127.0.0.2"), np), 3, "refused on 127.0.0.2", all("refused"))
	c.eventually(ext.Netns, "tcp", at(n1.IPv4, np), 20, "a and b from outside", onlyFrom("a", "b"))
	// UDP on loopback is refused, although n1-host-udp listens there.
	c.eventually(n1.Netns, "udp", at(lo4, npUDP), 3, "refused on 127.0.0.1", all("refused"))
	c.eventually(n1.Netns, "udp", at(lo6, npUDP), 3, "refused on ::1", all("refused"))

	// n2: no loopback in nodePortAddresses: TCP and UDP refused on
	// loopback, although n2-host listens at the TCP port.
	c.eventually(n2.Netns, "tcp", at(lo4, np), 3, "refused on 127.0.0.1", all("refused"))
	c.eventually(n2.Netns, "tcp", at(lo6, np), 3, "refused on ::1", all("refused"))
	c.eventually(n2.Netns, "udp", at(lo4, npUDP), 3, "refused on 127.0.0.1", all("refused"))

	// nftproxy explain reads the refusals from the kernel's table.
	for _, q := range []struct {
		n     *testbed.Node
		proto string
		to    netip.AddrPort
	}{{n2, "tcp", at(lo4, np)}, {n2, "tcp", at(lo6, np)}, {n1, "udp", at(lo4, npUDP)}} {
		outcomes, text := c.explainOn(q.n, "node", q.proto, q.to)
		if len(outcomes) != 1 || outcomes[0].Verdict != "reject" || outcomes[0].Reason != "NodePorts that refuse connections to loopback" {
			t.Errorf("%s: explain %s %s: %+v\n%s", q.n.Name, q.proto, q.to, outcomes, text)
		}
	}

	const (
		listeners = "kubeproxy_nftables_localhost_nodeport_listeners"
		failures  = "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total"
		rejected  = "kubeproxy_nftables_localhost_nodeport_rejected_packets_total"
	)
	for _, m := range []struct {
		node   string
		name   string
		labels []string
		min    float64
		max    float64
	}{
		{"n1", listeners, []string{"ip_family=IPv4"}, 1, 1},
		{"n1", listeners, []string{"ip_family=IPv6"}, 1, 1},
		{"n1", failures, []string{"ip_family=IPv4"}, 0, 0},
		{"n1", rejected, []string{"ip_family=IPv4", "protocol=UDP"}, 3, 1e9},
		{"n1", rejected, []string{"ip_family=IPv6", "protocol=UDP"}, 3, 1e9},
		{"n1", rejected, []string{"protocol=TCP"}, 0, 0},
		{"n2", rejected, []string{"ip_family=IPv4", "protocol=TCP"}, 3, 1e9},
		{"n2", rejected, []string{"ip_family=IPv6", "protocol=TCP"}, 3, 1e9},
		{"n2", rejected, []string{"ip_family=IPv4", "protocol=UDP"}, 3, 1e9},
		{"n2", listeners, nil, 0, 0},
	} {
		n := n1
		if m.node == "n2" {
			n = n2
		}
		if v := c.metric(n, m.name, m.labels...); v < m.min || v > m.max {
			t.Errorf("%s: %s%v = %v, want %v to %v", m.node, m.name, m.labels, v, m.min, m.max)
		}
	}
	body := c.metricsBody(n1)
	t.Logf("n1's localhost NodePort metrics:\n%s\nn2's:\n%s", grepLines(body, "localhost_nodeport"),
		grepLines(c.metricsBody(n2), "localhost_nodeport"))
	for _, series := range []string{rejected + `{ip_family="IPv4",protocol="SCTP"} 0`, rejected + `{ip_family="IPv4",protocol="UDP"}`} {
		if !strings.Contains(body, series) {
			t.Errorf("n1 serves no %s:\n%s", series, grepLines(body, "localhost"))
		}
	}
	if strings.Contains(body, `protocol="TCP"`) {
		t.Errorf("n1 counts refused TCP, which its proxy serves:\n%s", grepLines(body, "localhost"))
	}

	// Without endpoints n1 closes its listeners: the kernel refuses.
	c.endpoints("web", backendPort)
	c.eventually(n1.Netns, "tcp", at(lo4, np), 3, "refused without endpoints", all("refused"))
	c.eventually(n1.Netns, "tcp", at(lo6, np), 3, "refused without endpoints", all("refused"))
	if v := c.metric(n1, listeners); v != 0 {
		t.Errorf("n1 has %v listeners without endpoints", v)
	}
	// Endpoints again, one pod: its connections go there.
	c.endpoints("web", backendPort, b)
	c.eventually(n1.Netns, "tcp", at(lo4, np), 10, "b alone", onlyFrom("b"))

	// Once the Service is gone, no rule refuses n2's loopback port: the
	// process listening there answers.
	if err := c.client.CoreV1().Services(c.ns).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.eventually(n2.Netns, "tcp", at(lo4, np), 3, "n2-host once the NodePort is gone", onlyFrom("n2-host"))
	c.eventually(n1.Netns, "tcp", at(lo4, np), 3, "refused: no listener", all("refused"))
}

// metricsBody is n's /metrics.
func (c *cluster) metricsBody(n *testbed.Node) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := n.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		c.t.Fatal(err)
	}
	return body
}

// grepLines returns the lines of s holding substr.
func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
