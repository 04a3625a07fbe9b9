package scenarios

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/nft"
)

// The fault tests: things go wrong around nftproxy, under load, and nothing
// is lost.

// firewall is another program's table in nftproxy's family: base chains of
// its own, a drop for another port, a set. It must stay byte-identical.
const firewall = "add table ip faults-fw; " +
	"add set ip faults-fw blocked { type ipv4_addr; elements = { 192.0.2.1 } }; " +
	"add chain ip faults-fw input { type filter hook input priority 0; policy accept; }; " +
	"add rule ip faults-fw input tcp dport 9999 drop; " +
	"add rule ip faults-fw input ip saddr @blocked drop"

func listFirewall(t *testing.T, n *testbed.Node) string {
	t.Helper()
	out, err := n.Exec(context.Background(), "nft", "list", "table", "ip", "faults-fw")
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dispatchChain returns the chain that service-ips sends proto traffic to
// addr to in n's IPv4 table: for a ClusterIP without session affinity, the
// pick chain shared by the Services with as many endpoints.
func (c *cluster) dispatchChain(n *testbed.Node, addr netip.AddrPort, proto string) string {
	c.t.Helper()
	re := regexp.MustCompile(regexp.QuoteMeta(fmt.Sprintf("%s . %s . %d ", addr.Addr(), proto, addr.Port())) +
		`comment "[^"]*" : goto ([^,\s}]+)`)
	m := re.FindStringSubmatch(c.ruleset(n))
	if m == nil {
		c.t.Fatalf("no service-ips element for %s %s in:\n%s", proto, addr, c.ruleset(n))
	}
	return m[1]
}

// TestTamperingRepaired: another process deletes a service-ips element,
// flushes the chain the ClusterIP goes to, inserts a drop rule into
// `services`, deletes the whole table. nftproxy hears of each commit from
// the kernel (no polling), repairs it within a second, even within the
// minimum sync period, counts it by kind and logs what changed and who
// changed it. A firewall table beside ours stays byte-identical throughout.
func TestTamperingRepaired(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	// Ownership would refuse the tampering; the default minimum sync
	// period (a repair does not wait for it).
	c.restartProxy(n1, withArgs(c.args[n1.Name], "--own-tables=false", "--iptables-min-sync-period=1s"))
	n1.MustExec(t, "nft", firewall)
	fw := listFirewall(t, n1)

	a := c.backend(0, "tamper-a")
	client := n1.AddPod("tamper-client")
	ips := c.service("tamper", 80, false, v1.ProtocolTCP)
	c.endpoints("tamper", backendPort, a)
	addr := vip(ips, 80)
	c.eventually(client.Netns, "tcp", addr, 3, "tamper-a", onlyFrom("tamper-a"))
	chain := c.dispatchChain(n1, addr, "tcp")

	tampers := []struct{ name, nft, kind string }{
		{"delete a service-ips element", fmt.Sprintf("delete element ip nftproxy service-ips { %s . tcp . 80 }", ips[0]), "element"},
		{"flush the chain the ClusterIP goes to", "flush chain ip nftproxy " + chain, "rule"},
		{"insert a drop rule into services", "insert rule ip nftproxy services drop", "rule"},
		{"delete the table", "delete table ip nftproxy", "table"},
	}
	for _, tc := range tampers {
		t.Run(tc.name, func(t *testing.T) {
			cc := c.sub(t)
			want := cc.tables(n1)
			before := cc.metric(n1, "nftproxy_repairs_total", "ip_family=IPv4", "kind="+tc.kind)
			logged := len(cc.proxy[n1.Name].Log())
			// A repair starts at once unless the last one started less
			// than the minimum sync period ago.
			time.Sleep(time.Second)
			start := time.Now()
			n1.MustExec(t, "nft", tc.nft)
			var took time.Duration
			// Until the repair, a table may be missing: nft cannot list it.
			for got, err := testbed.Tables(n1.Netns); got != want; got, err = testbed.Tables(n1.Netns) {
				if took = time.Since(start); took > 5*time.Second {
					t.Fatalf("not repaired after %v (%v):\n%s", took, err, firstDifferences(got, want, 10))
				}
			}
			took = time.Since(start)
			t.Logf("TAMPER %s: repaired in %v", tc.name, took.Round(time.Millisecond))
			if took > time.Second {
				t.Errorf("repaired in %v, want ≤ 1 s", took)
			}
			cc.eventually(client.Netns, "tcp", addr, 3, "tamper-a", onlyFrom("tamper-a"))
			if after := cc.metric(n1, "nftproxy_repairs_total", "ip_family=IPv4", "kind="+tc.kind); after != before+1 {
				t.Errorf("nftproxy_repairs_total{kind=%q} went from %v to %v, want +1", tc.kind, before, after)
			}
			log := logFrom(cc.proxy[n1.Name], logged)
			if !strings.Contains(log, `"Another process changed nftproxy's table; repairing it" process="nft"`) {
				t.Errorf("no log line naming the change and the process:\n%s", log)
			}
			if got := listFirewall(t, n1); got != fw {
				t.Errorf("the firewall table changed:\n%s\nwant\n%s", got, fw)
			}
		})
	}
}

// TestOwnedTables: by default nftproxy owns its tables (Linux 6.9). Nobody
// else can change them, `nft flush ruleset` leaves them, a restart and a
// kill -9 under load lose no connection, and --cleanup works once the
// proxy is gone.
func TestOwnedTables(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	n1.MustExec(t, "nft", firewall)
	a, b := c.backendEcho(0, "own-a"), c.backendEcho(1, "own-b")
	client := n1.AddPod("own-client")
	ips := c.service("own", 80, false, v1.ProtocolTCP)
	c.endpoints("own", backendPort, a, b)
	addr := vip(ips, 80)
	c.eventually(client.Netns, "tcp", addr, 10, "own-a and own-b", onlyFrom("own-a", "own-b"))
	want := c.tables(n1)

	l := c.startLoad(client, addr, 100, 20)
	out, err := n1.Exec(context.Background(), "nft", "insert rule ip nftproxy services drop")
	if err == nil || !strings.Contains(err.Error(), "Operation not permitted") {
		t.Errorf("another process changed the owned table: %v %s", err, out)
	}
	n1.MustExec(t, "nft", "flush ruleset")
	if got := c.tables(n1); got != want {
		t.Errorf("nft flush ruleset changed the owned table:\n%s", firstDifferences(got, want, 10))
	}
	time.Sleep(time.Second)
	c.restartProxy(n1, nil)
	time.Sleep(time.Second)
	c.proxy[n1.Name].Kill()
	time.Sleep(500 * time.Millisecond)
	c.startProxy(n1, c.args[n1.Name])
	time.Sleep(time.Second)
	expectNothingLost(t, "flush ruleset, restart and kill -9 of an owner", l.Stop())
	if got := c.tables(n1); got != want {
		t.Errorf("the tables changed:\n%s", firstDifferences(got, want, 10))
	}

	c.proxy[n1.Name].Stop(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := n1.Exec(ctx, c.args[n1.Name][0], "--cleanup"); err != nil {
		t.Fatalf("--cleanup after the owner stopped: %v\n%s", err, out)
	}
	if out, err := n1.Exec(ctx, "nft", "list", "tables"); err != nil || strings.Contains(out, "nftproxy") {
		t.Errorf("tables after --cleanup: %v\n%s", err, out)
	}
}

// backendEcho is backend with long-lived TCP connections echoed (probe
// load --hold).
func (c *cluster) backendEcho(i int, name string) *testbed.Pod {
	p := c.nodes[i].AddPod(name)
	p.Start(c.probe, "serve", "--name", name, "--port", fmt.Sprint(backendPort), "--tcp", "--echo")
	return p
}

// syncFailures returns the times of the failed syncs in a proxy's log
// (klog's "E" lines, this day's times).
var syncFailedLine = regexp.MustCompile(`(?m)^E\d{4} (\d\d:\d\d:\d\d\.\d{6}) .*"Sync failed`)

func syncFailures(log string, day time.Time) []time.Time {
	var out []time.Time
	for _, m := range syncFailedLine.FindAllStringSubmatch(log, -1) {
		tod, err := time.ParseInLocation("15:04:05.000000", m[1], time.Local)
		if err != nil {
			continue
		}
		y, mo, d := day.Date()
		out = append(out, time.Date(y, mo, d, tod.Hour(), tod.Minute(), tod.Second(), tod.Nanosecond(), time.Local))
	}
	return out
}

// TestRefusedTransactions: another process owns nftproxy's table when
// nftproxy starts (a stale second proxy, say) while a Service's endpoints
// change every 50 ms. The kernel refuses every transaction; the table stays
// as it was; each failure is counted; the retries back off and are not
// postponed by the changes; once the other process is gone (its socket
// closed), the first success comes within a second, whatever the backoff
// had reached, and nothing is lost.
func TestRefusedTransactions(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	a, b := c.backend(0, "refused-a"), c.backend(0, "refused-b")
	client := n1.AddPod("refused-client")
	ips := c.service("refused", 80, false, v1.ProtocolTCP)
	c.endpoints("refused", backendPort, a)
	addr := vip(ips, 80)
	c.eventually(client.Netns, "tcp", addr, 3, "refused-a", onlyFrom("refused-a"))

	c.proxy[n1.Name].Stop(10 * time.Second)
	before := c.ruleset(n1)
	owner := n1.Start(c.probe, "own-table", "--family", "ip", "--table", "nftproxy")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := owner.WaitForLog(ctx, "owned"); err != nil {
		t.Fatal(err)
	}
	p := n1.Start(c.args[n1.Name]...)
	c.proxy[n1.Name] = p

	// Changes keep arriving: the endpoint alternates between a and b.
	stop := make(chan struct{})
	changed := make(chan int)
	var writeErr error
	go func() {
		n := 0
		for writeErr == nil {
			select {
			case <-stop:
				changed <- n
				return
			case <-time.After(50 * time.Millisecond):
			}
			n++
			pod := a
			if n%2 == 1 {
				pod = b
			}
			writeErr = c.writeEndpoints("refused", backendPort, pod)
		}
		<-stop
		changed <- n
	}()
	time.Sleep(5 * time.Second)
	if got := c.ruleset(n1); nftCanonicalIP(got) != nftCanonicalIP(before) {
		t.Errorf("the kernel's table changed while the transactions were refused:\n%s",
			firstDifferences(nftCanonicalIP(got), nftCanonicalIP(before), 10))
	}
	released := time.Now()
	owner.Stop(10 * time.Second)
	if err := p.WaitForLog(ctx, `"Synced" ipFamily="IPv4"`); err != nil {
		t.Fatal(err)
	}
	synced := time.Now()
	time.Sleep(time.Second)
	close(stop)
	n := <-changed
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	// The last change made b the endpoint when n is odd, a otherwise.
	last, lastName := a, "refused-a"
	if n%2 == 1 {
		last, lastName = b, "refused-b"
	}
	c.endpoints("refused", backendPort, last) // the same again: nothing pending after it
	c.eventually(client.Netns, "tcp", addr, 10, lastName, onlyFrom(lastName))

	failures := syncFailures(p.Log(), time.Now())
	if len(failures) < 3 {
		t.Fatalf("%d failed syncs logged, want several:\n%s", len(failures), p.Log())
	}
	counted := c.metric(n1, "kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "ip_family=IPv4")
	if int(counted) != len(failures) {
		t.Errorf("sync failures counted %v, logged %d", counted, len(failures))
	}
	// The retries back off: each gap at least the one before (give or take
	// a scheduling delay), none longer than twice the one before.
	var gaps []time.Duration
	for i := 1; i < len(failures); i++ {
		gaps = append(gaps, failures[i].Sub(failures[i-1]))
	}
	for i := 1; i < len(gaps); i++ {
		if gaps[i] > 2*gaps[i-1]+200*time.Millisecond {
			t.Errorf("retry gaps %v: a retry was postponed", gaps)
			break
		}
	}
	step := 2 * gaps[len(gaps)-1]
	firstSuccess := synced.Sub(released)
	t.Logf("REFUSED %d failures with %d changes arriving; gaps %v; first success %v after the owner left (the next backoff step was %v)",
		len(failures), n, gaps, firstSuccess.Round(time.Millisecond), step)
	if firstSuccess > time.Second {
		t.Errorf("first success %v after the owner left, want within a second (its socket's close is seen)", firstSuccess)
	}
	c.expectFreshTables(n1)
}

// nftCanonicalIP is the canonical form of an IPv4 listing.
func nftCanonicalIP(listing string) string { return testbed.ResolveSlots(nft.Canonical(listing)) }

// TestKillNineUnderLoad: nftproxy is killed with SIGKILL at random moments,
// several times, among them during the first full sync of a restart that
// has changes to write for 10,000 Services, while a client opens 100 new
// connections a second through a ClusterIP and holds 20 long-lived ones.
// No new connection fails, no long-lived one breaks, and after the last
// restart the tables equal what a fresh proxy writes.
func TestKillNineUnderLoad(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	size := 10000
	if testing.Short() {
		size = 1000
	}
	svcs := c.storeUnanswered("kill", size)
	a, b := c.backendEcho(0, "kill-a"), c.backendEcho(1, "kill-b")
	client := n1.AddPod("kill-client")
	ips := c.service("kill-web", 80, false, v1.ProtocolTCP)
	c.endpoints("kill-web", backendPort, a, b)
	addr := vip(ips, 80)
	c.eventually(client.Netns, "tcp", addr, 10, "kill-a and kill-b", onlyFrom("kill-a", "kill-b"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	n1.MustExec(t, "nft", firewall)
	fw := listFirewall(t, n1)
	l := c.startLoad(client, addr, 100, 20)
	rnd := newRand(t)
	kills := 0
	for round := 1; round <= 5; round++ {
		c.proxy[n1.Name].Kill()
		kills++
		// Changes while the proxy is down give the next first sync work.
		c.updateSlices(svcs, round, 300)
		p := n1.Start(c.args[n1.Name]...)
		c.proxy[n1.Name] = p
		// Kill again at a random moment of that first sync (reading back,
		// building or committing: about a second at 10,000 here).
		delay := time.Duration(rnd.Int64N(int64(1500 * time.Millisecond)))
		time.Sleep(delay)
		synced := strings.Contains(p.Log(), `"Synced"`)
		p.Kill()
		kills++
		t.Logf("KILL round %d: killed %v after start (a family synced: %v)", round, delay.Round(time.Millisecond), synced)
		p = n1.Start(c.args[n1.Name]...)
		c.proxy[n1.Name] = p
		if err := waitFamiliesSynced(ctx, p, 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rnd.Int64N(int64(time.Second))))
	}
	time.Sleep(time.Second)
	expectNothingLost(t, fmt.Sprintf("%d kill -9 with %d Services", kills, size), l.Stop())
	c.expectFreshTables(n1) // with --cleanup
	if got := listFirewall(t, n1); got != fw {
		t.Errorf("the firewall table changed through the restarts and the cleanup:\n%s\nwant\n%s", got, fw)
	}
}

// storeUnanswered writes n Services <prefix>-0… into etcd (Bed.Store),
// each with port http 80/TCP and unansweredSlice's endpoints, and returns
// them.
func (c *cluster) storeUnanswered(prefix string, n int) []testbed.StoredService {
	c.t.Helper()
	svcs := make([]testbed.StoredService, n)
	for i := range svcs {
		name := fmt.Sprintf("%s-%d", prefix, i)
		svcs[i] = testbed.StoredService{Name: name,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
			Slice: unansweredSlice(name, i, 0)}
	}
	if _, err := c.bed.Store(c.ns, svcs); err != nil {
		c.t.Fatal(err)
	}
	return svcs
}

// unansweredSlice is Service name's EndpointSlice of generation gen: two
// endpoints in 10.128.0.0/9, never sent traffic.
func unansweredSlice(name string, i, gen int) *discovery.EndpointSlice {
	port, proto, pname := int32(backendPort), v1.ProtocolTCP, "http"
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discovery.LabelServiceName: name}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for j := range 2 {
		n := uint32(10<<24|128<<16) + uint32((i*2+j+gen*7919)%(1<<23))
		addr := netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr.String()}})
	}
	return es
}

// updateSlices gives count of svcs the endpoints of generation gen, through
// the API.
func (c *cluster) updateSlices(svcs []testbed.StoredService, gen, count int) {
	c.t.Helper()
	ctx := context.Background()
	work := make(chan int)
	errs := make(chan error, count)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for k := range work {
				es := unansweredSlice(svcs[k].Name, k, gen)
				cur, err := c.client.DiscoveryV1().EndpointSlices(c.ns).Get(ctx, es.Name, metav1.GetOptions{})
				if err == nil {
					cur.Endpoints = es.Endpoints
					_, err = c.client.DiscoveryV1().EndpointSlices(c.ns).Update(ctx, cur, metav1.UpdateOptions{})
				}
				errs <- err
			}
		})
	}
	for i := range count {
		work <- (gen*7919 + i*31) % len(svcs)
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			c.t.Fatal(err)
		}
	}
}

// newRand returns a random source whose seed the test logs, so that a
// failing run can be repeated.
func newRand(t *testing.T) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	t.Logf("random seed %d", seed)
	return rand.New(rand.NewPCG(seed, 0))
}
