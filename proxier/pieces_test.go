package proxier

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/nft/trace"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// afterApply is a backend that calls check after every transaction it
// committed.
type afterApply struct {
	*nftfake.Fake
	txs   []*nft.Transaction
	check func()
}

func (a *afterApply) Apply(ctx context.Context, tx *nft.Transaction) error {
	if tx.Empty() {
		return nil // as the kernel: no commit
	}
	if err := a.Fake.Apply(ctx, tx); err != nil {
		return err
	}
	a.txs = append(a.txs, tx)
	a.check()
	return nil
}

// firstSync runs the first sync of a proxier with deps that holds svcs and
// slices, its pieces of at least pieceServices Services (0: one
// transaction).
func firstSync(t *testing.T, cfg Config, deps Deps, pieceServices int, svcs []*model.Service,
	slices []*model.EndpointSlice) *Proxier {
	t.Helper()
	p, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	p.pieceServices = pieceServices
	setAll(p, svcs, slices)
	if err := p.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

// ipv4 is the backends of an IPv4 node.
func ipv4(backend nft.Backend) Deps {
	return Deps{NFT: map[nft.Family]nft.Backend{nft.IPv4: backend}}
}

// TestFirstSyncInPieces: a table that is not in the kernel is written in
// pieces, and ends as the table written in one transaction. After every
// piece, each Service's traffic (to its ClusterIP, and to its external and
// load balancer IPs) goes either as before the proxy started or as in the
// final table: no piece shows part of a Service.
func TestFirstSyncInPieces(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour,
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	svcs, slices := testServices(200, 0)
	var pkts []trace.Packet
	from := netip.MustParseAddr("10.244.9.5")
	for _, svc := range svcs {
		for _, ip := range append(append([]netip.Addr{svc.ClusterIPs[0]}, svc.ExternalIPs...), svc.LoadBalancerIPs...) {
			pkts = append(pkts, trace.Packet{Src: from, Dst: ip, Proto: nft.ProtoTCP, DPort: 80})
		}
	}
	type outcome struct {
		verdict nft.VerdictKind
		dnat    []netip.AddrPort
	}
	traceAll := func(fk *nftfake.Fake) []outcome {
		out := make([]outcome, len(pkts))
		tr := trace.New(fk.Rulesets())
		for i, pkt := range pkts {
			r := tr.Trace(pkt)
			out[i] = outcome{r.Verdict, r.DNAT}
		}
		return out
	}
	whole := &afterApply{Fake: nftfake.New(), check: func() {}}
	firstSync(t, cfg, ipv4(whole), 0, svcs, slices)
	if len(whole.txs) != 1 {
		t.Fatalf("without pieces, %d transactions", len(whole.txs))
	}
	final := traceAll(whole.Fake)

	var before []outcome // as the table's base, without a Service, has it
	var seen []string    // per piece: the packets that went as in the final table
	pieces := &afterApply{Fake: nftfake.New()}
	pieces.check = func() {
		now := traceAll(pieces.Fake)
		if before == nil {
			before = now
		}
		done := 0
		for i, o := range now {
			switch {
			case reflect.DeepEqual(o, final[i]):
				done++
			case !reflect.DeepEqual(o, before[i]):
				t.Errorf("after piece %d, %v → %s %v; want as before (%s %v) or as at the end (%s %v)", len(pieces.txs),
					pkts[i].Dst, o.verdict, o.dnat, before[i].verdict, before[i].dnat, final[i].verdict, final[i].dnat)
			}
		}
		seen = append(seen, fmt.Sprint(done))
	}
	firstSync(t, cfg, ipv4(pieces), 20, svcs, slices)
	if len(pieces.txs) < tablePieces {
		t.Fatalf("%d transactions, want a table in %d pieces and its base", len(pieces.txs), tablePieces)
	}
	for i, tx := range pieces.txs[1:] {
		for _, op := range tx.Ops {
			if op.Kind != nft.OpAddSet && op.Kind != nft.OpAddChain && op.Kind != nft.OpAddRule && op.Kind != nft.OpAddElements {
				t.Fatalf("piece %d: %v; a piece only adds", i+2, op.Kind)
			}
		}
	}
	if got, want := canonical(pieces.Fake), canonical(whole.Fake); got != want {
		t.Fatalf("written in pieces:\n%s\nwritten whole:\n%s", got, want)
	}
	t.Logf("packets as at the end, piece by piece: %v of %d", seen, len(pkts))
}

// TestFirstSyncInPiecesFallsBack: when the backend refuses a piece, the
// same sync writes the whole table in one transaction, over the pieces.
func TestFirstSyncInPiecesFallsBack(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour}
	svcs, slices := testServices(200, 0)
	fk := nftfake.New()
	var resets int
	applied := 0
	backend := &refusingBackend{Fake: fk, picks: func(tx *nft.Transaction) bool {
		applied++
		if tx.Ops[0].Kind == nft.OpResetTable {
			resets++
		}
		return applied == 3 // the second piece of Services
	}}
	p := firstSync(t, cfg, ipv4(backend), 20, svcs, slices)
	if applied != 4 || resets != 2 {
		t.Fatalf("%d transactions, %d resetting the table; want 3 pieces (the last refused) and one whole table", applied, resets)
	}
	want := nftfake.New()
	firstSync(t, cfg, ipv4(want), 0, svcs, slices)
	if got, w := canonical(fk), canonical(want); got != w {
		t.Fatalf("after a refused piece:\n%s\nwant:\n%s", got, w)
	}
	if p.families[nft.IPv4].mode != modeIncremental {
		t.Fatalf("mode %v after the table was written, want incremental", p.families[nft.IPv4].mode)
	}
}

// canonical is fk's IPv4 table with its endpoints slots numbered in a
// canonical order: they are handed out in the order the Services are
// built, which is a map's.
func canonical(fk *nftfake.Fake) string { return ruleset.CanonicalSlots(fk.Ruleset(nft.IPv4)).Dump() }

// TestKernelFirstSyncInPieces: 1,000 Services written in pieces into a
// kernel (a network namespace of its own) read back as the table they
// make: a restart on it sends nothing.
func TestKernelFirstSyncInPieces(t *testing.T) {
	ns := netns.New(t, "nftproxy-pc")
	open := func() *countingNetlink {
		n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd, OwnTable: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return &countingNetlink{Netlink: n}
	}
	svcs, slices := benchstate.Cluster(benchstate.Sizes[0])
	first := open()
	firstSync(t, benchConfig, ipv4(first), 100, svcs, slices)
	if first.applied < tablePieces {
		t.Fatalf("%d transactions, want the table in %d pieces", first.applied, tablePieces)
	}
	first.Close() // as the process that wrote it exits: its table persists
	again := open()
	firstSync(t, benchConfig, ipv4(again), 100, svcs, slices)
	if again.ops != 0 {
		t.Fatalf("a restart on the table written in pieces sent %d operations", again.ops)
	}
}

// TestFirstSyncInPiecesCountsItsCommits: the monitor is paused once for
// all the pieces and told of each commit, and only of those: one it did
// not see would read as another process's, and set off a repair. The
// Services fill the pieces exactly, so that the last one is empty.
func TestFirstSyncInPiecesCountsItsCommits(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour}
	svcs, slices := testServices(200, 0)
	backend := &afterApply{Fake: nftfake.New(), check: func() {}}
	rec := &pauseRecorder{}
	deps := ipv4(backend)
	deps.Monitor = rec
	firstSync(t, cfg, deps, 25, svcs, slices)
	want := []string{"pause"}
	for range backend.txs {
		want = append(want, "commit")
	}
	want = append(want, "resume")
	if got := rec.get(); !reflect.DeepEqual(got, want) {
		t.Fatalf("monitor told %v for %d transactions, want %v", got, len(backend.txs), want)
	}
}

// TestRestartAfterSomePieces: a proxy that dies while its first table goes
// in (here: the kernel takes nothing after the third transaction) leaves
// the pieces committed so far. The next one reads them back and writes
// only the rest, without resetting the table.
func TestRestartAfterSomePieces(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour}
	svcs, slices := testServices(200, 0)
	fk := nftfake.New()
	applied := 0
	dying := &refusingBackend{Fake: fk, picks: func(*nft.Transaction) bool { applied++; return applied > 3 }}
	p, err := New(cfg, ipv4(dying))
	if err != nil {
		t.Fatal(err)
	}
	p.pieceServices = 20
	setAll(p, svcs, slices)
	if err := p.sync(context.Background()); err == nil {
		t.Fatal("the first sync succeeded though the kernel took only three transactions")
	}
	partial := fk.Ruleset(nft.IPv4).Sets["service-ips"].Elements.Len()
	if partial == 0 {
		t.Fatal("no Service committed by the pieces that went in")
	}

	restarted := &afterApply{Fake: fk, check: func() {}}
	firstSync(t, cfg, ipv4(restarted), 20, svcs, slices)
	for _, tx := range restarted.txs {
		for _, op := range tx.Ops {
			if op.Kind == nft.OpResetTable || op.Kind == nft.OpDeleteElements || op.Kind == nft.OpDeleteChain {
				t.Fatalf("the restart %v; it should only add what the pieces did not", op.Kind)
			}
		}
	}
	want := nftfake.New()
	firstSync(t, cfg, ipv4(want), 0, svcs, slices)
	if got, w := canonical(fk), canonical(want); got != w {
		t.Fatalf("after the restart:\n%s\nwant:\n%s", got, w)
	}
	t.Logf("%d service-ips elements from the pieces, %d transactions at the restart", partial, len(restarted.txs))
}
