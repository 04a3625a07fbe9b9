package proxier

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// arrival is one object of a list as it streams in: a Service or an
// EndpointSlice, or a deletion of either.
type arrival struct {
	svc     *model.Service
	slice   *model.EndpointSlice
	deleted bool
}

// listStream returns the objects of a list of n Services as they arrive,
// in an order that puts every case of a list in it: most Services arrive
// before their slice, some after it; every seventh has a second slice
// that arrives long after the first; one Service is deleted while the list
// streams. It returns the Services and slices the list ends with.
func listStream(n int) (stream []arrival, svcs []*model.Service, slices []*model.EndpointSlice) {
	svcs, slices = testServices(n, 0)
	var second []arrival
	for i, svc := range svcs {
		if i%3 == 0 {
			stream = append(stream, arrival{slice: slices[i]}, arrival{svc: svc})
		} else {
			stream = append(stream, arrival{svc: svc}, arrival{slice: slices[i]})
		}
		if i%7 == 0 {
			es := *slices[i]
			es.Name = svc.Name.Name + "-2"
			es.Endpoints = []model.Endpoint{{IP: model.IPOf(netip.AddrFrom4([4]byte{10, 245, 0, byte(i)})),
				Ready: true, Serving: true, Place: &model.Placement{NodeName: "n2"}}}
			second = append(second, arrival{slice: &es})
			slices = append(slices, &es)
		}
	}
	// The second slices arrive in the last quarter, each long after the
	// piece that holds its Service.
	at := len(stream) * 3 / 4
	stream = append(stream[:at], append(second, stream[at:]...)...)
	gone := svcs[5]
	stream = append(stream, arrival{svc: gone, deleted: true})
	svcs = append(svcs[:5:5], svcs[6:]...)
	var kept []*model.EndpointSlice
	for _, es := range slices {
		if es.Service != gone.Name {
			kept = append(kept, es)
		}
	}
	stream = append(stream, arrival{slice: slices[5], deleted: true})
	return stream, svcs, kept
}

func (a arrival) record(p *Proxier) {
	switch {
	case a.svc != nil && a.deleted:
		p.trackers.Services.Delete(a.svc.Name)
	case a.svc != nil:
		p.trackers.Services.Set(a.svc.Name, a.svc)
	case a.deleted:
		p.trackers.Slices.Delete(model.SliceKey{Namespace: a.slice.Service.Namespace, Name: a.slice.Name})
	default:
		p.trackers.Slices.Set(model.SliceKey{Namespace: a.slice.Service.Namespace, Name: a.slice.Name}, a.slice)
	}
}

// syncWhole records the whole of stream into a new proxier's trackers,
// then runs its first sync: the table of a first sync after the list.
func syncWhole(t *testing.T, cfg Config, deps Deps, stream []arrival) *Proxier {
	t.Helper()
	return listThenSync(t, cfg, deps, 0, len(stream)+1, stream)
}

// listThenSync records stream into a new proxier's trackers, a listing
// step after every step objects, then runs the first sync.
func listThenSync(t *testing.T, cfg Config, deps Deps, pieceServices, step int, stream []arrival) *Proxier {
	t.Helper()
	p, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	p.pieceServices = pieceServices
	ctx := context.Background()
	for i, a := range stream {
		a.record(p)
		if (i+1)%step == 0 {
			p.listingStep(ctx)
		}
	}
	if err := p.sync(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBuildWhileListing: while the list streams in, the table goes into
// the kernel in pieces, and every packet goes as before the proxy started
// (no Service answers, with some of its endpoints or all) until the first
// sync's one transaction makes the whole table reachable at once. The
// table then is the one a first sync after the whole list writes, though
// Services arrived before and after their slices, gained a second slice
// after their piece, and one was deleted.
func TestBuildWhileListing(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour,
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	stream, svcs, _ := listStream(200)
	pkts := servicePackets(svcs)
	traceAll := func(fk *nftfake.Fake) []outcome { return traceOutcomes(fk, pkts) }
	before := traceAll(nftfake.New())

	whole := nftfake.New()
	syncWhole(t, cfg, ipv4(whole), stream)
	final := traceAll(whole)
	if reflect.DeepEqual(final, before) {
		t.Fatal("the Services' packets go as without a table: nothing to tell apart")
	}

	listed := &afterApply{Fake: nftfake.New()}
	synced := false // under listed.mu: check runs in Apply
	listed.check = func() {
		if synced {
			return
		}
		for i, o := range traceAll(listed.Fake) {
			if !reflect.DeepEqual(o, before[i]) {
				t.Errorf("after transaction %d, while listing, %v → %s %v; want as without the proxy (%s %v)",
					len(listed.txs), pkts[i].Dst, o.verdict, o.dnat, before[i].verdict, before[i].dnat)
			}
		}
	}
	pr, err := New(cfg, ipv4(listed))
	if err != nil {
		t.Fatal(err)
	}
	pr.pieceServices = 20
	ctx := context.Background()
	for i, a := range stream {
		a.record(pr)
		if (i+1)%10 == 0 {
			pr.listingStep(ctx)
		}
	}
	late := len(pr.families[nft.IPv4].building.late)
	listed.mu.Lock()
	synced = true // the pieces after this one are the first sync's
	during := len(listed.txs)
	listed.mu.Unlock()
	if during < 2 {
		t.Fatalf("%d transactions while listing; want the table in pieces", during)
	}
	if err := pr.sync(ctx); err != nil {
		t.Fatal(err)
	}
	// The Services whose second slice arrived after their piece, and the
	// one deleted: a Service whose slice arrived before it is built once.
	if changedLate := 200/7 + 1 + 1; late == 0 || late > changedLate {
		t.Fatalf("%d Services built again by the first sync; want some, at most the %d that changed after their piece",
			late, changedLate)
	}
	last := listed.txs[len(listed.txs)-1]
	for _, op := range last.Ops {
		if op.Kind == nft.OpResetTable {
			t.Fatal("the first sync rewrote the table; want only what the pieces did not write")
		}
	}
	if got, w := traceAll(listed.Fake), final; !reflect.DeepEqual(got, w) {
		t.Errorf("after the first sync, the packets go otherwise than after a first sync of the whole list")
	}
	if got, w := canonical(listed.Fake), canonical(whole); got != w {
		t.Fatalf("built while listing:\n%s\nafter the whole list:\n%s", got, w)
	}
	if pr.families[nft.IPv4].mode != modeIncremental {
		t.Fatalf("mode %v after the first sync, want incremental", pr.families[nft.IPv4].mode)
	}
	t.Logf("%d transactions while listing, then %d; %d Services built again by the first sync", during,
		len(listed.txs)-during, late)
}

// TestBuildWhileListingRestart: a restart builds while the list streams
// too, but writes nothing before the first sync, whose transaction is
// what differs from the table there: nothing when nothing changed.
func TestBuildWhileListingRestart(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour}
	stream, _, _ := listStream(200)
	fk := nftfake.New()
	syncWhole(t, cfg, ipv4(fk), stream)
	rec := &afterApply{Fake: fk, check: func() {}}
	p := listThenSync(t, cfg, ipv4(rec), 20, 10, stream)
	if len(rec.txs) != 0 {
		t.Fatalf("the restart wrote %d transactions (%d operations in the first); want none", len(rec.txs), len(rec.txs[0].Ops))
	}
	if p.families[nft.IPv4].mode != modeIncremental {
		t.Fatalf("mode %v after the first sync, want incremental", p.families[nft.IPv4].mode)
	}
}

// TestBuildWhileListingNodeChanges: when the Node changes after the
// building began (here: its pod CIDR, which decides what traffic is
// local), the first sync builds every Service again, and the table is the
// one a first sync after the whole list writes.
func TestBuildWhileListingNodeChanges(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour,
		LocalDetect: LocalDetect{Mode: DetectNodeCIDR}}
	stream, _, _ := listStream(200)
	node := model.Node{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	moved := model.Node{PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.7.0/24")}}

	whole := nftfake.New()
	pw, err := New(cfg, ipv4(whole))
	if err != nil {
		t.Fatal(err)
	}
	pw.setNode(moved)
	for _, a := range stream {
		a.record(pw)
	}
	if err := pw.sync(context.Background()); err != nil {
		t.Fatal(err)
	}

	listed := nftfake.New()
	p, err := New(cfg, ipv4(listed))
	if err != nil {
		t.Fatal(err)
	}
	p.pieceServices = 20
	p.setNode(node)
	ctx := context.Background()
	for i, a := range stream {
		a.record(p)
		if (i+1)%10 == 0 {
			p.listingStep(ctx)
		}
		if i == len(stream)/2 {
			p.setNode(moved)
		}
	}
	if err := p.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if got, w := canonical(listed), canonical(whole); got != w {
		t.Fatalf("built while listing, the node changed:\n%s\nafter the whole list:\n%s", got, w)
	}
}

// TestKernelBuildWhileListing: 250 Services built while their list
// streams go into a kernel (a network namespace of its own) in pieces that
// hold a dormant base, and the first sync makes the table whole: a restart
// on it sends nothing, and the table is the one a first sync after the
// whole list writes.
func TestKernelBuildWhileListing(t *testing.T) {
	ns := netns.New(t, "nftproxy-ls")
	open := func() *countingNetlink {
		n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd, OwnTable: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		return &countingNetlink{Netlink: n}
	}
	stream, _, _ := listStream(250)
	first := open()
	listThenSync(t, benchConfig, ipv4(first), 20, 10, stream)
	if first.applied < 3 {
		t.Fatalf("%d transactions, want pieces while listing and the first sync's", first.applied)
	}
	first.Close()
	again := open()
	syncWhole(t, benchConfig, ipv4(again), stream)
	if again.ops != 0 {
		t.Fatalf("a restart on the table built while listing sent %d operations", again.ops)
	}
}
