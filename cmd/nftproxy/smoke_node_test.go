package main

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
)

// smokeHost is a node's network namespace: eth0 on the link between the
// two nodes, a /32 route and a proxy-ARP veth per pod, forwarding on.
type smokeHost struct {
	name       string // the Node object's
	ns         *netns.NS
	ipv4, ipv6 netip.Addr
	pods       []*smokePod
}

// smokePod is a pod's network namespace on a node: eth0 with a /32 and a
// /128 from the node's pod CIDRs, default routes via link-local next hops
// that the node answers (169.254.1.1 by proxy ARP, fe80::1 as an address
// of its end of the veth).
type smokePod struct {
	name       string
	ns         *netns.NS
	ipv4, ipv6 netip.Addr
	host       *smokeHost
}

// smokeCluster is the smoke tests' two nodes and their pods, as
// testdata/smoke/cluster.yaml describes them: smoke-node (the proxy's)
// with pods client, ep-a and ep-b, and smoke-remote with ep-c and ep-d,
// linked by one veth pair (10.10.0.0/24, fd00:10::/64) over which each
// node routes the other's pod CIDRs. smoke-remote also routes the lb
// Service's ingress IP to smoke-node.
type smokeCluster struct {
	node, remote *smokeHost
	client       *smokePod
	pods         map[string]*smokePod // the endpoint pods, by name
}

// lbIngressIP is Service lb's load balancer IP.
var lbIngressIP = netip.MustParseAddr("192.0.2.16")

// newSmokeCluster creates the namespaces and links; each namespace is
// removed when the test ends (Ctrl-C too: netns.New).
func newSmokeCluster(t *testing.T) *smokeCluster {
	t.Helper()
	node := newSmokeHost(t, "smoke-node", 1)
	remote := newSmokeHost(t, "smoke-remote", 2)
	// Interface indexes are chosen so that the two ends of a veth differ:
	// the kernel reports the carrier of a veth whose peer has its own
	// index only after a rate limit of up to a second (linkwatch), and
	// IPv6 loses packets until then.
	runIn(t, node.ns, "ip", "link", "add", "eth0", "index", "10", "type", "veth", "peer", "name", "eth0", "index", "20", "netns", remote.ns.Name)
	for _, h := range []struct{ self, peer *smokeHost }{{node, remote}, {remote, node}} {
		script := []string{
			fmt.Sprintf("addr add %s/24 dev eth0", h.self.ipv4),
			fmt.Sprintf("addr add %s/64 dev eth0 nodad", h.self.ipv6),
			"link set eth0 up",
			"link set lo up",
			fmt.Sprintf("route add %s via %s", podCIDR(h.peer, 4), h.peer.ipv4),
			fmt.Sprintf("route add %s via %s", podCIDR(h.peer, 6), h.peer.ipv6),
		}
		ipBatch(t, h.self.ns, script...)
	}
	// Proxy ARP answers a pod's request for its next hop, 169.254.1.1,
	// only when the node has a route to that address leaving by another
	// interface. The proxy's node has default routes (via smoke-remote:
	// a node's own traffic to a ClusterIP needs a route before it is
	// DNATed); smoke-remote a route to the next hop only, so that what the
	// test does not route is unreachable there rather than sent back.
	ipBatch(t, node.ns, "route add default via "+remote.ipv4.String(), "route add default via "+remote.ipv6.String())
	ipBatch(t, remote.ns, "route add 169.254.1.1/32 via "+node.ipv4.String(),
		fmt.Sprintf("route add %s/32 via %s", lbIngressIP, node.ipv4))
	c := &smokeCluster{node: node, remote: remote, pods: map[string]*smokePod{}}
	c.client = node.addPod(t, "client", 10)
	for _, p := range []struct {
		host *smokeHost
		name string
		i    int
	}{{node, "ep-a", 11}, {node, "ep-b", 12}, {remote, "ep-c", 11}, {remote, "ep-d", 12}} {
		c.pods[p.name] = p.host.addPod(t, p.name, p.i)
	}
	for _, h := range []*smokeHost{node, remote} {
		waitLinksUp(t, h.ns)
		for _, p := range h.pods {
			waitLinksUp(t, p.ns)
		}
	}
	return c
}

// waitLinksUp waits until every link of ns but lo is up (operstate UP):
// until then IPv6 packets through it are lost, and the first connection
// waits for its SYN to be sent again.
func waitLinksUp(t *testing.T, ns *netns.NS) {
	t.Helper()
	eventually(t, "the links of "+ns.Name+" to be up", func() (bool, string) {
		out := runIn(t, ns, "ip", "-o", "link", "show")
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if !strings.Contains(line, " lo:") && !strings.Contains(line, " state UP ") {
				return false, line
			}
		}
		return true, ""
	})
}

// newSmokeHost is node number i: 10.10.0.1i, pod CIDR 10.244.i.0/24.
func newSmokeHost(t *testing.T, name string, i int) *smokeHost {
	t.Helper()
	h := &smokeHost{
		name: name,
		ns:   netns.New(t, "nftproxy-"+strings.ReplaceAll(name, "-", ""), "nft"),
		ipv4: netip.MustParseAddr(fmt.Sprintf("10.10.0.%d", 10+i)),
		ipv6: netip.MustParseAddr(fmt.Sprintf("fd00:10::%d", 10+i)),
	}
	noDAD(t, h.ns)
	sysctl(t, h.ns, "net/ipv4/ip_forward", "1")
	sysctl(t, h.ns, "net/ipv6/conf/all/forwarding", "1")
	return h
}

// podCIDR is the host's pod CIDR of the family (4 or 6).
func podCIDR(h *smokeHost, family int) string {
	i := h.ipv4.As4()[3] - 10
	if family == 4 {
		return fmt.Sprintf("10.244.%d.0/24", i)
	}
	return fmt.Sprintf("fd00:244:%d::/64", i)
}

// addPod creates pod name with host part i of the host's pod CIDRs.
func (h *smokeHost) addPod(t *testing.T, name string, i int) *smokePod {
	t.Helper()
	n := h.ipv4.As4()[3] - 10
	p := &smokePod{
		name: name,
		ns:   netns.New(t, "nftproxy-smoke"+strings.ReplaceAll(name, "-", "")),
		ipv4: netip.MustParseAddr(fmt.Sprintf("10.244.%d.%d", n, i)),
		ipv6: netip.MustParseAddr(fmt.Sprintf("fd00:244:%d::%d", n, i)),
		host: h,
	}
	noDAD(t, p.ns)
	veth := "veth-" + name
	ipBatch(t, h.ns,
		fmt.Sprintf("link add %s index %d type veth peer name eth0 index 2 netns %s", veth, 100+i, p.ns.Name),
		fmt.Sprintf("addr add fe80::1/64 dev %s nodad", veth),
		fmt.Sprintf("link set %s up", veth),
		fmt.Sprintf("route add %s/32 dev %s", p.ipv4, veth),
		fmt.Sprintf("route add %s/128 dev %s", p.ipv6, veth))
	sysctl(t, h.ns, "net/ipv4/conf/"+veth+"/proxy_arp", "1")
	// By default proxy ARP answers after a random delay of up to 0.8 s.
	sysctl(t, h.ns, "net/ipv4/neigh/"+veth+"/proxy_delay", "0")
	ipBatch(t, p.ns,
		fmt.Sprintf("addr add %s/32 dev eth0", p.ipv4),
		fmt.Sprintf("addr add %s/128 dev eth0 nodad", p.ipv6),
		"link set eth0 up",
		"link set lo up",
		"route add 169.254.1.1 dev eth0 scope link",
		"route add default via 169.254.1.1 dev eth0",
		"route add default via fe80::1 dev eth0")
	h.pods = append(h.pods, p)
	return p
}

// noDAD turns off IPv6 duplicate address detection for the interfaces
// created in ns from now on: their link-local addresses are usable at
// once, instead of a second or two later, in which the first packets of
// IPv6 connections were lost.
func noDAD(t *testing.T, ns *netns.NS) {
	t.Helper()
	sysctl(t, ns, "net/ipv6/conf/default/accept_dad", "0")
	sysctl(t, ns, "net/ipv6/conf/all/accept_dad", "0")
}

// runIn runs a command in ns and fails the test if it fails.
func runIn(t *testing.T, ns *netns.NS, args ...string) string {
	t.Helper()
	out, err := ns.Run("", args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ipBatch runs ip commands in ns, one process for all of them.
func ipBatch(t *testing.T, ns *netns.NS, cmds ...string) {
	t.Helper()
	if _, err := ns.Run(strings.Join(cmds, "\n")+"\n", "ip", "-batch", "-"); err != nil {
		t.Fatalf("in %s: %v\n%s", ns.Name, err, strings.Join(cmds, "\n"))
	}
}

// sysctl sets a sysctl of ns (its path under /proc/sys).
func sysctl(t *testing.T, ns *netns.NS, key, value string) {
	t.Helper()
	var err error
	ns.Do(t, func() { err = os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644) })
	if err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v", key, value, ns.Name, err)
	}
}
