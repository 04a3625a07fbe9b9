package scenarios

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestNodeChanges: nftproxy follows its Node object while it runs, where
// kube-proxy v1.37 exits with status 1 when the Node's addresses change or
// the Node is deleted (pkg/proxy/node.go) and counts on being restarted:
//
//   - the Node's IPv4 InternalIP moves to another address of the node:
//     the NodePort answers there, and no longer on the old address;
//   - the Node is deleted: nftproxy keeps serving with the rules it has
//     (the NodePort on the address last seen, the ClusterIP), and its
//     /healthz answers 503, so that load balancers take the node out;
//   - the Node is created again: /healthz answers 200.
//
// nftproxy never exits or restarts meanwhile.
func TestNodeChanges(t *testing.T) {
	c := newCluster(t)
	n1, n2 := c.nodes[0], c.nodes[1]
	a := c.backend(1, "nc-a")
	client := n2.AddPod("nc-client")
	svc := c.extCreate("nc", v1.ServiceTypeNodePort, false, nil)
	np := extNodePort(t, svc)
	c.endpoints("nc", backendPort, a)
	clusterIP := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	oldAddr := netip.AddrPortFrom(n1.IPv4, np)
	c.eventually(client.Netns, "tcp", oldAddr, 5, "nc-a on n1's NodePort", onlyFrom("nc-a"))
	proxy := c.proxy[n1.Name]
	running := func(when string) {
		t.Helper()
		select {
		case <-proxy.Done():
			t.Fatalf("nftproxy on %s exited %s: %v\n%s", n1.Name, when, proxy.Err(), proxy.Log())
		default:
		}
		if n := strings.Count(proxy.Log(), "Informers synced"); n != 1 {
			t.Fatalf("nftproxy on %s started its sync loop %d times (%s)", n1.Name, n, when)
		}
	}

	t.Run("the Node's address changes", func(t *testing.T) {
		// A second address on n1's fabric interface, then the Node's IPv4
		// InternalIP moved to it, as when a node is renumbered.
		newIP := netip.MustParseAddr("10.10.0.199")
		if _, err := n1.Exec(context.Background(), "ip", "addr", "add", newIP.String()+"/32", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		newAddr := netip.AddrPortFrom(newIP, np)
		c.eventually(client.Netns, "tcp", newAddr, 3, "refused on the new address before the Node names it", all("refused"))
		setNodeIPv4(t, c, n1.Name, n1.IPv4, newIP)
		c.eventually(client.Netns, "tcp", newAddr, 5, "nc-a on the Node's new address", onlyFrom("nc-a"))
		c.eventually(client.Netns, "tcp", oldAddr, 3, "refused on the old address (no NodePort there now)", all("refused"))
		running("after the Node's address changed")
	})

	var deleted *v1.Node
	t.Run("the Node is deleted", func(t *testing.T) {
		ctx := context.Background()
		var err error
		if deleted, err = c.client.CoreV1().Nodes().Get(ctx, n1.Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.client.CoreV1().Nodes().Delete(ctx, n1.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitHealthz(t, n1, false)
		// The rules stay as they were: the NodePort on the address last
		// seen, the ClusterIP; a change of endpoints still applies.
		newAddr := netip.AddrPortFrom(netip.MustParseAddr("10.10.0.199"), np)
		c.eventually(client.Netns, "tcp", newAddr, 5, "nc-a on the NodePort", onlyFrom("nc-a"))
		pod := n1.AddPod("nc-client-n1")
		c.eventually(pod.Netns, "tcp", clusterIP, 5, "nc-a through the ClusterIP on n1", onlyFrom("nc-a"))
		b := c.backend(1, "nc-b")
		c.endpoints("nc", backendPort, b)
		c.eventually(pod.Netns, "tcp", clusterIP, 5, "nc-b after an endpoint change", onlyFrom("nc-b"))
		time.Sleep(2 * time.Second)
		running("after the Node was deleted")
	})

	t.Run("the Node is created again", func(t *testing.T) {
		if deleted == nil {
			t.Skip("the Node was not deleted")
		}
		ctx := context.Background()
		node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: deleted.Name, Labels: deleted.Labels}, Spec: v1.NodeSpec{PodCIDR: deleted.Spec.PodCIDR, PodCIDRs: deleted.Spec.PodCIDRs}}
		created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = deleted.Status
		if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitHealthz(t, n1, true)
		running("after the Node was created again")
	})
}

// setNodeIPv4 replaces the Node's InternalIP from with to.
func setNodeIPv4(t *testing.T, c *cluster, name string, from, to netip.Addr) {
	t.Helper()
	ctx := context.Background()
	node, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	replaced := false
	for i, a := range node.Status.Addresses {
		if a.Type == v1.NodeInternalIP && a.Address == from.String() {
			node.Status.Addresses[i].Address, replaced = to.String(), true
		}
	}
	if !replaced {
		t.Fatalf("Node %s has no InternalIP %s: %v", name, from, node.Status.Addresses)
	}
	if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitHealthz waits up to 10 s for the node's /healthz to answer 200 (ok)
// or not.
func waitHealthz(t *testing.T, n *testbed.Node, ok bool) {
	t.Helper()
	var last string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		body, err := n.HTTPGet(ctx, "http://127.0.0.1:10256/healthz")
		cancel()
		if (err == nil) == ok {
			return
		}
		last = strings.TrimSpace(body)
		if err != nil {
			last = err.Error() + " " + last
		}
	}
	t.Fatalf("%s /healthz: want ok=%v within 10 s, last %s", n.Name, ok, last)
}
