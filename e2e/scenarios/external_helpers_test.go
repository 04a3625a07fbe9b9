package scenarios

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// Helpers of TestExternal: Services reached from outside the cluster.

// newExtCluster is newCluster with the nodes' ICMP rate limits lifted, so
// that every rejected UDP datagram gets its port unreachable.
func newExtCluster(t *testing.T) *cluster {
	return newClusterWith(t, func(n *testbed.Node) {
		if _, err := n.Exec(context.Background(), "sysctl", "-q", "-w", "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0"); err != nil {
			t.Fatal(err)
		}
	})
}

// extCreate creates a selector-less Service with one TCP port "tcp" (80),
// of type typ, after mutate had its say, and returns what the API server
// made of it (allocated ClusterIPs, nodePort, healthCheckNodePort).
func (c *cluster) extCreate(name string, typ v1.ServiceType, dualStack bool, mutate func(*v1.Service)) *v1.Service {
	c.t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: v1.ServiceSpec{Type: typ,
			Ports: []v1.ServicePort{{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	return createService(c.t, c.client, svc, dualStack, mutate)
}

// extUpdate changes a Service's spec (retrying on conflicts).
func (c *cluster) extUpdate(name string, mutate func(*v1.Service)) *v1.Service {
	c.t.Helper()
	var out *v1.Service
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.client.CoreV1().Services(c.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		mutate(svc)
		out, err = c.client.CoreV1().Services(c.ns).Update(context.Background(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		c.t.Fatalf("update service %s: %v", name, err)
	}
	return out
}

// extSetIngress writes status.loadBalancer.ingress, as a cloud controller would.
func (c *cluster) extSetIngress(name string, ingress ...v1.LoadBalancerIngress) {
	c.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc, err := c.client.CoreV1().Services(c.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		svc.Status.LoadBalancer.Ingress = ingress
		_, err = c.client.CoreV1().Services(c.ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		c.t.Fatalf("update status of service %s: %v", name, err)
	}
}

// extNodePort is the (first) nodePort the API server allocated.
func extNodePort(t interface{ Fatalf(string, ...any) }, svc *v1.Service) uint16 {
	if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].NodePort == 0 {
		t.Fatalf("service %s has no nodePort: %+v", svc.Name, svc.Spec.Ports)
	}
	return uint16(svc.Spec.Ports[0].NodePort)
}

// extRouteVia adds (or replaces) a /32 or /128 route to dst via gw in a namespace,
// so that an outside client sends an external or LB IP to a chosen node.
func (c *cluster) extRouteVia(ns testbed.Netns, dst, gw netip.Addr) {
	c.t.Helper()
	if _, err := ns.Exec(context.Background(), "ip", "route", "replace", netip.PrefixFrom(dst, dst.BitLen()).String(), "via", gw.String()); err != nil {
		c.t.Fatal(err)
	}
}

// extAwait is eventually with a failure report showing both nodes'
// extRulesets of the address's family.
func (c *cluster) extAwait(from testbed.Netns, proto string, addr netip.AddrPort, count int, what string, check func([]string) bool) []string {
	c.t.Helper()
	var lines []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if lines = c.dial(from, proto, addr, count); check(lines) {
			c.t.Logf("%s %s from %s: %s: %s", proto, addr, strings.TrimPrefix(from.NS, c.bed.Prefix+"-"), what, summarize(lines))
			c.explained(from, proto, addr, lines)
			return lines
		}
	}
	c.t.Fatalf("%s %s from %s: want %s, last got %q\n%s", proto, addr, from.NS, what, lines, c.extRulesets(addr.Addr().Is6()))
	return nil
}

// extRulesets lists the nftproxy table of the family on every proxied node.
func (c *cluster) extRulesets(v6 bool) string {
	fam := "ip"
	if v6 {
		fam = "ip6"
	}
	var b strings.Builder
	for _, n := range c.nodes {
		out, err := n.Exec(context.Background(), "nft", "list", "table", fam, "nftproxy")
		if err != nil {
			out = err.Error()
		}
		fmt.Fprintf(&b, "--- %s: nft list table %s nftproxy\n%s\n", n.Name, fam, out)
	}
	return b.String()
}

// extPeersAre accepts lines whose every answer came from one of names and saw
// the client as peer (the address part of PEER), and that hold no failure.
func extPeersAre(peer netip.Addr, names ...string) func([]string) bool {
	from := onlyFrom(names...)
	return func(lines []string) bool {
		if !from(lines) {
			return false
		}
		for _, l := range lines {
			f := strings.Fields(l)
			ap, err := netip.ParseAddrPort(f[1])
			if err != nil || ap.Addr() != peer {
				return false
			}
		}
		return true
	}
}

// extNoBackend accepts lines in which no server answered (timeout, unreachable,
// refused: anything but "NAME PEER").
func extNoBackend(lines []string) bool {
	return len(lines) > 0 && len(answeredBy(lines)) == 0
}

// extHTTPGet fetches url from inside a namespace and returns status and body.
func extHTTPGet(from testbed.Netns, url string) (int, string, error) {
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return from.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(body), err
}

// extHealthBody is the JSON answer of a Service health check (upstream's shape).
type extHealthBody struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// extHealth polls a health check URL until it answers code with a
// body for Service name holding localEndpoints local endpoints.
func (c *cluster) extHealth(from testbed.Netns, url string, code int, name string, local int) extHealthBody {
	c.t.Helper()
	var (
		got    int
		body   string
		err    error
		parsed extHealthBody
	)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		got, body, err = extHTTPGet(from, url)
		if err != nil || got != code {
			continue
		}
		parsed = extHealthBody{}
		if json.Unmarshal([]byte(body), &parsed) != nil {
			continue
		}
		if parsed.Service.Namespace == c.ns && parsed.Service.Name == name && parsed.LocalEndpoints == local && parsed.ServiceProxyHealthy {
			return parsed
		}
	}
	c.t.Fatalf("GET %s from %s: want %d for %s/%s with localEndpoints %d, last got %d %q (err %v)",
		url, from.NS, code, c.ns, name, local, got, body, err)
	return parsed
}

// extWithUDP adds port "udp" (80/UDP) to a Service made by extCreate.
func extWithUDP(s *v1.Service) {
	s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "udp", Port: 80, Protocol: v1.ProtocolUDP})
}
