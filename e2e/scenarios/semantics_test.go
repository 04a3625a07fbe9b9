package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestSemantics proves Service semantics beyond plain ClusterIPs with real
// connections: type, port and protocol changes (and that nothing stale is
// left in the kernel), terminating endpoints, topology hints, session
// affinity, --masquerade-all and the local traffic detection modes.
//
// Nodes: n1 and n2 run nftproxy with newCluster's flags (ClusterCIDR
// detection), n3 adds --masquerade-all, n4 --detect-local-mode=NodeCIDR,
// n5 --detect-local-mode=InterfaceNamePrefix with prefix "veth" (the node
// side of every pod's veth is "veth<j>", see testbed.Pod.HostVeth), n6
// --detect-local-mode=BridgeInterface with a bridge cbr0 made in the test.
func TestSemantics(t *testing.T) {
	top := newCluster(t)
	c := top
	n1, n2 := c.nodes[0], c.nodes[1]
	n3 := c.semAddNode("n3", "--masquerade-all")
	n4 := c.semAddNode("n4", "--detect-local-mode", "NodeCIDR")
	n5 := c.semAddNode("n5", "--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth")
	n6 := c.semAddNode("n6", "--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0")

	// Backends answer "NAME PEER" on 8080 (TCP, UDP, SCTP); some serve more ports.
	a, b, cB := c.backend(0, "a"), c.backend(0, "b"), c.backend(1, "c")
	c.semServe(a, "a9090", 9090, "tcp")
	c.semServe(cB, "c9090", 9090, "tcp")
	c.semServe(b, "b-tcp", 9000, "tcp") // same port, one server per protocol
	c.semServe(b, "b-udp", 9000, "udp")
	client1 := n1.AddPod("client1")
	client2 := n2.AddPod("client2")
	client3 := n3.AddPod("client3")

	t.Run("type changes ClusterIP, NodePort, LoadBalancer, ClusterIP, ExternalName, ClusterIP; nothing stale", func(t *testing.T) {
		c := top.sub(t)
		const name = "morph"
		svc := c.semCreate(name, nil, semPort("http", 80, v1.ProtocolTCP))
		c.semSlice(name, nil, semReady(a), semReady(cB))
		vip := semClusterIP(t, svc)
		vipAddr := netip.AddrPortFrom(vip, 80)
		both := onlyFrom("a", "c")

		// ClusterIP.
		c.semAwait(n2, client2.Netns, "tcp", vipAddr, 20, "a and c on the ClusterIP", both)

		// NodePort: served on every node's primary IP, from pods of the other node.
		svc = c.semUpdate(name, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort })
		if got := semClusterIP(t, svc); got != vip {
			t.Fatalf("ClusterIP changed from %s to %s on ClusterIP -> NodePort", vip, got)
		}
		nodePort := uint16(svc.Spec.Ports[0].NodePort)
		np1, np2 := netip.AddrPortFrom(n1.IPv4, nodePort), netip.AddrPortFrom(n2.IPv4, nodePort)
		c.semAwait(n1, client2.Netns, "tcp", np1, 20, "a and c on n1's NodePort", both)
		c.semAwait(n2, client1.Netns, "tcp", np2, 20, "a and c on n2's NodePort", both)
		c.semAwait(n2, client2.Netns, "tcp", vipAddr, 20, "a and c on the ClusterIP", both)

		// LoadBalancer with an ingress IP: the NodePort and ClusterIP stay.
		lbIP := netip.MustParseAddr("10.10.0.200")
		lbAddr := netip.AddrPortFrom(lbIP, 80)
		svc = c.semUpdate(name, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeLoadBalancer })
		if got := semClusterIP(t, svc); got != vip || uint16(svc.Spec.Ports[0].NodePort) != nodePort {
			t.Fatalf("NodePort -> LoadBalancer changed ClusterIP %s -> %s or NodePort %d -> %d", vip, got, nodePort, svc.Spec.Ports[0].NodePort)
		}
		c.semSetLBIP(name, lbIP)
		c.semAwait(n2, client2.Netns, "tcp", lbAddr, 20, "a and c on the LB IP", both)
		c.semAwait(n1, client1.Netns, "tcp", lbAddr, 20, "a and c on the LB IP", both)
		c.semAwait(n1, client2.Netns, "tcp", np1, 20, "a and c on n1's NodePort", both)
		c.semAwait(n1, client1.Netns, "tcp", vipAddr, 20, "a and c on the ClusterIP", both)

		// Back to ClusterIP: the NodePort and the LB IP are no longer served.
		svc = c.semUpdate(name, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeClusterIP })
		if got := semClusterIP(t, svc); got != vip || svc.Spec.Ports[0].NodePort != 0 {
			t.Fatalf("LoadBalancer -> ClusterIP: ClusterIP %s -> %s, NodePort %d (want 0)", vip, got, svc.Spec.Ports[0].NodePort)
		}
		c.semAwait(n1, client1.Netns, "tcp", vipAddr, 20, "a and c on the ClusterIP", both)
		c.semAwait(n1, client2.Netns, "tcp", np1, 2, "refused or timeout on n1's former NodePort", semRefusedOrTimeout)
		c.semAwait(n2, client1.Netns, "tcp", np2, 2, "refused or timeout on n2's former NodePort", semRefusedOrTimeout)
		c.semAwait(n2, client2.Netns, "tcp", lbAddr, 1, "no answer on the former LB IP", semNoAnswer)
		c.semAwait(n1, client1.Netns, "tcp", lbAddr, 1, "no answer on the former LB IP", semNoAnswer)
		npToken := fmt.Sprintf("tcp . %d", nodePort)
		c.semOnlyClusterIP(name, vip, npToken, lbIP.String())

		// ExternalName: the proxy ignores it; the ClusterIP is released.
		c.semUpdate(name, func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "morph.example.invalid"
		})
		c.semAwait(n2, client2.Netns, "tcp", vipAddr, 1, "no answer on the released ClusterIP", semNoAnswer)
		c.semNoMention(name, vip.String(), npToken, lbIP.String())

		// ClusterIP again: a new ClusterIP, served; the old one is not.
		svc = c.semUpdate(name, func(s *v1.Service) {
			s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeClusterIP, ""
		})
		vip2 := semClusterIP(t, svc)
		vip2Addr := netip.AddrPortFrom(vip2, 80)
		c.semAwait(n2, client2.Netns, "tcp", vip2Addr, 20, "a and c on the new ClusterIP", both)
		c.semAwait(n1, client1.Netns, "tcp", vip2Addr, 20, "a and c on the new ClusterIP", both)
		if vip2 == vip {
			t.Logf("the API server gave the same ClusterIP %s again; old-IP checks skipped", vip)
		} else {
			c.semAwait(n2, client2.Netns, "tcp", vipAddr, 1, "no answer on the old ClusterIP", semNoAnswer)
			c.semOnlyClusterIP(name, vip2, vip.String(), npToken, lbIP.String())
		}

		// Deleted (its EndpointSlice left behind, as a controller might for a while).
		if err := c.client.CoreV1().Services(c.ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		c.semAwait(n2, client2.Netns, "tcp", vip2Addr, 1, "no answer on the deleted Service's ClusterIP", semNoAnswer)
		c.semNoMention(name, vip.String(), vip2.String(), npToken, lbIP.String())
	})

	t.Run("port and protocol changes, one port on TCP and UDP, multi-port", func(t *testing.T) {
		c := top.sub(t)
		svc := c.semCreate("pp", nil, semPort("p", 80, v1.ProtocolTCP))
		c.semSlice("pp", nil, semReady(a))
		vip := semClusterIP(t, svc)
		at := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(vip, port) }
		c.semAwait(n2, client2.Netns, "tcp", at(80), 3, "a on TCP 80", onlyFrom("a"))

		c.semUpdate("pp", func(s *v1.Service) { s.Spec.Ports[0].Port = 81 })
		c.semAwait(n2, client2.Netns, "tcp", at(81), 3, "a on TCP 81", onlyFrom("a"))
		c.semAwait(n2, client2.Netns, "tcp", at(80), 2, "refused on the former port 80", all("refused"))

		c.semUpdate("pp", func(s *v1.Service) { s.Spec.Ports[0].Protocol = v1.ProtocolUDP })
		c.semSlice("pp", nil, semReady(a)) // the slice's port follows the protocol
		c.semAwait(n2, client2.Netns, "udp", at(81), 3, "a on UDP 81", onlyFrom("a"))
		c.semAwait(n2, client2.Netns, "tcp", at(81), 2, "refused on TCP 81", all("refused"))
		c.semTables("no TCP or port-80 rules left for pp", func(_ *testbed.Node, fam, rs string) string {
			udp81 := false
			for _, l := range c.semMentions(rs, "pp") {
				if strings.Contains(l, "tcp") || strings.Contains(l, " . 80 ") {
					return "stale: " + l
				}
				udp81 = udp81 || strings.Contains(l, vip.String()+" . udp . 81 ")
			}
			if fam == "ip" && !udp81 {
				return "no service-ips element for UDP 81"
			}
			return ""
		})

		// One port number on both protocols: each protocol reaches its own server.
		svc = c.semCreate("dual", nil, semPort("dns-tcp", 53, v1.ProtocolTCP), semPort("dns-udp", 53, v1.ProtocolUDP))
		c.semSlice("dual", map[string]int32{"dns-tcp": 9000, "dns-udp": 9000}, semReady(b))
		dual := netip.AddrPortFrom(semClusterIP(t, svc), 53)
		c.semAwait(n2, client2.Netns, "tcp", dual, 5, "the TCP server b-tcp", onlyFrom("b-tcp"))
		c.semAwait(n2, client2.Netns, "udp", dual, 5, "the UDP server b-udp", onlyFrom("b-udp"))

		// Two named ports with different target ports.
		svc = c.semCreate("multi", nil, semPort("http", 80, v1.ProtocolTCP), semPort("admin", 90, v1.ProtocolTCP))
		c.semSlice("multi", map[string]int32{"http": backendPort, "admin": 9090}, semReady(a), semReady(cB))
		multi := semClusterIP(t, svc)
		c.semAwait(n1, client1.Netns, "tcp", netip.AddrPortFrom(multi, 80), 20, "a and c (8080) on port 80", onlyFrom("a", "c"))
		c.semAwait(n1, client1.Netns, "tcp", netip.AddrPortFrom(multi, 90), 20, "a9090 and c9090 on port 90", onlyFrom("a9090", "c9090"))
		c.semAwait(n1, client1.Netns, "tcp", netip.AddrPortFrom(multi, 9090), 2, "refused on a target port", all("refused"))
	})

	t.Run("terminating endpoints: ready first, then serving-terminating, never non-serving", func(t *testing.T) {
		c := top.sub(t)
		svc := c.semCreate("term", nil, semPort("http", 80, v1.ProtocolTCP))
		addr := netip.AddrPortFrom(semClusterIP(t, svc), 80)
		c.semSlice("term", nil, semReady(a), semTerminating(b, true))
		c.semAwait(n2, client2.Netns, "tcp", addr, 30, "the ready a only", onlyFrom("a"))
		c.semSlice("term", nil, semTerminating(b, true), semTerminating(cB, true))
		c.semAwait(n2, client2.Netns, "tcp", addr, 30, "the serving terminating b and c", onlyFrom("b", "c"))
		c.semAwait(n1, client1.Netns, "tcp", addr, 30, "the serving terminating b and c", onlyFrom("b", "c"))
		c.semSlice("term", nil, semTerminating(b, false), semTerminating(cB, false))
		c.semAwait(n2, client2.Netns, "tcp", addr, 3, "refused (only non-serving endpoints)", all("refused"))
		c.semSlice("term", nil, semReady(cB), semTerminating(b, false))
		c.semAwait(n1, client1.Netns, "tcp", addr, 30, "the ready c only", onlyFrom("c"))
	})

	t.Run("topology: zone hints, partial hints, node label change", func(t *testing.T) {
		c := top.sub(t)
		c.semSetZone(n1, "a")
		c.semSetZone(n2, "b")
		svc := c.semCreate("topo", nil, semPort("http", 80, v1.ProtocolTCP))
		addr := netip.AddrPortFrom(semClusterIP(t, svc), 80)
		c.semSlice("topo", nil, semReady(a, "a"), semReady(cB, "b"))
		c.semAwait(n1, client1.Netns, "tcp", addr, 30, "zone a's endpoint a only", onlyFrom("a"))
		c.semAwait(n2, client2.Netns, "tcp", addr, 30, "zone b's endpoint c only", onlyFrom("c"))
		c.semAwait(n3, client3.Netns, "tcp", addr, 30, "both (n3 has no zone)", onlyFrom("a", "c"))
		c.semSetZone(n3, "c")
		c.semAwait(n3, client3.Netns, "tcp", addr, 30, "both (no endpoint hinted for n3's zone c)", onlyFrom("a", "c"))

		c.semSlice("topo", nil, semReady(a, "a"), semReady(cB)) // c has no hint
		c.semAwait(n1, client1.Netns, "tcp", addr, 30, "both (partial hints)", onlyFrom("a", "c"))
		c.semAwait(n2, client2.Netns, "tcp", addr, 30, "both (partial hints)", onlyFrom("a", "c"))

		c.semSlice("topo", nil, semReady(a, "a"), semReady(cB, "b"))
		c.semAwait(n2, client2.Netns, "tcp", addr, 30, "zone b's endpoint c only", onlyFrom("c"))
		c.semSetZone(n2, "a")
		c.semAwait(n2, client2.Netns, "tcp", addr, 30, "zone a's endpoint a only after n2 moved to zone a", onlyFrom("a"))
		c.semAwait(n1, client1.Netns, "tcp", addr, 30, "zone a's endpoint a only", onlyFrom("a"))
	})

	t.Run("session affinity ClientIP, off, on again", func(t *testing.T) {
		c := top.sub(t)
		timeout := int32(60)
		affinity := func(s *v1.Service) {
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
		}
		svc := c.semCreate("sticky", affinity, semPort("http", 80, v1.ProtocolTCP))
		addr := netip.AddrPortFrom(semClusterIP(t, svc), 80)
		c.semSlice("sticky", nil, semReady(a), semReady(b), semReady(cB))
		first := answeredBy(c.semAwait(n1, client1.Netns, "tcp", addr, 20, "one backend for client1", semSticky))
		other := answeredBy(c.semAwait(n2, client2.Netns, "tcp", addr, 20, "one backend for client2", semSticky))
		again := answeredBy(c.semAwait(n1, client1.Netns, "tcp", addr, 20, "one backend for client1", semSticky))
		if fmt.Sprint(first) == fmt.Sprint(again) {
			t.Logf("client1 stuck to %v (and again %v), client2 to %v", first, again, other)
		} else {
			t.Errorf("client1 moved from %v to %v within the affinity timeout", first, again)
		}
		affinitySet := regexp.MustCompile(`set affinity-\S+-` + regexp.QuoteMeta(c.ns+"/sticky/tcp/http__") + `\S+ \{[^}]*flags dynamic,timeout[^}]*timeout 1m\b`)
		if rs := c.ruleset(n1); len(affinitySet.FindAllString(rs, -1)) != 3 {
			t.Errorf("want 3 affinity sets (one per endpoint) with timeout 1m on n1:\n%s", rs)
		}

		c.semUpdate("sticky", func(s *v1.Service) {
			s.Spec.SessionAffinity, s.Spec.SessionAffinityConfig = v1.ServiceAffinityNone, nil
		})
		c.semAwait(n1, client1.Netns, "tcp", addr, 30, "several backends without affinity", semSeveral)
		c.semTables("no affinity sets or endpoint chains left", func(_ *testbed.Node, _, rs string) string {
			for _, l := range c.semMentions(rs, "sticky") {
				if strings.Contains(l, "affinity-") || strings.Contains(l, "endpoint-") {
					return "stale: " + l
				}
			}
			return ""
		})

		c.semUpdate("sticky", affinity)
		c.semAwait(n1, client1.Netns, "tcp", addr, 20, "one backend for client1 again", semSticky)
	})

	t.Run("masquerade-all: pod to ClusterIP is masqueraded only on the node with the flag", func(t *testing.T) {
		c := top.sub(t)
		svc := c.semCreate("masq", nil, semPort("http", 80, v1.ProtocolTCP))
		addr := netip.AddrPortFrom(semClusterIP(t, svc), 80)
		c.semSlice("masq", nil, semReady(a))
		c.semAwait(n3, client3.Netns, "tcp", addr, 5, "a seeing n3's IP (masqueraded)", semSeenAs("a", n3.IPv4))
		c.semAwait(n2, client2.Netns, "tcp", addr, 5, "a seeing client2's pod IP", semSeenAs("a", client2.IPv4))
	})

	t.Run("local traffic detection", func(t *testing.T) {
		// On each node: a client pod, a "stray" pod whose connections to the
		// service CIDR come from 10.244.200.<node>, inside the cluster CIDR
		// but outside every node's pod CIDR, and a backend on the same node.
		cases := []struct {
			mode       string
			node       *testbed.Node
			backend    *testbed.Pod
			strayMasq  bool // whether the stray source is masqueraded
			wantInRule string
			bridge     string // the client pod is moved onto this bridge
		}{
			// ClusterCIDR: the stray source is in 10.244.0.0/16: local.
			{"ClusterCIDR", n2, cB, false, "ip saddr != 10.244.0.0/16", ""},
			// NodeCIDR: n4's pod CIDR (10.244.4.0/24, from its Node object) is local, the stray source is not.
			{"NodeCIDR", n4, nil, true, "ip saddr != 10.244.4.0/24", ""},
			// InterfaceNamePrefix: whatever arrives on a veth* interface is local.
			{"InterfaceNamePrefix", n5, nil, false, `iifname != "veth*"`, ""},
			// BridgeInterface: the client pod sits on bridge cbr0, the stray
			// pod on a plain veth: only what arrives on cbr0 is local.
			{"BridgeInterface", n6, nil, true, `iifname != "cbr0"`, "cbr0"},
		}
		for _, tc := range cases {
			t.Run(tc.mode, func(t *testing.T) {
				c := top.sub(t)
				backend := tc.backend
				if backend == nil {
					backend = tc.node.AddPod("b" + tc.node.Name)
					backend.Start(c.probe, "serve", "--name", backend.Name, "--port", fmt.Sprint(backendPort), "--tcp")
				}
				client := tc.node.AddPod("p" + tc.node.Name)
				if tc.bridge != "" {
					c.semBridge(client, tc.bridge)
				}
				stray := tc.node.AddPod("s" + tc.node.Name)
				strayIP := netip.MustParseAddr(fmt.Sprintf("10.244.200.%d", tc.node.Index))
				c.semStray(stray, strayIP)

				name := "det-" + tc.node.Name
				svc := c.semCreate(name, nil, semPort("http", 80, v1.ProtocolTCP))
				addr := netip.AddrPortFrom(semClusterIP(t, svc), 80)
				c.semSlice(name, nil, semReady(backend))

				c.semAwait(tc.node, client.Netns, "tcp", addr, 5, "the pod's own IP (not masqueraded)", semSeenAs(backend.Name, client.IPv4))
				c.semAwait(tc.node, tc.node.Netns, "tcp", addr, 5, "the node's IP (from the node itself: masqueraded)", semSeenAs(backend.Name, tc.node.IPv4))
				want, what := strayIP, "the stray source (not masqueraded)"
				if tc.strayMasq {
					want, what = tc.node.IPv4, "the node's IP (stray source masqueraded)"
				}
				c.semAwait(tc.node, stray.Netns, "tcp", addr, 5, what, semSeenAs(backend.Name, want))
				if rs := c.ruleset(tc.node); !strings.Contains(rs, tc.wantInRule) {
					t.Errorf("%s: no %q in the services chain:\n%s", tc.node.Name, tc.wantInRule, rs)
				}
			})
		}
	})
}
