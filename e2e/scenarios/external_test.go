package scenarios

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestExternal proves with real connections how Services are reached from
// outside the cluster (NodePort, externalIPs, LoadBalancer ingress IPs,
// loadBalancerSourceRanges) and the traffic policies: which backends answer,
// refused vs timeout, and the source address the backend sees.
//
// Node ext is a third node namespace on the fabric without nftproxy: the
// outside client. Backend a runs on n1, backend c on n2.
func TestExternal(t *testing.T) {
	top := newExtCluster(t)
	c := top
	n1, n2 := c.nodes[0], c.nodes[1]
	ext := c.bed.AddNode("ext")
	a := c.backend(0, "a")
	cb := c.backend(1, "c")
	client1 := n1.AddPod("client1")
	client2 := n2.AddPod("client2")
	at := func(ip netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(ip, port) }

	t.Run("NodePort", func(t *testing.T) {
		c := top.sub(t)
		svc := c.extCreate("np", v1.ServiceTypeNodePort, true, extWithUDP)
		np, npUDP := extNodePort(t, svc), uint16(svc.Spec.Ports[1].NodePort)
		c.endpoints("np", backendPort, a, cb)

		// From outside, on either node, IPv4 and IPv6: both backends, and they
		// see the node that was dialed (eTP Cluster masquerades).
		for _, n := range []struct{ node, ip netip.Addr }{
			{n1.IPv4, n1.IPv4}, {n2.IPv4, n2.IPv4}, {n1.IPv6, n1.IPv6}, {n2.IPv6, n2.IPv6},
		} {
			c.extAwait(ext.Netns, "tcp", at(n.node, np), 40, fmt.Sprintf("a and c, seeing %s", n.ip), extPeersAre(n.ip, "a", "c"))
		}
		c.extAwait(ext.Netns, "udp", at(n1.IPv4, npUDP), 30, "a and c over UDP, seeing n1", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(ext.Netns, "udp", at(n2.IPv6, npUDP), 30, "a and c over UDP/IPv6, seeing n2", extPeersAre(n2.IPv6, "a", "c"))
		// From a pod on the other node and from a pod on the node dialed.
		c.extAwait(client2.Netns, "tcp", at(n1.IPv4, np), 40, "a and c, seeing n1", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(client1.Netns, "tcp", at(n1.IPv4, np), 40, "a and c, seeing n1", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(client2.Netns, "tcp", at(n1.IPv6, np), 40, "a and c over IPv6, seeing n1", extPeersAre(n1.IPv6, "a", "c"))
		// From the node itself, on its own address.
		c.extAwait(n1.Netns, "tcp", at(n1.IPv4, np), 40, "a and c, seeing n1", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(n1.Netns, "tcp", at(n1.IPv6, np), 40, "a and c over IPv6, seeing n1", extPeersAre(n1.IPv6, "a", "c"))
		// Not on loopback: nothing listens there, so the kernel refuses.
		c.extAwait(n1.Netns, "tcp", at(netip.MustParseAddr("127.0.0.1"), np), 3, "refused (not a NodePort address)", all("refused"))
		c.extAwait(n1.Netns, "tcp", at(netip.IPv6Loopback(), np), 3, "refused (not a NodePort address)", all("refused"))

		// No endpoints: rejected. A server listening on n1 itself at that port
		// tells a rule's REJECT apart from a port nothing listens on: without
		// the rule it would answer. On loopback (no NodePort there) it does.
		empty := c.extCreate("np-empty", v1.ServiceTypeNodePort, true, extWithUDP)
		enp, enpUDP := extNodePort(t, empty), uint16(empty.Spec.Ports[1].NodePort)
		n1.Start(c.probe, "serve", "--name", "n1-host-udp", "--port", fmt.Sprint(enpUDP), "--udp")
		c.extAwait(n1.Netns, "udp", at(netip.MustParseAddr("127.0.0.1"), enpUDP), 2, "n1-host-udp on loopback", onlyFrom("n1-host-udp"))
		c.extAwait(ext.Netns, "udp", at(n1.IPv4, enpUDP), 3, "refused by the no-endpoint rule", all("refused"))
		c.extAwait(ext.Netns, "udp", at(n1.IPv6, enpUDP), 3, "refused by the no-endpoint rule", all("refused"))
		n1.Start(c.probe, "serve", "--name", "n1-host", "--port", fmt.Sprint(enp), "--tcp")
		c.extAwait(n1.Netns, "tcp", at(netip.MustParseAddr("127.0.0.1"), enp), 2, "n1-host on loopback", onlyFrom("n1-host"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv4, enp), 3, "refused by the no-endpoint rule", all("refused"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv6, enp), 3, "refused by the no-endpoint rule", all("refused"))
		c.extAwait(client2.Netns, "tcp", at(n1.IPv4, enp), 3, "refused by the no-endpoint rule", all("refused"))
		c.extAwait(ext.Netns, "tcp", at(n2.IPv4, enp), 3, "refused", all("refused"))
		// Endpoints appear: served; gone again: refused again.
		c.endpoints("np-empty", backendPort, cb)
		c.extAwait(ext.Netns, "tcp", at(n1.IPv4, enp), 5, "c, seeing n1", extPeersAre(n1.IPv4, "c"))
		c.endpoints("np-empty", backendPort)
		c.extAwait(ext.Netns, "tcp", at(n1.IPv4, enp), 3, "refused again", all("refused"))
	})

	t.Run("ExternalIPs", func(t *testing.T) {
		c := top.sub(t)
		eip := netip.MustParseAddr("10.10.0.201")
		c.extCreate("extip", v1.ServiceTypeClusterIP, false, func(s *v1.Service) { s.Spec.ExternalIPs = []string{eip.String()} })
		c.endpoints("extip", backendPort, a, cb)
		c.extRouteVia(ext.Netns, eip, n1.IPv4)
		c.extAwait(ext.Netns, "tcp", at(eip, 80), 40, "a and c, seeing n1", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(ext.Netns, "tcp", at(eip, 81), 2, "no answer on another port", extNoBackend)
		// A pod's traffic to the external IP is captured by its own node.
		c.extAwait(client2.Netns, "tcp", at(eip, 80), 40, "a and c, seeing n2", extPeersAre(n2.IPv4, "a", "c"))
		// And the node's own traffic.
		c.extAwait(n2.Netns, "tcp", at(eip, 80), 40, "a and c, seeing n2", extPeersAre(n2.IPv4, "a", "c"))
	})

	t.Run("LoadBalancer", func(t *testing.T) {
		c := top.sub(t)
		lbIP, proxyIP := netip.MustParseAddr("10.10.0.202"), netip.MustParseAddr("10.10.0.205")
		lbIP6, proxyIP6 := netip.MustParseAddr("fd00:10::202"), netip.MustParseAddr("fd00:10::205")
		svc := c.extCreate("lb", v1.ServiceTypeLoadBalancer, true, nil)
		np := extNodePort(t, svc)
		c.endpoints("lb", backendPort, a, cb)
		proxyMode := v1.LoadBalancerIPModeProxy
		c.extSetIngress("lb", v1.LoadBalancerIngress{IP: lbIP.String()}, v1.LoadBalancerIngress{IP: lbIP6.String()},
			v1.LoadBalancerIngress{IP: proxyIP.String(), IPMode: &proxyMode},
			v1.LoadBalancerIngress{IP: proxyIP6.String(), IPMode: &proxyMode})
		for _, ip := range []netip.Addr{lbIP, proxyIP} {
			c.extRouteVia(ext.Netns, ip, n1.IPv4)
		}
		for _, ip := range []netip.Addr{lbIP6, proxyIP6} {
			c.extRouteVia(ext.Netns, ip, n1.IPv6)
		}
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 40, "a and c, seeing n1", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(ext.Netns, "tcp", at(lbIP6, 80), 40, "a and c over IPv6, seeing n1", extPeersAre(n1.IPv6, "a", "c"))
		c.extAwait(client2.Netns, "tcp", at(lbIP, 80), 40, "a and c from a pod, seeing n2", extPeersAre(n2.IPv4, "a", "c"))
		// ipMode Proxy: the load balancer proxies itself; the node must not
		// capture that IP (from outside, from a pod, from the node).
		for _, ip := range []netip.Addr{proxyIP, proxyIP6} {
			c.extAwait(ext.Netns, "tcp", at(ip, 80), 2, "no backend (ipMode Proxy)", extNoBackend)
			c.extAwait(client1.Netns, "tcp", at(ip, 80), 2, "no backend (ipMode Proxy)", extNoBackend)
			c.extAwait(n1.Netns, "tcp", at(ip, 80), 2, "no backend (ipMode Proxy)", extNoBackend)
		}

		// Source ranges without the client: dropped before DNAT. The NodePort
		// of the same Service is not filtered.
		c.extUpdate("lb", func(s *v1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "2001:db8::/64"}
		})
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 3, "timeout (outside source ranges)", all("timeout"))
		c.extAwait(ext.Netns, "tcp", at(lbIP6, 80), 3, "timeout (outside source ranges)", all("timeout"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv4, np), 20, "a and c on the NodePort, unfiltered", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(ext.Netns, "tcp", at(n2.IPv4, np), 20, "a and c on the NodePort, unfiltered", extPeersAre(n2.IPv4, "a", "c"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv6, np), 20, "a and c on the NodePort, unfiltered", extPeersAre(n1.IPv6, "a", "c"))
		// Source ranges with the client: served again.
		c.extUpdate("lb", func(s *v1.Service) {
			s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", ext.IPv4.String() + "/32", "2001:db8::/64", ext.IPv6.String() + "/128"}
		})
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 40, "a and c (inside source ranges)", extPeersAre(n1.IPv4, "a", "c"))
		c.extAwait(ext.Netns, "tcp", at(lbIP6, 80), 40, "a and c (inside source ranges)", extPeersAre(n1.IPv6, "a", "c"))
		// The ingress IP goes away: no longer captured.
		c.extSetIngress("lb")
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 2, "no backend (ingress removed)", extNoBackend)
		c.extAwait(n1.Netns, "tcp", at(lbIP, 80), 2, "no backend (ingress removed)", extNoBackend)
	})

	t.Run("externalTrafficPolicy Local", func(t *testing.T) {
		c := top.sub(t)
		lbIP, lbIP6 := netip.MustParseAddr("10.10.0.203"), netip.MustParseAddr("fd00:10::203")
		svc := c.extCreate("lb-local", v1.ServiceTypeLoadBalancer, true, func(s *v1.Service) {
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		})
		np, hc := extNodePort(t, svc), svc.Spec.HealthCheckNodePort
		if hc == 0 {
			t.Fatalf("no healthCheckNodePort allocated: %+v", svc.Spec)
		}
		c.endpoints("lb-local", backendPort, a) // n1 only
		c.extSetIngress("lb-local", v1.LoadBalancerIngress{IP: lbIP.String()}, v1.LoadBalancerIngress{IP: lbIP6.String()})
		c.extRouteVia(ext.Netns, lbIP, n1.IPv4)
		c.extRouteVia(ext.Netns, lbIP6, n1.IPv6)

		// Via n1 (local endpoint): the backend sees the real client.
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 10, "a, seeing ext", extPeersAre(ext.IPv4, "a"))
		c.extAwait(ext.Netns, "tcp", at(lbIP6, 80), 10, "a, seeing ext", extPeersAre(ext.IPv6, "a"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv4, np), 10, "a, seeing ext", extPeersAre(ext.IPv4, "a"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv6, np), 10, "a, seeing ext", extPeersAre(ext.IPv6, "a"))
		// Via n2 (no local endpoint): dropped.
		c.extAwait(ext.Netns, "tcp", at(n2.IPv4, np), 2, "timeout (no local endpoint on n2)", all("timeout"))
		c.extAwait(ext.Netns, "tcp", at(n2.IPv6, np), 2, "timeout (no local endpoint on n2)", all("timeout"))
		c.extRouteVia(ext.Netns, lbIP, n2.IPv4)
		c.extRouteVia(ext.Netns, lbIP6, n2.IPv6)
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 2, "timeout (no local endpoint on n2)", all("timeout"))
		c.extAwait(ext.Netns, "tcp", at(lbIP6, 80), 2, "timeout (no local endpoint on n2)", all("timeout"))
		// A pod on n2 reaches the LB IP through n2, which serves it with the
		// endpoint on n1 (as upstream since kubernetes#132456 fixed #131765); it is
		// pod traffic, so not masqueraded. Same for n2's NodePort.
		c.extAwait(client2.Netns, "tcp", at(lbIP, 80), 10, "a, seeing client2", extPeersAre(client2.IPv4, "a"))
		c.extAwait(client2.Netns, "tcp", at(lbIP6, 80), 10, "a, seeing client2", extPeersAre(client2.IPv6, "a"))
		c.extAwait(client2.Netns, "tcp", at(n2.IPv4, np), 10, "a, seeing client2", extPeersAre(client2.IPv4, "a"))
		// n2 itself too, masqueraded.
		c.extAwait(n2.Netns, "tcp", at(lbIP, 80), 10, "a, seeing n2", extPeersAre(n2.IPv4, "a"))
		c.extAwait(n2.Netns, "tcp", at(n2.IPv4, np), 10, "a, seeing n2", extPeersAre(n2.IPv4, "a"))
		// The endpoint reaching itself through the LB IP: hairpin, masqueraded.
		c.extAwait(a.Netns, "tcp", at(lbIP, 80), 5, "a, seeing n1 (hairpin)", extPeersAre(n1.IPv4, "a"))

		// Health checks: 200 where there is a local endpoint, 503 elsewhere,
		// on both families.
		hcURL := func(ip netip.Addr) string { return fmt.Sprintf("http://%s/", netip.AddrPortFrom(ip, uint16(hc))) }
		c.extHealth(ext.Netns, hcURL(n1.IPv4), 200, "lb-local", 1)
		c.extHealth(ext.Netns, hcURL(n1.IPv6), 200, "lb-local", 1)
		c.extHealth(ext.Netns, hcURL(n2.IPv4), 503, "lb-local", 0)
		c.extHealth(ext.Netns, hcURL(n2.IPv6), 503, "lb-local", 0)
		// Endpoints move to n2: the answers and the health checks follow.
		c.endpoints("lb-local", backendPort, cb)
		c.extHealth(ext.Netns, hcURL(n2.IPv4), 200, "lb-local", 1)
		c.extHealth(ext.Netns, hcURL(n1.IPv4), 503, "lb-local", 0)
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 10, "c via n2, seeing ext", extPeersAre(ext.IPv4, "c"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv4, np), 2, "timeout (no local endpoint on n1)", all("timeout"))
		// No endpoints at all: rejected everywhere, health checks 503.
		c.endpoints("lb-local", backendPort)
		c.extAwait(ext.Netns, "tcp", at(lbIP, 80), 2, "refused (no endpoints)", all("refused"))
		c.extAwait(ext.Netns, "tcp", at(n1.IPv4, np), 2, "refused (no endpoints)", all("refused"))
		c.extHealth(ext.Netns, hcURL(n2.IPv4), 503, "lb-local", 0)
	})

	t.Run("internalTrafficPolicy Local", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("itp", 80, false, v1.ProtocolTCP)
		c.extUpdate("itp", func(s *v1.Service) {
			p := v1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		})
		c.endpoints("itp", backendPort, a, cb)
		c.extAwait(client1.Netns, "tcp", vip(ips, 80), 20, "a only (local to n1)", extPeersAre(client1.IPv4, "a"))
		c.extAwait(client2.Netns, "tcp", vip(ips, 80), 20, "c only (local to n2)", extPeersAre(client2.IPv4, "c"))

		// A Service whose only endpoint is on n1: served from n2 while the
		// policy is Cluster, dropped from n2 once it is Local.
		one := c.service("itp-one", 80, false, v1.ProtocolTCP)
		c.endpoints("itp-one", backendPort, a)
		c.extAwait(client2.Netns, "tcp", vip(one, 80), 5, "a (policy Cluster)", extPeersAre(client2.IPv4, "a"))
		c.extUpdate("itp-one", func(s *v1.Service) {
			p := v1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		})
		c.extAwait(client2.Netns, "tcp", vip(one, 80), 2, "timeout (no local endpoint on n2)", all("timeout"))
		c.extAwait(client1.Netns, "tcp", vip(one, 80), 5, "a (local to n1)", extPeersAre(client1.IPv4, "a"))
	})
}
