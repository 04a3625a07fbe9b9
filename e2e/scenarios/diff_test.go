package scenarios

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestDiff: once the proxies synced Services of several kinds, `nftproxy
// diff` with each node's own command line exits 0 and prints nothing, on
// n2 while its proxy owns the tables. With n1's proxy stopped (SIGSTOP;
// its tables not owned), another process deletes a ClusterIP from
// cluster-ips, adds a foreign one and puts a rule first in the chain its
// ClusterIP goes to: diff exits 1 and names exactly those three;
// continued, the proxy repairs them and diff is clean again.
func TestDiff(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	c.restartProxy(n1, withArgs(c.args[n1.Name], "--own-tables=false", "--profiling"))
	a, b := c.backend(0, "a"), c.backend(1, "b")
	ips := c.service("web", 80, true, v1.ProtocolTCP, v1.ProtocolUDP)
	c.endpoints("web", backendPort, a, b)
	c.extCreate("lb", v1.ServiceTypeLoadBalancer, true, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "2001:db8::/64"}
		s.Spec.ExternalIPs = []string{"203.0.113.7"}
	})
	c.endpoints("lb", backendPort, a, b)
	c.extCreate("sticky", v1.ServiceTypeNodePort, false, func(s *v1.Service) {
		timeout := int32(300)
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
	})
	c.endpoints("sticky", backendPort, a)
	c.service("empty", 80, false, v1.ProtocolTCP)

	for _, n := range c.nodes {
		c.awaitDumpEqualsKernel(n) // the proxy synced them all
		if code, out := c.diff(n); code != 0 || out != "" {
			t.Fatalf("%s: diff of a synced node: exit %d:\n%s", n.Name, code, out)
		}
	}

	c.debugEqualsCommands(n1, a, netip.AddrPortFrom(ips[0], 80))

	chain := c.dispatchChain(n1, netip.AddrPortFrom(ips[0], 80), "tcp") // pick-tcp-2, shared with lb
	proxy := c.proxy[n1.Name]
	if err := proxy.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	continued := false
	defer func() {
		if !continued {
			proxy.Signal(syscall.SIGCONT)
		}
	}()
	n1.MustExec(t, "nft", fmt.Sprintf("delete element ip nftproxy cluster-ips { %s }; "+
		"add element ip nftproxy cluster-ips { 10.96.255.254 }; insert rule ip nftproxy %s counter", ips[0], chain))
	code, out := c.diff(n1)
	t.Logf("diff of the tampered table:\n%s", out)
	want := []string{
		"table ip nftproxy: cluster-ips elements differ: 1 missing, 1 extra\n" +
			"\t- element 10.96.255.254\n\t+ element " + ips[0].String() + "\n",
		"table ip nftproxy: chain " + chain + " rules differ: the kernel has 2 rules, 1 rule desired; desired:\n",
	}
	if code != 1 || !strings.HasPrefix(out, want[0]) || !strings.Contains(out, want[1]) || strings.Count(out, "table ") != 2 {
		t.Errorf("diff of the tampered table: exit %d, want 1 and exactly:\n%s%s\t+ <the rule desired>", code, want[0], want[1])
	}
	// explain follows the tampered table: the rule added to the Service's
	// chain is on the path, named as what nftproxy cannot decode. Then a
	// rule dropping the ClusterIP, put first in chain services, takes over.
	vip := netip.AddrPortFrom(ips[0], 80)
	outcomes, text := c.explainOn(n1, a.IPv4.String(), "tcp", vip)
	if len(outcomes) != 2 || !strings.Contains(text, "warning: chain "+chain+": rule \"[counter]\"") {
		t.Errorf("explain of the tampered Service: %+v\n%s", outcomes, text)
	}
	n1.MustExec(t, "nft", "insert", "rule", "ip", "nftproxy", "services", "ip", "daddr", ips[0].String(), "drop", "comment", `"tampered"`)
	outcomes, text = c.explainOn(n1, a.IPv4.String(), "tcp", vip)
	if len(outcomes) != 1 || outcomes[0].Verdict != "drop" || outcomes[0].Reason != "tampered" {
		t.Errorf("explain after a drop rule was inserted: %+v\n%s", outcomes, text)
	}
	if lines := c.dial(a.Netns, "tcp", vip, 2); !slices.Equal(lines, []string{"timeout", "timeout"}) {
		t.Errorf("a connection through the tampered table: %q, want it dropped (timeout)", lines)
	}
	t.Logf("explain of the tampered table:\n%s", text)
	continued = true
	if err := proxy.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, out := c.diff(n1)
		if code == 0 && out == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not repair the table within 10 s: exit %d:\n%s", code, out)
		}
	}
}

// diff runs `nftproxy diff` in n with its proxy's command line and returns
// the exit status (1 is no error: the tables differ) and standard output.
func (c *cluster) diff(n *testbed.Node) (int, string) {
	c.t.Helper()
	args := c.args[n.Name]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := n.Exec(ctx, slices.Concat(args[:1], []string{"diff"}, args[1:])...)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, out
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return 1, out
	}
	c.t.Fatalf("%s: nftproxy diff: %v\n%s", n.Name, err, out)
	return 2, out
}

// debugEqualsCommands: node n's running proxy (with --profiling) answers
// /debug/nftproxy/dump, diff and explain on its metrics server as the
// commands of the same names do from the node.
func (c *cluster) debugEqualsCommands(n *testbed.Node, client *testbed.Pod, vip netip.AddrPort) {
	c.t.Helper()
	get := func(path string) string {
		code, body, err := extHTTPGet(n.Netns, "http://127.0.0.1:10249/debug/nftproxy/"+path)
		if err != nil || code != http.StatusOK {
			c.t.Fatalf("%s: GET /debug/nftproxy/%s: %d %v\n%s", n.Name, path, code, err, body)
		}
		return body
	}
	if got, want := get("dump"), n.MustExec(c.t, c.dumpCommand(n)...); got != want {
		c.t.Errorf("%s: /debug/nftproxy/dump differs from nftproxy dump:\n%s", n.Name, firstDifferences(got, want, 20))
	}
	if got := get("diff"); got != "no differences\n" {
		c.t.Errorf("%s: /debug/nftproxy/diff of a synced node: %q", n.Name, got)
	}
	_, want := c.explainOn(n, client.IPv4.String(), "tcp", vip)
	if got := get("explain?from=" + client.IPv4.String() + "&to=" + vip.String()); got != want {
		c.t.Errorf("%s: /debug/nftproxy/explain:\n%s\nnftproxy explain:\n%s", n.Name, got, want)
	}
	if code, body, _ := extHTTPGet(n.Netns, "http://127.0.0.1:10249/debug/nftproxy/explain?to=nowhere"); code != http.StatusBadRequest {
		c.t.Errorf("%s: /debug/nftproxy/explain?to=nowhere: %d %q, want 400", n.Name, code, body)
	}
}
