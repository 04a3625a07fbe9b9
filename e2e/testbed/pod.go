package testbed

import (
	"fmt"
	"net/netip"
	"strconv"
)

// Link-local next hops of every pod's default routes. They are answered by the node:
// 169.254.1.1 by proxy ARP on the pod's host veth, fe80::1 by being an address of it
// (proxy NDP would need one entry per address; an own address needs none).
const (
	podGatewayIPv4 = "169.254.1.1"
	podGatewayIPv6 = "fe80::1"
)

// Pod is a pod namespace on a node: eth0 with a /32 and a /128, default routes via
// link-local next hops on the node, no NAT anywhere.
type Pod struct {
	Netns
	// Name is the pod's name (the test's choice; no Pod object is created).
	Name string
	// Node is the node the pod runs on.
	Node *Node
	// IPv4 and IPv6 are the pod's addresses, from the node's pod CIDRs.
	IPv4, IPv6 netip.Addr
	// HostVeth is the node's end of the pod's veth ("veth" + index), inside the node
	// namespace; the prefix suits kube-proxy's --detect-local-mode=InterfaceNamePrefix.
	HostVeth string
}

// AddPod creates pod namespace number len(Pods())+1 on the node.
func (n *Node) AddPod(name string) *Pod {
	b := n.bed
	b.t.Helper()
	b.mu.Lock()
	j := len(n.pods) + 1
	b.mu.Unlock()
	if j > 240 {
		b.t.Fatalf("AddPod %s: at most 240 pods per node", name)
	}
	p := &Pod{
		Netns:    Netns{NS: fmt.Sprintf("%s-%s-%s", b.Prefix, n.Name, name), bed: b},
		Name:     name,
		Node:     n,
		IPv4:     netip.MustParseAddr(fmt.Sprintf("10.244.%d.%d", n.Index, 10+j)),
		IPv6:     netip.MustParseAddr(fmt.Sprintf("fd00:244:0:%d::%d", n.Index, 10+j)),
		HostVeth: "veth" + strconv.Itoa(j),
	}
	if err := b.setupPod(p); err != nil {
		b.t.Fatalf("AddPod %s on %s: %v", name, n.Name, err)
	}
	b.mu.Lock()
	n.pods = append(n.pods, p)
	b.mu.Unlock()
	return p
}

func (b *Bed) setupPod(p *Pod) error {
	n := p.Node
	if err := b.addNetns(p.NS); err != nil {
		return err
	}
	err := ipBatch(n.NS,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", p.HostVeth, p.NS),
		fmt.Sprintf("addr add %s/64 dev %s nodad", podGatewayIPv6, p.HostVeth),
		fmt.Sprintf("link set %s up", p.HostVeth),
		fmt.Sprintf("route add %s/32 dev %s", p.IPv4, p.HostVeth),
		fmt.Sprintf("route add %s/128 dev %s", p.IPv6, p.HostVeth),
	)
	if err != nil {
		return err
	}
	// proxy_delay=0: by default the kernel answers proxied ARP requests after a random
	// delay of up to 0.8 s, which stalled each pod's first connection (Calico sets it too).
	err = sysctl(n.NS,
		fmt.Sprintf("net.ipv4.conf.%s.proxy_arp=1", p.HostVeth),
		fmt.Sprintf("net.ipv4.neigh.%s.proxy_delay=0", p.HostVeth))
	if err != nil {
		return err
	}
	err = ipBatch(p.NS,
		fmt.Sprintf("addr add %s/32 dev eth0", p.IPv4),
		fmt.Sprintf("addr add %s/128 dev eth0 nodad", p.IPv6),
		"link set eth0 up",
		fmt.Sprintf("route add %s dev eth0 scope link", podGatewayIPv4),
		fmt.Sprintf("route add default via %s dev eth0", podGatewayIPv4),
		fmt.Sprintf("route add default via %s dev eth0", podGatewayIPv6),
	)
	if err != nil {
		return err
	}
	if err := waitLinkUp(n.NS, p.HostVeth); err != nil {
		return err
	}
	return waitLinkUp(p.NS, "eth0")
}
