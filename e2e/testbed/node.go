package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Node is a node namespace on the fabric, with its Node object in the API server.
type Node struct {
	Netns
	// Name is the Kubernetes node name.
	Name string
	// Index is the node's number in the bed, from 1; it determines the addresses.
	Index int
	// IPv4 and IPv6 are the node's fabric addresses (the Node's InternalIPs).
	IPv4, IPv6 netip.Addr
	// PodCIDRs are the node's pod ranges, IPv4 first (the Node's spec.podCIDRs).
	PodCIDRs []netip.Prefix
	// HostVeth is the node's end of its link to the bridge, inside the control namespace.
	HostVeth string

	pods []*Pod
}

// AddNode creates node namespace and Node object number len(Nodes())+1 and routes every
// node's pod CIDRs to it and its pod CIDRs to every node (as a CNI with direct routing
// would), so pods reach pods on other nodes without NAT; Options.PodRoutes leaves
// some or all of that to the CNI under test.
func (b *Bed) AddNode(name string) *Node {
	b.t.Helper()
	b.mu.Lock()
	i := len(b.nodes) + 1
	peers := append([]*Node(nil), b.nodes...)
	b.mu.Unlock()
	n := &Node{
		Netns:    Netns{NS: b.Prefix + "-" + name, bed: b},
		Name:     name,
		Index:    i,
		IPv4:     netip.MustParseAddr(fmt.Sprintf("10.10.0.%d", 10+i)),
		IPv6:     netip.MustParseAddr(fmt.Sprintf("fd00:10::%d", 10+i)),
		PodCIDRs: nodePodCIDRs(i),
		HostVeth: "node" + strconv.Itoa(i),
	}
	if i > 200 {
		b.t.Fatalf("AddNode %s: at most 200 nodes per bed", name)
	}
	if err := b.setupNode(n, peers); err != nil {
		b.t.Fatalf("AddNode %s: %v", name, err)
	}
	if err := b.createNodeObject(n); err != nil {
		b.t.Fatalf("AddNode %s: %v", name, err)
	}
	b.mu.Lock()
	b.nodes = append(b.nodes, n)
	b.mu.Unlock()
	return n
}

// routesTo are the `ip route` lines that send n's pod CIDRs to n over the fabric,
// for the control namespace (fromControl) or another node, as Options.PodRoutes says.
func (n *Node) routesTo(fromControl bool) []string {
	switch n.bed.opts.PodRoutes {
	case PodRoutesNowhere:
		return nil
	case PodRoutesFromControl:
		if !fromControl {
			return nil
		}
	}
	return []string{
		fmt.Sprintf("route add %s via %s", n.PodCIDRs[0], n.IPv4),
		fmt.Sprintf("route add %s via %s", n.PodCIDRs[1], n.IPv6),
	}
}

func (b *Bed) setupNode(n *Node, peers []*Node) error {
	// Forwarding is what makes the node a router for its pods; proxy ARP on pod veths
	// only answers when the node could forward the packet.
	if err := b.addNetns(n.NS, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return err
	}
	ctl := []string{
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", n.HostVeth, n.NS),
		fmt.Sprintf("link set %s master br0", n.HostVeth),
		fmt.Sprintf("link set %s up", n.HostVeth),
	}
	if err := ipBatch(b.Ctl.NS, append(ctl, n.routesTo(true)...)...); err != nil {
		return err
	}
	node := []string{
		fmt.Sprintf("addr add %s/24 dev eth0", n.IPv4),
		fmt.Sprintf("addr add %s/64 dev eth0 nodad", n.IPv6),
		"link set eth0 up",
		"route add default via " + ControlIPv4,
		"route add default via " + ControlIPv6,
	}
	for _, p := range peers {
		node = append(node, p.routesTo(false)...)
		if err := ipBatch(p.NS, n.routesTo(false)...); err != nil {
			return err
		}
	}
	if err := ipBatch(n.NS, node...); err != nil {
		return err
	}
	if err := waitLinkUp(b.Ctl.NS, n.HostVeth); err != nil {
		return err
	}
	return waitLinkUp(n.NS, "eth0")
}

// nodePodCIDRs are node i's pod CIDRs, IPv4 first: inside PodCIDRs, of
// NodeCIDRMaskSizeIPv4 and NodeCIDRMaskSizeIPv6 bits.
func nodePodCIDRs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:244:0:%d::/64", i)),
	}
}

// createNodeObject registers the node like a kubelet would: addresses, pod CIDRs, Ready.
func (b *Bed) createNodeObject(n *Node) error {
	obj := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   n.Name,
			Labels: map[string]string{"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux"},
			// A kubelet registers its Node with this annotation, so a Node
			// never has none; flanneld (v0.28.10) writes into the map it
			// reads and panics on a Node without annotations.
			Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
		},
	}
	// Of the bed's first family first: the kubelet's --node-ip order.
	cidrs, ips := []string{n.PodCIDRs[0].String(), n.PodCIDRs[1].String()}, n.NodeIPs()
	if b.opts.IPv6Primary {
		slices.Reverse(cidrs)
	}
	obj.Spec = corev1.NodeSpec{PodCIDR: cidrs[0], PodCIDRs: cidrs}
	status := corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: ips[0].String()},
			{Type: corev1.NodeInternalIP, Address: ips[1].String()},
			{Type: corev1.NodeHostName, Address: n.Name},
		},
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "TestBed",
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
		}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	created, err := b.client.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Node: %w", err)
	}
	created.Status = status // status is a subresource: create ignores it
	if _, err := b.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update Node status: %w", err)
	}
	return nil
}

// NodeIPs are the node's addresses, of the bed's first family first: what
// its kubelet's --node-ip lists.
func (n *Node) NodeIPs() []netip.Addr {
	if n.bed.opts.IPv6Primary {
		return []netip.Addr{n.IPv6, n.IPv4}
	}
	return []netip.Addr{n.IPv4, n.IPv6}
}

// Pods returns the node's pods, in order.
func (n *Node) Pods() []*Pod {
	n.bed.mu.Lock()
	defer n.bed.mu.Unlock()
	return append([]*Pod(nil), n.pods...)
}
