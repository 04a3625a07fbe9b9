package cni

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// foreignBit is a mark bit another program on the node sets (a service
// mesh, a CNI): not one of the proxy's (0x4000, 0x8000).
const foreignBit = 0x1

// TestFlannelForeignMark: flannel's nftables mode returns from its nat
// postrouting chain only on a mark of exactly 0x4000, and masquerades
// what goes from the pod network to outside it. With flannel's chain
// registered first, a connection the proxy marked for masquerading
// (--masquerade-all) from a pod to an endpoint outside the pod network,
// whose packets carry another program's mark bit besides ours, is
// masqueraded by flannel, and the proxy's chain, which clears our bit as
// it masquerades, never sees it. The packet must still leave the node
// without our bit. kube-proxy's result is logged beside.
func TestFlannelForeignMark(t *testing.T) {
	testbed.RequirePrivileges(t)
	bins := binaries{
		flanneld:  flanneldPath(t),
		nftproxy:  testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy"),
		kubeProxy: kubeProxyPath(t),
		probe:     testbed.ProbePath(t),
	}
	for _, proxy := range proxies {
		t.Run(proxy, func(t *testing.T) {
			b := newFlannelBed(t, proxy, "nftables", bins, false, "--masquerade-all")
			const port = 8081
			b.bed.Ctl.Start(bins.probe, "serve", "--name", "outside", "--port", strconv.Itoa(port), "--tcp")
			vip := b.outsideService(port)
			n1, client := b.nodes[0], b.clients[0]
			b.eventually(client.Netns, vip)
			n1.MustExec(t, "nft", "add", "rule", "inet", watchTable, "foreign", "ip", "saddr", strings.Split(clusterCIDRs, ",")[0],
				"meta", "mark", "set", "meta", "mark", "|", strconv.Itoa(foreignBit))
			before, premasq := markedPackets(t, n1), counterPackets(t, n1, "premasq")
			got := answers(b.dial(client.Netns, vip, 16, 0))
			if len(got) != 16 {
				t.Fatalf("%s → %s: %d of 16 answered", client.Name, vip, len(got))
			}
			for _, a := range got {
				if a.peer != n1.IPv4 {
					t.Errorf("the server outside saw %s, want %s's address %s (one masquerade)", a.peer, n1.Name, n1.IPv4)
				}
			}
			if n := counterPackets(t, n1, "premasq") - premasq; n < 16 {
				t.Fatalf("%d packets reached the nat postrouting chains with the masquerade bit, want one per connection (16)", n)
			}
			marked := markedPackets(t, n1) - before
			switch {
			case marked == 0:
			case proxy == "kube-proxy":
				t.Logf("%d packets left %s with the masquerade mark bit set (kube-proxy: not checked)", marked, n1.Name)
			default:
				t.Errorf("%d packets left %s with the masquerade mark bit set\n%s", marked, n1.Name,
					n1.MustExec(t, "nft", "list", "ruleset"))
			}
		})
	}
}

// outsideService creates a selector-less IPv4 ClusterIP Service whose one
// endpoint is the control namespace's port (outside the pod network), and
// returns its ClusterIP and port.
func (b *flannelBed) outsideService(port int32) netip.AddrPort {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := b.bed.Client()
	svc, err := client.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "outside", Namespace: "default"},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "tcp", Protocol: v1.ProtocolTCP, Port: servicePort,
			TargetPort: intstr.FromInt32(port)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	name, proto := "tcp", v1.ProtocolTCP
	if _, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "outside", Namespace: "default",
			Labels: map[string]string{discovery.LabelServiceName: svc.Name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{testbed.ControlIPv4}}},
	}, metav1.CreateOptions{}); err != nil {
		b.t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), servicePort)
}
