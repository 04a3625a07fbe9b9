package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// apiOutage is how long TestAPIServerOutage keeps the API server down:
// longer than client-go's reflector backoff needs to reach its 30 s cap.
const apiOutage = 60 * time.Second

// recoveryBudget is how long after the API server is ready again a change
// may take to reach the data path: a probe interval with its jitter, and
// for a watch the server cannot resume, the window relists are spread over
// (so that a cluster's nodes do not all relist at once), its relist and a
// sync.
const recoveryBudget = 3 * time.Second

// TestAPIServerOutage: the API server stops for a minute while nftproxy
// runs. Traffic through its rules is unaffected, /healthz stays 200 (nothing
// is pending: the proxy is healthy), and once the server is back, changes
// reach the data path within recoveryBudget of its being ready: one written
// the moment the restarted server accepts writes, before /readyz passes and
// so before the proxy can have reconnected, and one written right after it
// is ready. client-go's reflectors alone would wait out their backoff (up to
// 30 s, doubled by jitter).
func TestAPIServerOutage(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	a, b := c.backendEcho(1, "a"), c.backendEcho(1, "b")
	client := n1.AddPod("client")
	svcs := []string{"during", "after"}
	addrs := map[string]netip.AddrPort{}
	for _, name := range svcs {
		addrs[name] = vip(c.service(name, 80, false, v1.ProtocolTCP), 80)
		c.endpoints(name, backendPort, a)
	}
	for _, name := range svcs {
		c.eventually(client.Netns, "tcp", addrs[name], 3, "a", onlyFrom("a"))
	}
	// A new connection every 10 ms, and 10 long-lived ones, through each
	// ClusterIP.
	loads := map[string]*testbed.Load{}
	for _, name := range svcs {
		loads[name] = c.startLoad(client, addrs[name], 100, 10)
	}
	time.Sleep(time.Second)

	c.bed.StopAPIServer()
	down := time.Now()
	t.Logf("OUTAGE API server stopped; polling /healthz on %s for %v", n1.Name, apiOutage)
	health := pollHealthz(n1, apiOutage)

	wrote := make(chan error, 1)
	var wroteDuring time.Time
	go func() {
		// The restarted server accepts writes before /readyz passes.
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
			err := c.writeEndpoints("during", backendPort, b)
			if err == nil {
				wroteDuring = time.Now()
			}
			if err == nil || time.Now().After(deadline) {
				wrote <- err
				return
			}
		}
	}()
	ready := c.bed.StartAPIServer()
	if err := <-wrote; err != nil {
		t.Fatalf("write during the restart: %v", err)
	}
	if err := c.writeEndpoints("after", backendPort, b); err != nil {
		t.Fatal(err)
	}
	wroteAfter := time.Now()
	if !wroteDuring.Before(ready) {
		t.Logf("OUTAGE note: the restarted server took the \"during\" write only once ready; both writes are \"after\"")
	}
	t.Logf("OUTAGE API server down %v; ready at +0; \"during\" written at %+v, \"after\" at %+v",
		ready.Sub(down).Round(time.Millisecond), wroteDuring.Sub(ready).Round(time.Millisecond),
		wroteAfter.Sub(ready).Round(time.Millisecond))

	seen := c.waitAnswers(client.Netns, addrs, "b", 30*time.Second)
	for _, name := range svcs {
		took := seen[name].Sub(ready)
		t.Logf("OUTAGE %q visible in the data path %v after the API server was ready", name, took.Round(time.Millisecond))
		if seen[name].IsZero() || took > recoveryBudget {
			t.Errorf("%q: endpoint move not in the data path within %v of the API server being ready (took %v)",
				name, recoveryBudget, took)
		}
	}
	if len(health) > 0 {
		t.Errorf("/healthz on %s during the outage: %d failures, first: %s", n1.Name, len(health), health[0])
	}
	for _, name := range svcs {
		expectNothingLost(t, "OUTAGE load through "+name, loads[name].Stop())
	}
}

// TestStartWithoutAPIServer: nftproxy started while the API server is
// down neither exits nor programs anything; once the server is ready it
// syncs within recoveryBudget, and its tables are exactly a fresh proxy's,
// the DROP for unallocated ClusterIPs of the ServiceCIDR objects included
// (the proxy has no --service-cidr: that rule can only come from them).
func TestStartWithoutAPIServer(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	a := c.backend(1, "a")
	client := n1.AddPod("client")
	addr := vip(c.service("web", 80, false, v1.ProtocolTCP), 80)
	c.endpoints("web", backendPort, a)
	const extraCIDR = "10.100.0.0/16"
	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{extraCIDR}}}
	if _, err := c.client.NetworkingV1().ServiceCIDRs().Create(context.Background(), sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.eventually(client.Netns, "tcp", addr, 3, "a", onlyFrom("a"))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c.proxy[n1.Name].Stop(10 * time.Second)
	if out, err := n1.Exec(ctx, c.args[n1.Name][0], "--cleanup"); err != nil {
		t.Fatalf("nftproxy --cleanup: %v\n%s", err, out)
	}
	c.bed.StopAPIServer()
	p := n1.Start(c.args[n1.Name]...)
	c.proxy[n1.Name] = p
	time.Sleep(5 * time.Second)
	select {
	case <-p.Done():
		t.Fatalf("nftproxy exited while the API server was down: %v\n%s", p.Err(), p.Log())
	default:
	}
	if tables, err := testbed.Tables(n1.Netns); err == nil {
		t.Fatalf("nftproxy programmed %s without the API:\n%s", n1.Name, tables)
	}

	ready := c.bed.StartAPIServer()
	if err := waitFamiliesSynced(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
	took := time.Since(ready)
	t.Logf("START first sync %v after the API server was ready", took.Round(time.Millisecond))
	if took > recoveryBudget {
		t.Errorf("first sync %v after the API server was ready, want at most %v", took, recoveryBudget)
	}
	if tables := c.tables(n1); !strings.Contains(tables, "ip daddr "+extraCIDR+" drop") {
		t.Errorf("no DROP for unallocated addresses of ServiceCIDR extra (%s) on %s:\n%s", extraCIDR, n1.Name, tables)
	}
	c.eventually(client.Netns, "tcp", addr, 3, "a", onlyFrom("a"))
	c.expectFreshTables(n1)
}

// pollHealthz asks node n's /healthz every 100 ms for d and returns every
// answer that was not a 200.
func pollHealthz(n *testbed.Node, d time.Duration) []string {
	var failures []string
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if body, err := n.HTTPGet(ctx, "http://127.0.0.1:10256/healthz"); err != nil {
			failures = append(failures, fmt.Sprintf("%s: %v %s", time.Now().Format("15:04:05.000"), err, body))
		}
		cancel()
	}
	return failures
}

// waitAnswers dials each address from ns until backend want answers it and
// returns when it first did, per address (zero: not within timeout).
func (c *cluster) waitAnswers(ns testbed.Netns, addrs map[string]netip.AddrPort, want string, timeout time.Duration) map[string]time.Time {
	seen := map[string]time.Time{}
	for deadline := time.Now().Add(timeout); len(seen) < len(addrs) && time.Now().Before(deadline); {
		for name, addr := range addrs {
			if !seen[name].IsZero() {
				continue
			}
			out, err := ns.Exec(context.Background(), c.probe, "dial", "--proto", "tcp", "--addr", addr.String(), "--timeout", "1s")
			if err == nil && strings.HasPrefix(out, want+" ") {
				seen[name] = time.Now()
			}
		}
	}
	return seen
}
