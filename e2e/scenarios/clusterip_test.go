package scenarios

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestClusterIP is the foundation's behaviour, each subtest with real
// connections through the kernel rulesets nftproxy wrote.
func TestClusterIP(t *testing.T) {
	top := newCluster(t)
	c := top
	a, b := c.backend(0, "a"), c.backend(0, "b")
	cBackend := c.backend(1, "c")
	client1 := c.nodes[0].AddPod("client1") // on n1, with a and b
	client2 := c.nodes[1].AddPod("client2") // on n2

	t.Run("two backends both answer within 50 connections", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("web", 80, false, v1.ProtocolTCP)
		c.endpoints("web", backendPort, a, b)
		c.eventually(client1.Netns, "tcp", vip(ips, 80), 50, "answers from a and b only", onlyFrom("a", "b"))
	})

	t.Run("endpoints 0 to 1 to 2 to 1 to 0, refused at 0", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("scale", 80, false, v1.ProtocolTCP)
		addr := vip(ips, 80)
		c.eventually(client1.Netns, "tcp", addr, 3, "refused", all("refused"))
		c.endpoints("scale", backendPort, a)
		c.eventually(client1.Netns, "tcp", addr, 10, "a only", onlyFrom("a"))
		c.endpoints("scale", backendPort, a, b)
		c.eventually(client1.Netns, "tcp", addr, 50, "a and b", onlyFrom("a", "b"))
		c.endpoints("scale", backendPort, b)
		c.eventually(client1.Netns, "tcp", addr, 10, "b only", onlyFrom("b"))
		c.endpoints("scale", backendPort)
		c.eventually(client1.Netns, "tcp", addr, 3, "refused", all("refused"))
	})

	t.Run("port remap, wrong port refused", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("remap", 80, false, v1.ProtocolTCP)
		c.endpoints("remap", backendPort, a)
		c.eventually(client1.Netns, "tcp", vip(ips, 80), 3, "a", onlyFrom("a"))
		// The backend port on the ClusterIP is not a service port.
		c.eventually(client1.Netns, "tcp", vip(ips, backendPort), 2, "refused", all("refused"))
		c.eventually(client1.Netns, "tcp", vip(ips, 81), 2, "refused", all("refused"))
		c.eventually(client1.Netns, "udp", vip(ips, 80), 2, "refused (no UDP port)", all("refused"))
	})

	t.Run("UDP", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("dns", 53, false, v1.ProtocolUDP)
		c.endpoints("dns", backendPort, cBackend)
		c.eventually(client1.Netns, "udp", vip(ips, 53), 5, "c", onlyFrom("c"))
	})

	t.Run("SCTP", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("sctp", 9, false, v1.ProtocolSCTP)
		c.endpoints("sctp", backendPort, a)
		c.eventually(client2.Netns, "sctp", vip(ips, 9), 3, "a", onlyFrom("a"))
	})

	t.Run("unallocated IP in the service CIDR is dropped", func(t *testing.T) {
		c := top.sub(t)
		c.eventually(client1.Netns, "tcp", netip.MustParseAddrPort("10.111.222.233:80"), 1, "timeout", all("timeout"))
	})

	t.Run("IPv6 ClusterIP", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("web6", 80, true, v1.ProtocolTCP, v1.ProtocolUDP)
		if len(ips) != 2 || !ips[1].Is6() {
			t.Fatalf("want a dual-stack service, got %v", ips)
		}
		c.endpoints("web6", backendPort, a, cBackend)
		v6 := netip.AddrPortFrom(ips[1], 80)
		c.eventually(client1.Netns, "tcp", v6, 50, "a and c over IPv6", onlyFrom("a", "c"))
		c.eventually(client2.Netns, "udp", v6, 20, "a and c over IPv6 UDP", onlyFrom("a", "c"))
		c.eventually(client1.Netns, "tcp", netip.AddrPortFrom(ips[1], 81), 2, "refused", all("refused"))
	})

	t.Run("hairpin: a pod reaches itself through its service", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("self", 80, false, v1.ProtocolTCP)
		c.endpoints("self", backendPort, a)
		lines := c.eventually(a.Netns, "tcp", vip(ips, 80), 3, "a", onlyFrom("a"))
		for _, l := range lines {
			// Masqueraded: the peer a sees is its node, not itself.
			if strings.Contains(l, a.IPv4.String()+":") {
				t.Errorf("hairpin not masqueraded: %q", l)
			}
		}
	})

	t.Run("across nodes the backend sees the client pod IP", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("cross", 80, false, v1.ProtocolTCP)
		c.endpoints("cross", backendPort, a)
		lines := c.eventually(client2.Netns, "tcp", vip(ips, 80), 5, "a", onlyFrom("a"))
		for _, l := range lines {
			if !strings.HasPrefix(strings.Fields(l)[1], client2.IPv4.String()+":") {
				t.Errorf("backend saw %q, want the client pod %s", l, client2.IPv4)
			}
		}
	})

	t.Run("from the node itself, masqueraded", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("fromnode", 80, false, v1.ProtocolTCP)
		c.endpoints("fromnode", backendPort, cBackend)
		lines := c.eventually(c.nodes[0].Netns, "tcp", vip(ips, 80), 3, "c", onlyFrom("c"))
		for _, l := range lines {
			if !strings.HasPrefix(strings.Fields(l)[1], c.nodes[0].IPv4.String()+":") {
				t.Errorf("backend saw %q, want the node %s", l, c.nodes[0].IPv4)
			}
		}
	})
}
