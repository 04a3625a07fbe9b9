package proxier

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

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
	"github.com/nftproxy/nftproxy/proxier/readers"
)

// sockets is a readers.Lister the test sets. With progress, a socket set
// dumping is seen dumping at every other listing, as a reader at work is
// (its dumps are short); without, at every listing, as a reader that
// stopped reading in the middle of a dump.
type sockets struct {
	mu       sync.Mutex
	socks    []nftnl.Socket
	progress bool
	listings int
}

func (s *sockets) Sockets() ([]nftnl.Socket, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listings++
	out := append([]nftnl.Socket(nil), s.socks...)
	for i := range out {
		out[i].Dumping = out[i].Dumping && (!s.progress || s.listings%2 == 0)
	}
	return out, nil
}

func (s *sockets) set(socks ...nftnl.Socket) {
	s.mu.Lock()
	s.socks = socks
	s.mu.Unlock()
}

// moveWeb points Service web at endpoint ip.
func moveWeb(t *testing.T, h *harness, ip string) {
	t.Helper()
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, ip)
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startWithReaders starts a proxier with Service web (10.96.0.10:80 →
// 10.244.1.1:8080) and more objs, whose syncs wait for the readers socks
// lists, seen through a gate of cfg, for a minute at most.
func startWithReaders(t *testing.T, socks *sockets, cfg readers.Config, objs ...runtime.Object) (*harness, trace.Packet) {
	t.Helper()
	gate := readers.New(cfg, socks)
	objs = append(objs, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.1"))
	h := startWithConfig(t, func(c *Config) { c.MaxReaderWait = time.Minute }, func(d *Deps) { d.Readers = gate }, objs...)
	web := tcp("10.96.0.10", 80)
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080")
	return h, web
}

// TestChangesWaitForReaders: while another process dumps the ruleset, a
// change that follows the last sync waits; once the reader is done, it is
// programmed, and the wait is counted.
func TestChangesWaitForReaders(t *testing.T) {
	socks := &sockets{progress: true}
	h, web := startWithReaders(t, socks, readers.Config{Linger: 50 * time.Millisecond, MaxLinger: time.Second})
	ended := promtestutil.ToFloat64(metrics.ReaderWaitsTotal.WithLabelValues(metrics.ReaderWaitEnded))

	socks.set(nftnl.Socket{Inode: 1, PortID: 4242, Dumping: true})
	moveWeb(t, h, "10.244.1.2")
	time.Sleep(300 * time.Millisecond) // what the proxier would have needed many times over
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080")
	socks.set()
	h.eventually(web, nft.VerdictAccept, "10.244.1.2:8080")
	if got := promtestutil.ToFloat64(metrics.ReaderWaitsTotal.WithLabelValues(metrics.ReaderWaitEnded)) - ended; got != 1 {
		t.Errorf("%v waits counted as ended, want 1", got)
	}
}

// TestStalledReaderDoesNotHoldChanges: a socket whose dump never moves
// (its process stopped reading) holds one change for the stall limit, then
// none.
func TestStalledReaderDoesNotHoldChanges(t *testing.T) {
	socks := &sockets{}
	h, web := startWithReaders(t, socks, readers.Config{Linger: 50 * time.Millisecond, Stall: 200 * time.Millisecond, MaxStall: time.Second})
	stalled := testutil.Value(t, metrics.ReadersIgnoredTotal.WithLabelValues(metrics.ReaderStalled))

	socks.set(nftnl.Socket{Inode: 1, PortID: 4242, Dumping: true})
	for i, ip := range []string{"10.244.1.2", "10.244.1.3", "10.244.1.4"} {
		moved := time.Now()
		moveWeb(t, h, ip)
		h.eventually(web, nft.VerdictAccept, ip+":8080")
		if took := time.Since(moved); took > 2*time.Second {
			t.Errorf("move %d took %v with a stalled reader on the node (MaxReaderWait 1 min)", i+1, took)
		}
	}
	if got := testutil.Value(t, metrics.ReadersIgnoredTotal.WithLabelValues(metrics.ReaderStalled)) - stalled; got != 1 {
		t.Errorf("%v stalled readers counted, want 1", got)
	}
}

// TestRepairDoesNotWaitForReaders: while a change waits for a reader at
// work, a repair of the table goes at once, with the change.
func TestRepairDoesNotWaitForReaders(t *testing.T) {
	socks := &sockets{progress: true}
	h, web := startWithReaders(t, socks, readers.Config{Linger: 50 * time.Millisecond},
		service("default", "db", "10.96.0.20", 5432, v1.ProtocolTCP),
		slice("default", "db", "db-1", 5432, v1.ProtocolTCP, "10.244.1.9"))
	db := tcp("10.96.0.20", 5432)
	h.eventually(db, nft.VerdictAccept, "10.244.1.9:5432")
	repairs := testutil.Value(t, metrics.ReaderWaitsTotal.WithLabelValues(metrics.ReaderWaitRepair))

	socks.set(nftnl.Socket{Inode: 1, PortID: 4242, Dumping: true})
	moveWeb(t, h, "10.244.1.2")
	time.Sleep(300 * time.Millisecond)
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080") // held
	change := tamper(t, h.fk, "service-ips")
	h.eventually(db, trace.VerdictReject)
	repaired := time.Now()
	h.p.foreignCommit(nftnl.Commit{Process: "nft", PID: 4242, Changes: []nftnl.Change{change}})
	h.eventually(db, nft.VerdictAccept, "10.244.1.9:5432")
	h.eventually(web, nft.VerdictAccept, "10.244.1.2:8080")
	if took := time.Since(repaired); took > 2*time.Second {
		t.Errorf("repaired %v after the report, with a reader at work (MaxReaderWait 1 min)", took)
	}
	if got := testutil.Value(t, metrics.ReaderWaitsTotal.WithLabelValues(metrics.ReaderWaitRepair)) - repairs; got != 1 {
		t.Errorf("%v waits counted as cut by a repair, want 1", got)
	}
}

// ownedBackend refuses every transaction with a TableOwnedError while
// owned is set.
type ownedBackend struct {
	*nftfake.Fake
	mu      sync.Mutex
	owned   bool
	refused []time.Time
}

func (b *ownedBackend) Apply(ctx context.Context, tx *nft.Transaction) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.owned {
		b.refused = append(b.refused, time.Now())
		return fmt.Errorf("apply transaction (%d ops): %w", len(tx.Ops), &nft.TableOwnedError{Family: tx.Family, Owner: 4242})
	}
	return b.Fake.Apply(ctx, tx)
}

func (b *ownedBackend) set(owned bool) {
	b.mu.Lock()
	b.owned = owned
	b.mu.Unlock()
}

func (b *ownedBackend) refusals() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.refused)
}

// TestRefusedUntilTheOwnerExits: while another process owns the table,
// the retries back off; when its socket closes, the retry comes at once,
// not at the end of the backoff step it had reached.
func TestRefusedUntilTheOwnerExits(t *testing.T) {
	socks := &sockets{}
	var ob *ownedBackend
	h := startWith(t, func(d *Deps) {
		ob = &ownedBackend{Fake: d.NFT[nft.IPv4].(*nftfake.Fake)}
		d.NFT[nft.IPv4] = ob
		d.Readers = readers.New(readers.Config{}, socks)
	}, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.1"))
	web := tcp("10.96.0.10", 80)
	h.eventually(web, nft.VerdictAccept, "10.244.1.1:8080")

	socks.set(nftnl.Socket{Inode: 1, PortID: 4242})
	ob.set(true)
	moveWeb(t, h, "10.244.1.2")
	// Refusals at 0, 0.1, 0.3, 0.7, 1.5 s: the next retry is 1.6 s later.
	testutil.Eventually(t, "five refusals", func() bool { return ob.refusals() >= 5 })
	ob.set(false)
	socks.set()
	released := time.Now()
	h.eventually(web, nft.VerdictAccept, "10.244.1.2:8080")
	if took := time.Since(released); took > time.Second {
		t.Errorf("programmed %v after the owner's socket closed, want within a second", took)
	}
}
