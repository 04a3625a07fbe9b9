package proxier

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/nft/trace"
)

// tamper deletes every element of set from the fake's table, as another
// process would, and returns the change the monitor would report.
func tamper(t *testing.T, fk *nftfake.Fake, set string) nftnl.Change {
	t.Helper()
	s := fk.Ruleset(nft.IPv4).Sets[set]
	var elems []nft.Element
	for e := range s.Elements.All() {
		elems = append(elems, e)
	}
	if len(elems) == 0 {
		t.Fatalf("set %s is empty", set)
	}
	tx := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{{Kind: nft.OpDeleteElements, Set: s, Elements: elems}}}
	if err := fk.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return nftnl.Change{Family: nft.IPv4, Kind: nftnl.KindElement, Deleted: true, Name: set, Count: len(elems)}
}

// TestForeignChangeIsRepaired: a change another process made to the table
// is repaired when the monitor reports it, and only then (a sync without a
// report trusts its committed state); the repair is counted by kind.
func TestForeignChangeIsRepaired(t *testing.T) {
	h := start(t,
		service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11"))
	web := tcp("10.96.0.10", 80)
	h.eventually(web, nft.VerdictAccept, "10.244.1.11:8080")
	before := promtestutil.ToFloat64(metrics.RepairsTotal.WithLabelValues("IPv4", "element"))

	change := tamper(t, h.fk, "service-ips")
	h.eventually(web, trace.VerdictReject) // to a ClusterIP, not DNATed

	// A sync for another change leaves the tampered element alone.
	ctx := context.Background()
	if _, err := h.client.CoreV1().Services("default").Create(ctx,
		service("default", "db", "10.96.0.20", 5432, v1.ProtocolTCP), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.20", 5432), trace.VerdictReject)
	h.eventually(web, trace.VerdictReject)

	h.p.foreignCommit(nftnl.Commit{Process: "nft", PID: 4242, Changes: []nftnl.Change{change}})
	h.eventually(web, nft.VerdictAccept, "10.244.1.11:8080")
	testutil.Eventually(t, "the repair to be counted", func() bool {
		return promtestutil.ToFloat64(metrics.RepairsTotal.WithLabelValues("IPv4", "element")) == before+1
	})
}

// TestLostNotificationsCheckTheTable: when notifications were lost, every
// family is checked against the kernel.
func TestLostNotificationsCheckTheTable(t *testing.T) {
	h := start(t,
		service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11"))
	web := tcp("10.96.0.10", 80)
	h.eventually(web, nft.VerdictAccept, "10.244.1.11:8080")
	before := promtestutil.ToFloat64(metrics.RepairsTotal.WithLabelValues("IPv4", lostKind))
	tamper(t, h.fk, "service-ips")
	h.p.foreignCommit(nftnl.Commit{Lost: true})
	h.eventually(web, nft.VerdictAccept, "10.244.1.11:8080")
	testutil.Eventually(t, "the check to be counted", func() bool {
		return promtestutil.ToFloat64(metrics.RepairsTotal.WithLabelValues("IPv4", lostKind)) == before+1
	})
}

// pauseRecorder is a Monitor that records pauses and commits.
type pauseRecorder struct {
	mu     sync.Mutex
	events []string
}

func (r *pauseRecorder) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *pauseRecorder) Run(ctx context.Context, _ func(nftnl.Commit)) error {
	<-ctx.Done()
	return nil
}
func (r *pauseRecorder) Pause() func()    { r.add("pause"); return func() { r.add("resume") } }
func (r *pauseRecorder) Committed(uint32) { r.add("commit") }

func (r *pauseRecorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// TestMonitorPausedForLargeCommits: the monitor is paused around a large
// transaction, with our commit counted before it resumes; small ones are
// only counted.
func TestMonitorPausedForLargeCommits(t *testing.T) {
	var objs []runtime.Object
	for i := range 600 {
		name := fmt.Sprintf("s%d", i)
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		objs = append(objs, service("default", name, ip, 80, v1.ProtocolTCP),
			slice("default", name, name+"-1", 8080, v1.ProtocolTCP, fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)))
	}
	rec := &pauseRecorder{}
	h := startWith(t, func(d *Deps) { d.Monitor = rec }, objs...)
	h.eventually(tcp("10.96.0.1", 80), nft.VerdictAccept, "10.244.0.1:8080")
	testutil.Eventually(t, "the first sync's events", func() bool { return len(rec.get()) == 3 })
	if got := fmt.Sprint(rec.get()); got != "[pause commit resume]" {
		t.Fatalf("first sync (600 Services): %s, want [pause commit resume]", got)
	}
	ctx := context.Background()
	if err := h.client.CoreV1().Services("default").Delete(ctx, "s0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.1", 80), nft.VerdictDrop)
	// The commit is counted after the transaction, which the tracer may
	// see first.
	testutil.Eventually(t, "the small sync's commit", func() bool { return len(rec.get()) >= 4 })
	if got := fmt.Sprint(rec.get()); got != "[pause commit resume commit]" {
		t.Fatalf("after a small change: %s, want [pause commit resume commit]", got)
	}
}

// refusingBackend refuses every transaction while refuse is set, as a
// kernel does when another process owns the table, and those picks
// returns true for, when it is set.
type refusingBackend struct {
	*nftfake.Fake
	refuse  atomic.Bool
	refused atomic.Int32
	picks   func(*nft.Transaction) bool
}

func (b *refusingBackend) Apply(ctx context.Context, tx *nft.Transaction) error {
	if b.refuse.Load() || b.picks != nil && b.picks(tx) {
		b.refused.Add(1)
		return fmt.Errorf("apply transaction (%d ops): %w", len(tx.Ops), syscall.EPERM)
	}
	return b.Fake.Apply(ctx, tx)
}

// TestRefusedWhileChangesArrive: while the backend refuses, the table stays
// as it was, each failure is counted, and the changes that keep arriving
// are not lost: once it accepts again, the last one is programmed.
func TestRefusedWhileChangesArrive(t *testing.T) {
	var rb *refusingBackend
	h := startWith(t, func(d *Deps) {
		rb = &refusingBackend{Fake: d.NFT[nft.IPv4].(*nftfake.Fake)}
		d.NFT[nft.IPv4] = rb
	}, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.1"))
	web := tcp("10.96.0.10", 80)
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080")
	failures := promtestutil.ToFloat64(metrics.NFTablesSyncFailuresTotal.WithLabelValues("IPv4"))

	rb.refuse.Store(true)
	ctx := context.Background()
	for i := 2; i <= 20; i++ {
		es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, fmt.Sprintf("10.244.1.%d", i))
		if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, "three refused syncs", func() bool { return rb.refused.Load() >= 3 })
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080") // as it was
	rb.refuse.Store(false)
	h.eventually(web, nft.VerdictAccept, "10.244.1.20:8080")
	if got := promtestutil.ToFloat64(metrics.NFTablesSyncFailuresTotal.WithLabelValues("IPv4")) - failures; got != float64(rb.refused.Load()) {
		t.Errorf("%v failures counted, %d refused", got, rb.refused.Load())
	}
}
