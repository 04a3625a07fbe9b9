package proxier

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftfake"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/proxyhealth"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// recorder is a backend that keeps the transactions it passes to a Fake,
// which outlives the proxiers using it as the kernel's table outlives a
// restart.
type recorder struct {
	*nftfake.Fake
	mu  sync.Mutex
	txs []*nft.Transaction
}

func (r *recorder) Apply(ctx context.Context, tx *nft.Transaction) error {
	r.mu.Lock()
	r.txs = append(r.txs, tx)
	r.mu.Unlock()
	return r.Fake.Apply(ctx, tx)
}

// since returns the transactions recorded after the first n.
func (r *recorder) since(n int) []*nft.Transaction {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*nft.Transaction(nil), r.txs[n:]...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.txs)
}

// instance is one run of a proxier, stopped by stop.
type instance struct {
	p      *Proxier
	health *proxyhealth.Health
	stop   func()
}

// run starts a proxier on the backend with the API objects and waits for
// its first sync.
func run(t *testing.T, backend nft.Backend, objs ...runtime.Object) *instance {
	t.Helper()
	return runCounting(t, backend, ruleset.CountNone, objs...)
}

// runCounting is run with --service-traffic-metrics.
func runCounting(t *testing.T, backend nft.Backend, counters ruleset.Counters, objs ...runtime.Object) *instance {
	t.Helper()
	return runClient(t, backend, counters, fake.NewClientset(objs...))
}

// runClient is runCounting with the API client given.
func runClient(t *testing.T, backend nft.Backend, counters ruleset.Counters, client *fake.Clientset) *instance {
	t.Helper()
	in := &instance{health: proxyhealth.New(time.Minute, nil)}
	var err error
	in.p, err = New(Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Minute,
		ClusterCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		ServiceCIDRs:    []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")},
		TrafficCounters: counters},
		Deps{Client: client, NFT: map[nft.Family]nft.Backend{nft.IPv4: backend}, Health: in.health})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = in.p.Run(ctx); close(done) }()
	in.stop = func() { cancel(); <-done }
	t.Cleanup(in.stop)
	testutil.Eventually(t, "the first sync", func() bool {
		return !in.health.Status().Families[nft.IPv4.IPFamily()].LastUpdated.IsZero()
	})
	return in
}

// apiState is n Services with one endpoint each, on the proxier's node
// (so each has a hairpin element too); moved moves Service i to another
// endpoint.
func apiState(n int, moved ...int) []runtime.Object {
	var objs []runtime.Object
	for i := range n {
		ep := fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)
		for _, m := range moved {
			if m == i {
				ep = fmt.Sprintf("10.244.99.%d", i%250+1)
			}
		}
		name := fmt.Sprintf("svc-%d", i)
		objs = append(objs, service("default", name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), 80, v1.ProtocolTCP),
			onNode("n1", slice("default", name, name+"-1", 8080, v1.ProtocolTCP, ep)))
	}
	return objs
}

func opKinds(txs []*nft.Transaction) map[nft.OpKind]int {
	kinds := map[nft.OpKind]int{}
	for _, tx := range txs {
		for _, op := range tx.Ops {
			kinds[op.Kind]++
		}
	}
	return kinds
}

// TestRestartUnchanged: a new proxier over the table an earlier one wrote,
// with the same API state, reads the table back and writes nothing; later
// changes are incremental as usual.
func TestRestartUnchanged(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	objs := apiState(200)
	first := run(t, rec, objs...)
	first.stop()
	if n := rec.count(); n != 1 || opKinds(rec.since(0))[nft.OpResetTable] != 1 {
		t.Fatalf("first start: %d transactions %v, want one full rewrite", n, opKinds(rec.since(0)))
	}
	written, loads := rec.count(), rec.Loads

	h := &harness{t: t, fk: rec.Fake}
	second := run(t, rec, objs...)
	if txs := rec.since(written); len(txs) != 0 {
		t.Errorf("restart with unchanged state: %d transactions %v", len(txs), opKinds(txs))
	}
	if rec.Loads != loads+1 {
		t.Errorf("restart read the table back %d times, want once", rec.Loads-loads)
	}
	h.eventually(tcp("10.96.0.8", 80), nft.VerdictAccept, "10.244.0.8:8080")

	// The editor goes on incrementally.
	es := onNode("n1", slice("default", "svc-7", "svc-7-1", 8080, v1.ProtocolTCP, "10.244.99.8"))
	if _, err := second.p.deps.Client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.8", 80), nft.VerdictAccept, "10.244.99.8:8080")
	// Its range and hairpin element out and in: no rule.
	if kinds := opKinds(rec.since(written)); kinds[nft.OpResetTable] != 0 || kinds[nft.OpAddRule] != 0 ||
		kinds[nft.OpAddElements] != 2 || kinds[nft.OpDeleteElements] != 2 {
		t.Errorf("one endpoint moved after the restart: %v", kinds)
	}
}

// TestRestartChanged: a new proxier over an older table, with API state
// that changed meanwhile, writes only the change, and the table ends as a
// proxier starting on an empty one would write it.
func TestRestartChanged(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	run(t, rec, apiState(200)...).stop()
	written := rec.count()

	// Service 3 moved to another endpoint; service 199 is gone.
	changed := apiState(200, 3)[:2*199]
	run(t, rec, changed...)
	txs := rec.since(written)
	kinds := opKinds(txs)
	if len(txs) != 1 || kinds[nft.OpResetTable] != 0 {
		t.Fatalf("restart: %d transactions %v, want one without a reset", len(txs), kinds)
	}
	// svc-3: its pick element and hairpin element out and in. svc-199
	// (a ClusterIP through a pick map: no chain of its own): its
	// elements (cluster-ips, service-ips, hairpin, pick map) out.
	if got := txs[0].Ops; len(got) > 9 || kinds[nft.OpAddRule] != 0 || kinds[nft.OpDeleteChain] != 0 {
		t.Errorf("restart wrote %d ops %v", len(got), kinds)
	}
	fresh := nftfake.New()
	run(t, fresh, changed...)
	canon := func(rs *nft.Ruleset) string { return ruleset.CanonicalSlots(rs).Dump() }
	if got, want := canon(rec.Ruleset(nft.IPv4)), canon(fresh.Ruleset(nft.IPv4)); got != want {
		t.Errorf("after the restart the table differs from a fresh start:\n%s\nwant:\n%s", got, want)
	}
}

// TestRestartTogglesTrafficCounters: a proxier started with another
// --service-traffic-metrics over an earlier one's table leaves it as a
// fresh start with its own value would write it: the dispatch and
// endpoints maps counted or not, the endpoints' elements with or without
// their comments.
func TestRestartTogglesTrafficCounters(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	objs := apiState(150) // three endpoints maps
	canon := func(rs *nft.Ruleset) string { return ruleset.CanonicalSlots(rs).Dump() }
	var want string
	for i, counters := range []ruleset.Counters{ruleset.CountNone, ruleset.CountEndpoints, ruleset.CountServices, ruleset.CountNone} {
		written := rec.count()
		runCounting(t, rec, counters, objs...).stop()
		fresh := nftfake.New()
		runCounting(t, fresh, counters, objs...).stop()
		got := canon(rec.Ruleset(nft.IPv4))
		if want = canon(fresh.Ruleset(nft.IPv4)); got != want {
			t.Errorf("restart %d with %s: the table differs from a fresh start:\n%s\nwant:\n%s", i, counters, got, want)
		}
		t.Logf("restart %d with %s: %v", i, counters, opKinds(rec.since(written)))
		counted, endpointsMaps := 0, 0
		for _, s := range rec.Ruleset(nft.IPv4).Sets {
			if s.Counter {
				counted++
			}
			if s.EndpointsProto != 0 || s.PickProto != 0 {
				endpointsMaps++
			}
		}
		if wantCounted := map[ruleset.Counters]int{ruleset.CountServices: 4, ruleset.CountEndpoints: 4 + endpointsMaps}[counters]; counted != wantCounted {
			t.Errorf("restart %d with %s: %d counted sets, want %d", i, counters, counted, wantCounted)
		}
	}
}

// TestRestartFallsBackToRewrite: if the table cannot be read back, or the
// transaction diffed against it fails, the table is rewritten whole.
func TestRestartFallsBackToRewrite(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	objs := apiState(20)
	run(t, rec, objs...).stop()

	written := rec.count()
	run(t, &unreadable{rec}, objs...).stop()
	if kinds := opKinds(rec.since(written)); kinds[nft.OpResetTable] != 1 {
		t.Errorf("unreadable table: %v, want a rewrite", kinds)
	}

	// Read back, then the diffed transaction fails: the retry does not
	// read again, it rewrites.
	written, loads := rec.count(), rec.Loads
	if err := rec.Fake.Apply(context.Background(), &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{
		{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: "services"}}}}); err != nil {
		t.Fatal(err)
	}
	rec.FailNext = errors.New("injected ENOBUFS")
	h := &harness{t: t, fk: rec.Fake}
	run(t, rec, objs...)
	h.eventually(tcp("10.96.0.8", 80), nft.VerdictAccept, "10.244.0.8:8080")
	txs := rec.since(written)
	if len(txs) != 2 || opKinds(txs[:1])[nft.OpResetTable] != 0 || opKinds(txs[1:])[nft.OpResetTable] != 1 {
		t.Errorf("failed restart transaction, then: %d transactions, want the diff then a rewrite", len(txs))
	}
	if rec.Loads != loads+1 {
		t.Errorf("read the table back %d times, want once", rec.Loads-loads)
	}
}

// TestRestartReadsTableDuringList: the table is read back while the
// Services are listed, not after: the list waits for the reading to begin,
// and the restart still reads once and writes nothing.
func TestRestartReadsTableDuringList(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	objs := apiState(50)
	run(t, rec, objs...).stop()
	written, loads := rec.count(), rec.Loads

	reading := make(chan struct{})
	backend := &loadHook{recorder: rec, before: func() { close(reading) }}
	client := fake.NewClientset(objs...)
	var duringList atomic.Bool
	client.PrependReactor("list", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case <-reading:
			duringList.Store(true)
		case <-time.After(time.Second):
		}
		return false, nil, nil
	})
	h := &harness{t: t, fk: rec.Fake}
	runClient(t, backend, ruleset.CountNone, client)
	if !duringList.Load() {
		t.Error("the Services' list ended before the table was read")
	}
	if txs := rec.since(written); len(txs) != 0 {
		t.Errorf("restart with unchanged state: %d transactions %v", len(txs), opKinds(txs))
	}
	if rec.Loads != loads+1 {
		t.Errorf("restart read the table back %d times, want once", rec.Loads-loads)
	}
	h.eventually(tcp("10.96.0.8", 80), nft.VerdictAccept, "10.244.0.8:8080")
}

// TestRestartRereadsTableChangedAfterReading: a commit by another process
// between the reading ahead and the first sync makes the first sync read
// the table again, so it builds on what the kernel holds: the element the
// other process deleted is put back.
func TestRestartRereadsTableChangedAfterReading(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	objs := apiState(50)
	run(t, rec, objs...).stop()
	written, loads := rec.count(), rec.Loads

	vip := netip.MustParseAddr("10.96.0.8")
	backend := &loadHook{recorder: rec, after: func() {
		set := rec.Ruleset(nft.IPv4).Sets["service-ips"]
		for e := range set.Elements.All() {
			if e.Key[0].Addr == vip {
				tamper := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{{Kind: nft.OpDeleteElements, Set: set, Elements: []nft.Element{e}}}}
				if err := rec.Fake.Apply(context.Background(), tamper); err != nil {
					t.Error(err)
				}
				return
			}
		}
		t.Errorf("no element of %s in service-ips", vip)
	}}
	h := &harness{t: t, fk: rec.Fake}
	runClient(t, backend, ruleset.CountNone, fake.NewClientset(objs...))
	h.eventually(tcp("10.96.0.8", 80), nft.VerdictAccept, "10.244.0.8:8080")
	if rec.Loads != loads+2 {
		t.Errorf("read the table back %d times, want twice", rec.Loads-loads)
	}
	if txs := rec.since(written); len(txs) != 1 || len(txs[0].Ops) != 1 || txs[0].Ops[0].Kind != nft.OpAddElements {
		t.Errorf("after a change behind the reading: %d transactions %v, want the one element added back", len(txs), opKinds(txs))
	}
}

// TestRestartRereadsTableAfterFailedReading: when the reading ahead fails,
// the first sync reads the table itself and builds on it, instead of
// rewriting the table.
func TestRestartRereadsTableAfterFailedReading(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	objs := apiState(50)
	run(t, rec, objs...).stop()
	written, loads := rec.count(), rec.Loads

	rec.FailNextLoad = errors.New("injected EINTR")
	run(t, rec, objs...)
	if txs := rec.since(written); len(txs) != 0 {
		t.Errorf("restart after a failed reading: %d transactions %v, want none", len(txs), opKinds(txs))
	}
	if rec.Loads != loads+1 {
		t.Errorf("read the table back %d times after the failure, want once", rec.Loads-loads)
	}
}

// loadHook calls before and after around the first read of the table.
type loadHook struct {
	*recorder
	once          sync.Once
	before, after func()
}

func (l *loadHook) Load(ctx context.Context, f nft.Family) (*nft.Ruleset, error) {
	first := false
	l.once.Do(func() { first = true })
	if first && l.before != nil {
		l.before()
	}
	rs, err := l.recorder.Load(ctx, f)
	if first && l.after != nil {
		l.after()
	}
	return rs, err
}

// unreadable is a backend whose table cannot be read back.
type unreadable struct{ *recorder }

func (u *unreadable) Load(context.Context, nft.Family) (*nft.Ruleset, error) {
	return nil, errors.New("injected: dump interrupted")
}

// countingLoader counts the reads of the table.
type countingLoader struct {
	*recorder
	loads atomic.Int32
}

func (c *countingLoader) Load(ctx context.Context, f nft.Family) (*nft.Ruleset, error) {
	c.loads.Add(1)
	return c.recorder.Load(ctx, f)
}

// TestPeriodicFullSyncVerifies: the periodic full sync reads the table back
// instead of rewriting it: unchanged, it writes nothing; after someone else
// deleted one of our elements, it puts back just that element.
func TestPeriodicFullSyncVerifies(t *testing.T) {
	backend := &countingLoader{recorder: &recorder{Fake: nftfake.New()}}
	p, err := New(Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: 30 * time.Millisecond, FullSyncPeriod: time.Millisecond,
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
		Deps{Client: fake.NewClientset(apiState(3)...), NFT: map[nft.Family]nft.Backend{nft.IPv4: backend}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, "three full syncs", func() bool { return backend.loads.Load() >= 3 })
	if n := backend.count(); n != 1 {
		t.Fatalf("%d transactions; want only the first one", n)
	}

	set := backend.Fake.Ruleset(nft.IPv4).Sets["service-ips"]
	var victim nft.Element
	for e := range set.Elements.All() {
		victim = e
		break
	}
	tamper := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{{Kind: nft.OpDeleteElements, Set: set, Elements: []nft.Element{victim}}}}
	if err := backend.Fake.Apply(ctx, tamper); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the repair", func() bool { return backend.count() == 2 })
	repair := backend.since(1)[0]
	if kinds := opKinds([]*nft.Transaction{repair}); kinds[nft.OpResetTable] != 0 || len(repair.Ops) != 1 || kinds[nft.OpAddElements] != 1 {
		t.Errorf("repair transaction %v, want one element added back", kinds)
	}
}

// TestListedBeforeFirstSync: Deps.Listed is called once, when the
// informers hold every object and before anything is written.
func TestListedBeforeFirstSync(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	p, err := New(Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Minute},
		Deps{Client: fake.NewClientset(apiState(20)...), NFT: map[nft.Family]nft.Backend{nft.IPv4: rec}})
	if err != nil {
		t.Fatal(err)
	}
	var calls, pending, written atomic.Int32
	p.deps.Listed = func() {
		calls.Add(1)
		pending.Store(int32(p.trackers.Services.Pending()))
		written.Store(int32(rec.count()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, "the first sync", func() bool { return rec.count() > 0 })
	if calls.Load() != 1 || pending.Load() != 20 || written.Load() != 0 {
		t.Errorf("Listed called %d times, with %d Services pending and %d transactions written; want once, 20, 0",
			calls.Load(), pending.Load(), written.Load())
	}
}
