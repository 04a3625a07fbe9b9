package proxier

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/trace"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/servicehealth"
)

func udpFlow(client, vip, backend string) conntrack.Flow {
	c, v, b := netip.MustParseAddrPort(client), netip.MustParseAddrPort(vip), netip.MustParseAddrPort(backend)
	return conntrack.Flow{Proto: conntrack.ProtoUDP, Orig: conntrack.Tuple{Src: c, Dst: v}, Reply: conntrack.Tuple{Src: b, Dst: c}}
}

// TestConntrackFamilies: the cleanup converts a table's family to
// conntrack's by value (conntrack.Family(f)), which holds only if nft's
// NFPROTO values are conntrack's AF values.
func TestConntrackFamilies(t *testing.T) {
	for _, c := range []struct {
		f    nft.Family
		want conntrack.Family
	}{{nft.IPv4, conntrack.IPv4}, {nft.IPv6, conntrack.IPv6}} {
		if got := conntrack.Family(c.f); got != c.want {
			t.Errorf("conntrack.Family(%v) = %v, want %v", c.f, got, c.want)
		}
	}
}

// startDNSAndWeb starts a proxier with ct as its conntrack backend, a UDP
// Service kube-system/dns (10.96.0.53:53, one endpoint 10.244.1.20:5353)
// and a TCP Service default/web without endpoints, and waits until dns is
// programmed. It returns the packet a client sends to dns.
func startDNSAndWeb(t *testing.T, ct conntrack.Interface) (*harness, trace.Packet) {
	t.Helper()
	h := startWith(t, func(d *Deps) { d.Conntrack = ct },
		service("kube-system", "dns", "10.96.0.53", 53, v1.ProtocolUDP),
		slice("kube-system", "dns", "dns-1", 5353, v1.ProtocolUDP, "10.244.1.20"),
		service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP))
	udp := tcp("10.96.0.53", 53)
	udp.Proto = nft.ProtoUDP
	h.eventually(udp, nft.VerdictAccept, "10.244.1.20:5353")
	return h, udp
}

// giveWebAnEndpoint gives the TCP Service default/web of startDNSAndWeb an
// endpoint and checks that this change, which adds no TCP frontend and no
// UDP or SCTP one, started no conntrack cleanup.
func giveWebAnEndpoint(t *testing.T, h *harness, ct *conntrack.Fake) {
	t.Helper()
	calls := len(ct.Reconciles())
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")
	if n := len(ct.Reconciles()); n != calls {
		t.Errorf("a TCP endpoint change reconciled conntrack (%d calls, was %d)", n, calls)
	}
}

// TestConntrackCleanedAfterUDPChange: moving a UDP Service to a new backend
// deletes the flow still DNATed to the old one; a TCP change does not even
// dump the table; deleting the Service deletes its flows.
func TestConntrackCleanedAfterUDPChange(t *testing.T) {
	stale := udpFlow("10.244.1.5:40000", "10.96.0.53:53", "10.244.1.20:5353")
	other := udpFlow("10.244.1.5:40001", "10.96.0.99:53", "10.244.1.30:5353")
	ct := conntrack.NewFake(stale, other)
	h, _ := startDNSAndWeb(t, ct)
	// The cleanup runs beside the sync loop: wait for the first sync's.
	testutil.Eventually(t, "the first sync's cleanup", func() bool { return len(ct.Reconciles()) == 1 })
	if got := ct.Flows(conntrack.IPv4); len(got) != 2 {
		t.Fatalf("the first sync deleted flows that were not stale: %v", got)
	}
	calls := len(ct.Reconciles())
	giveWebAnEndpoint(t, h, ct)

	ctx := context.Background()
	es := slice("kube-system", "dns", "dns-1", 5353, v1.ProtocolUDP, "10.244.1.21")
	if _, err := h.client.DiscoveryV1().EndpointSlices("kube-system").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the stale flow to be deleted", func() bool { return len(ct.Flows(conntrack.IPv4)) == 1 })
	if got := ct.Flows(conntrack.IPv4)[0]; got != other {
		t.Errorf("deleted the wrong flow; left %+v", got)
	}
	// A cleanup the TCP change had queued would have run before this one.
	if n := len(ct.Reconciles()); n != calls+1 {
		t.Errorf("%d cleanups after the TCP and the UDP change, want 1 (the UDP one)", n-calls)
	}

	ct.Add(udpFlow("10.244.1.5:40002", "10.96.0.53:53", "10.244.1.21:5353"))
	if err := h.client.CoreV1().Services("kube-system").Delete(ctx, "dns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the deleted Service's flow to be deleted", func() bool { return len(ct.Flows(conntrack.IPv4)) == 1 })
}

// tcpAttempt is a TCP connection attempt from client to vip that went past
// without DNAT and was never answered: what a SYN sent before the rules
// existed leaves in conntrack.
func tcpAttempt(client, vip string) conntrack.Flow {
	c, v := netip.MustParseAddrPort(client), netip.MustParseAddrPort(vip)
	return conntrack.Flow{Proto: conntrack.ProtoTCP, Orig: conntrack.Tuple{Src: c, Dst: v}, Reply: conntrack.Tuple{Src: v, Dst: c}, Unanswered: true}
}

// TestConntrackTCPAttemptsBeforeRules: the sync that installs a TCP
// frontend's rules deletes the connection attempts that went past it
// before, and nothing else; a sync that adds no TCP frontend does not
// look.
func TestConntrackTCPAttemptsBeforeRules(t *testing.T) {
	early := tcpAttempt("10.244.1.5:40000", "10.96.0.10:80")
	answered := early
	answered.Orig.Src = netip.MustParseAddrPort("10.244.1.5:40001")
	answered.Reply.Dst, answered.Unanswered = answered.Orig.Src, false
	elsewhere := tcpAttempt("10.244.1.5:40002", "10.96.0.77:80")
	later := tcpAttempt("10.244.1.5:40003", "10.96.0.11:80")
	ct := conntrack.NewFake(early, answered, elsewhere, later)
	h, _ := startDNSAndWeb(t, ct)
	testutil.Eventually(t, "the attempt to web to be deleted", func() bool { return len(ct.Flows(conntrack.IPv4)) == 3 })
	if got, want := ct.Flows(conntrack.IPv4), []conntrack.Flow{answered, elsewhere, later}; !reflect.DeepEqual(got, want) {
		t.Fatalf("after the first sync: %v, want %v", got, want)
	}
	giveWebAnEndpoint(t, h, ct)

	ctx := context.Background()

	if _, err := h.client.CoreV1().Services("default").Create(ctx, service("default", "api", "10.96.0.11", 80, v1.ProtocolTCP), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the attempt to the new Service to be deleted", func() bool { return len(ct.Flows(conntrack.IPv4)) == 2 })
	if got, want := ct.Flows(conntrack.IPv4), []conntrack.Flow{answered, elsewhere}; !reflect.DeepEqual(got, want) {
		t.Errorf("after adding api: %v, want %v", got, want)
	}
}

// heldConntrack holds every Reconcile until the test releases it.
type heldConntrack struct {
	*conntrack.Fake
	started, release chan struct{}
}

func (h *heldConntrack) Reconcile(ctx context.Context, family conntrack.Family, previous conntrack.Frontends, current func() conntrack.Frontends, isNodePortAddr func(netip.Addr) bool) (conntrack.Result, error) {
	h.started <- struct{}{}
	select {
	case <-h.release:
	case <-ctx.Done():
		return conntrack.Result{}, ctx.Err()
	}
	return h.Fake.Reconcile(ctx, family, previous, current, isNodePortAddr)
}

// TestConntrackCleanupDoesNotHoldSyncs: while a conntrack cleanup runs
// (held here; a dump of 100,000 flows takes a quarter of a second), other
// changes are programmed. The cleanups queued meanwhile run as one, with
// every Service as of its latest sync: flows to endpoints that served in
// between are deleted, the flow to the current one stays.
func TestConntrackCleanupDoesNotHoldSyncs(t *testing.T) {
	f20 := udpFlow("10.244.1.5:40000", "10.96.0.53:53", "10.244.1.20:5353")
	f21 := udpFlow("10.244.1.5:40001", "10.96.0.53:53", "10.244.1.21:5353")
	f22 := udpFlow("10.244.1.5:40002", "10.96.0.53:53", "10.244.1.22:5353")
	f23 := udpFlow("10.244.1.5:40003", "10.96.0.53:53", "10.244.1.23:5353")
	ct := &heldConntrack{Fake: conntrack.NewFake(f20), started: make(chan struct{}, 8), release: make(chan struct{})}
	h, udp := startDNSAndWeb(t, ct)
	<-ct.started // the first sync's cleanup
	ct.release <- struct{}{}
	testutil.Eventually(t, "the first cleanup", func() bool { return len(ct.Reconciles()) == 1 })

	ctx := context.Background()
	// The rules are in the kernel a moment before the sync enqueues its
	// cleanup: wait for that too, or the job may miss the merge.
	handed := func() { t.Helper(); testutil.Eventually(t, "the sync to hand its cleanup over", h.p.cleaner.Handed) }
	moveDNS := func(ip string) {
		t.Helper()
		es := slice("kube-system", "dns", "dns-1", 5353, v1.ProtocolUDP, ip)
		if _, err := h.client.DiscoveryV1().EndpointSlices("kube-system").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.eventually(udp, nft.VerdictAccept, ip+":5353")
		handed()
	}
	moveDNS("10.244.1.21")
	<-ct.started // held
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")
	handed()
	moveDNS("10.244.1.22")
	moveDNS("10.244.1.23")
	if h.p.cleaner.Idle() {
		t.Fatal("the cleaner is idle while a cleanup is held")
	}
	ct.Add(f21, f22, f23)
	ct.release <- struct{}{} // the cleanup of the move to .21: f20 goes
	<-ct.started             // the moves to .22 and .23, merged
	if n := len(ct.Reconciles()); n != 2 {
		t.Fatalf("%d cleanups ran, want 2: the queued ones must be merged", n)
	}
	ct.release <- struct{}{}
	testutil.Eventually(t, "the cleaner to be idle", h.p.cleaner.Idle)
	if got := ct.Flows(conntrack.IPv4); !reflect.DeepEqual(got, []conntrack.Flow{f23}) {
		t.Errorf("flows left %+v, want only the one to the current endpoint", got)
	}
	if n := len(ct.Reconciles()); n != 3 {
		t.Errorf("%d cleanups ran, want 3", n)
	}
}

// heldBackend applies each transaction and then, while hold is set, waits
// for the test (at most 5 s): a sync whose rules are in the kernel and
// which has not returned yet.
type heldBackend struct {
	nft.Backend
	hold               atomic.Bool
	committed, release chan struct{}
}

func (b *heldBackend) Apply(ctx context.Context, tx *nft.Transaction) error {
	err := b.Backend.Apply(ctx, tx)
	if err == nil && b.hold.Load() {
		b.committed <- struct{}{}
		select {
		case <-b.release:
		case <-time.After(5 * time.Second):
		}
	}
	return err
}

// TestConntrackCleanupSeesCommittingSync: a cleanup that dumps the table
// while another sync has committed its rules, but not yet handed over its
// own cleanup, judges the flows those rules made by them: a flow to the
// endpoint the newer sync added is not stale.
func TestConntrackCleanupSeesCommittingSync(t *testing.T) {
	f21 := udpFlow("10.244.1.5:40001", "10.96.0.53:53", "10.244.1.21:5353")
	f22 := udpFlow("10.244.1.5:40002", "10.96.0.53:53", "10.244.1.22:5353")
	ct := &heldConntrack{Fake: conntrack.NewFake(), started: make(chan struct{}, 8), release: make(chan struct{})}
	var be *heldBackend
	h := startWith(t, func(d *Deps) {
		d.Conntrack = ct
		be = &heldBackend{Backend: d.NFT[nft.IPv4], committed: make(chan struct{}, 1), release: make(chan struct{}, 1)}
		d.NFT = map[nft.Family]nft.Backend{nft.IPv4: be}
	},
		service("kube-system", "dns", "10.96.0.53", 53, v1.ProtocolUDP),
		slice("kube-system", "dns", "dns-1", 5353, v1.ProtocolUDP, "10.244.1.20"))
	<-ct.started // the first sync's cleanup
	ct.release <- struct{}{}
	testutil.Eventually(t, "the first cleanup", func() bool { return len(ct.Reconciles()) == 1 })

	udp := tcp("10.96.0.53", 53)
	udp.Proto = nft.ProtoUDP
	moveDNS := func(ip string) {
		t.Helper()
		es := slice("kube-system", "dns", "dns-1", 5353, v1.ProtocolUDP, ip)
		if _, err := h.client.DiscoveryV1().EndpointSlices("kube-system").Update(context.Background(), es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.eventually(udp, nft.VerdictAccept, ip+":5353")
	}
	moveDNS("10.244.1.21")
	<-ct.started // cleanup A (the move to .21), held before its dump
	be.hold.Store(true)
	moveDNS("10.244.1.22") // sync B: committed, held before it returns
	<-be.committed
	ct.Add(f21, f22) // f22 made by B's rules
	ct.release <- struct{}{}
	testutil.Eventually(t, "cleanup A", func() bool { return len(ct.Reconciles()) == 2 })
	if got := ct.Flows(conntrack.IPv4); !slices.Contains(got, f22) {
		t.Errorf("cleanup A deleted the flow to the endpoint sync B had committed; left %v", got)
	}
	be.hold.Store(false)
	be.release <- struct{}{}
	<-ct.started // cleanup B
	ct.release <- struct{}{}
	testutil.Eventually(t, "the cleaner to be idle", h.p.cleaner.Idle)
	if got := ct.Flows(conntrack.IPv4); !reflect.DeepEqual(got, []conntrack.Flow{f22}) {
		t.Errorf("flows left %v, want only the one to the current endpoint", got)
	}
}

// TestNodePortFollowsNodeObject: with --nodeport-addresses=primary the
// NodePort answers on the Node object's InternalIP, and moves with it.
func TestNodePortFollowsNodeObject(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.10.0.11"}}}}
	svc := service("default", "np", "10.96.0.10", 80, v1.ProtocolTCP)
	svc.Spec.Type, svc.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, 30080
	h := start(t, node, svc, slice("default", "np", "np-1", 8080, v1.ProtocolTCP, "10.244.1.11"))
	h.local = []netip.Addr{netip.MustParseAddr("10.10.0.11"), netip.MustParseAddr("10.10.0.12")}
	outside := func(dst string) trace.Packet {
		return trace.Packet{Src: netip.MustParseAddr("10.10.0.99"), Dst: netip.MustParseAddr(dst), Proto: nft.ProtoTCP, DPort: 30080}
	}
	h.eventually(outside("10.10.0.11"), nft.VerdictAccept, "10.244.1.11:8080")
	h.eventually(outside("10.10.0.12"), nft.VerdictAccept)

	node.Status.Addresses[0].Address = "10.10.0.12"
	if _, err := h.client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(outside("10.10.0.12"), nft.VerdictAccept, "10.244.1.11:8080")
	h.eventually(outside("10.10.0.11"), nft.VerdictAccept)
}

type recordingHealthCheck struct {
	mu        sync.Mutex
	services  map[servicehealth.ServiceName]uint16
	endpoints map[servicehealth.ServiceName]int
}

func (r *recordingHealthCheck) SyncServices(m map[servicehealth.ServiceName]uint16) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.services = maps.Clone(m)
	return nil
}

func (r *recordingHealthCheck) SyncEndpoints(m map[servicehealth.ServiceName]int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints = maps.Clone(m)
	return nil
}

func (r *recordingHealthCheck) get() (map[servicehealth.ServiceName]uint16, map[servicehealth.ServiceName]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.services, r.endpoints
}

// TestHealthCheckNodePorts: an eTP=Local LoadBalancer Service gets its
// health check port served with this node's ready endpoint count.
func TestHealthCheckNodePorts(t *testing.T) {
	hc := &recordingHealthCheck{}
	svc := service("default", "lb", "10.96.0.10", 80, v1.ProtocolTCP)
	svc.Spec.Type, svc.Spec.Ports[0].NodePort = v1.ServiceTypeLoadBalancer, 30080
	svc.Spec.ExternalTrafficPolicy, svc.Spec.HealthCheckNodePort = v1.ServiceExternalTrafficPolicyLocal, 32000
	es := slice("default", "lb", "lb-1", 8080, v1.ProtocolTCP, "10.244.1.11", "10.244.2.12")
	here := "n1"
	es.Endpoints[0].NodeName = &here
	h := startWith(t, func(d *Deps) { d.ServiceHealth = map[nft.Family]ServiceHealthServer{nft.IPv4: hc} }, svc, es)
	name := servicehealth.ServiceName{Namespace: "default", Name: "lb"}
	testutil.Eventually(t, "health check port", func() bool {
		s, e := hc.get()
		return reflect.DeepEqual(s, map[servicehealth.ServiceName]uint16{name: 32000}) && reflect.DeepEqual(e, map[servicehealth.ServiceName]int{name: 1})
	})
	if err := h.client.CoreV1().Services("default").Delete(context.Background(), "lb", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "health check port closed", func() bool { s, _ := hc.get(); return len(s) == 0 })
}

// TestEventsWithoutRuleChangesDoNoKernelWork: an annotation, a status
// update and a no-op slice rewrite reach the proxy as API events but
// change none of its rules, so no operation reaches the kernel.
func TestEventsWithoutRuleChangesDoNoKernelWork(t *testing.T) {
	svc := service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP)
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	h := start(t, svc, es)
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")
	ops, txs := h.fk.Ops, h.fk.Transactions
	ctx := context.Background()
	svc.Annotations = map[string]string{"example.com/owner": "team-a"}
	if _, err := h.client.CoreV1().Services("default").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
	es.Labels["example.com/extra"] = "x"
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A real change afterwards proves the events above were processed.
	other := service("default", "other", "10.96.0.20", 80, v1.ProtocolTCP)
	if _, err := h.client.CoreV1().Services("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.20", 80), trace.VerdictReject)
	if n := h.fk.Transactions - txs; n != 1 {
		t.Errorf("%d transactions after three events, want 1 (the new Service)", n)
	}
	if ops := h.fk.Ops - ops; ops > 3 {
		t.Errorf("%d operations: more than the new Service needs", ops)
	}
}

// meetingBackend holds its family's first Apply until the other family's
// first Apply has begun too, for at most a few seconds.
type meetingBackend struct {
	nft.Backend
	begun, other chan struct{} // begun is closed when the first Apply begins
	once         sync.Once
	missed       atomic.Bool // the other family did not begin in time
	applied      atomic.Int32
}

func (m *meetingBackend) Apply(ctx context.Context, tx *nft.Transaction) error {
	first := false
	m.once.Do(func() { close(m.begun); first = true })
	if first {
		select {
		case <-m.other:
		case <-time.After(5 * time.Second):
			m.missed.Store(true)
			return errors.New("the other family did not begin to apply meanwhile")
		}
	}
	err := m.Backend.Apply(ctx, tx)
	if err == nil {
		m.applied.Add(1)
	}
	return err
}

// TestFamiliesSyncConcurrently: a dual-stack node's families are synced at
// once, so one family's commit does not wait for the other's building and
// commit. Each family's first transaction is held until the other's has
// begun: synced one after the other, the first would wait in vain.
func TestFamiliesSyncConcurrently(t *testing.T) {
	v4, v6 := make(chan struct{}), make(chan struct{})
	fk6 := nftfake.New()
	var b4, b6 *meetingBackend
	h := startWith(t, func(d *Deps) {
		b4 = &meetingBackend{Backend: d.NFT[nft.IPv4], begun: v4, other: v6}
		b6 = &meetingBackend{Backend: fk6, begun: v6, other: v4}
		d.NFT = map[nft.Family]nft.Backend{nft.IPv4: b4, nft.IPv6: b6}
	}, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP))
	h.eventually(tcp("10.96.0.10", 80), trace.VerdictReject)
	testutil.Eventually(t, "the IPv6 table", func() bool { return b6.applied.Load() > 0 })
	if b4.missed.Load() || b6.missed.Load() {
		t.Fatal("a family's first transaction was applied while the other family's was not under way")
	}
}

// orderedBackend logs, in a log shared by the families, when its table is
// read back and when a transaction is applied; reading takes readDelay.
type orderedBackend struct {
	*nftfake.Fake
	readDelay time.Duration
	mu        *sync.Mutex
	log       *[]string
}

func (b *orderedBackend) add(event string) {
	b.mu.Lock()
	*b.log = append(*b.log, event)
	b.mu.Unlock()
}

func (b *orderedBackend) Load(ctx context.Context, f nft.Family) (*nft.Ruleset, error) {
	time.Sleep(b.readDelay)
	rs, err := b.Fake.Load(ctx, f)
	b.add("read " + f.IPFamily())
	return rs, err
}

func (b *orderedBackend) Apply(ctx context.Context, tx *nft.Transaction) error {
	b.add("apply " + tx.Family.IPFamily())
	return b.Fake.Apply(ctx, tx)
}

// TestFamiliesReadBeforeEitherCommits: a full sync reads every family's
// table back before any family commits; a commit during another family's
// reading would make that reading start over (the ruleset's generation
// moved). The IPv4 table takes long to read; the IPv6 one is quick.
func TestFamiliesReadBeforeEitherCommits(t *testing.T) {
	var mu sync.Mutex
	var log []string
	events := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(log)
	}
	startWith(t, func(d *Deps) {
		d.NFT = map[nft.Family]nft.Backend{
			nft.IPv4: &orderedBackend{Fake: d.NFT[nft.IPv4].(*nftfake.Fake), readDelay: 300 * time.Millisecond, mu: &mu, log: &log},
			nft.IPv6: &orderedBackend{Fake: nftfake.New(), mu: &mu, log: &log},
		}
	}, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP))
	testutil.Eventually(t, "both families' first sync", func() bool { return len(events()) >= 4 })
	got := events()[:4]
	slices.Sort(got[:2])
	slices.Sort(got[2:])
	if want := []string{"read IPv4", "read IPv6", "apply IPv4", "apply IPv6"}; !slices.Equal(got, want) {
		t.Fatalf("first sync: %q, want both tables read before either transaction", events())
	}
}
