package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"context"
	"errors"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// ownedNetlink opens a Netlink that owns the table, closed when the test
// ends (closing it early is part of some tests: Close twice is harmless).
func (ns *testNS) ownedNetlink(t testing.TB) *Netlink {
	t.Helper()
	n, err := NewNetlink(NetlinkOptions{NetNSFd: ns.Fd, OwnTable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// loadOn reads the table back on n's socket.
func loadOn(t testing.TB, n *Netlink, f nft.Family) *nft.Ruleset {
	t.Helper()
	rs, err := n.Load(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestNetlinkOwnedTable: an owned table cannot be changed by anyone else,
// survives `nft flush ruleset` and its owner's exit, is claimed by the next
// owner without being rewritten, and is refused to a second owner while the
// first lives.
func TestNetlinkOwnedTable(t *testing.T) {
	ns := newTestNS(t)
	ns.requireOwnedTables(t)
	f := nft.IPv4
	svcs := nfttest.MakeServices(f, 20, 2)
	desired := nfttest.RealisticRuleset(f, svcs)

	first := ns.ownedNetlink(t)
	apply(t, first, nft.FullRewrite(desired))
	if owning, err := first.Owning(); !owning {
		t.Fatalf("not owning the table: %v", err)
	}
	listing := ns.list(t, f)
	if !strings.Contains(listing, "flags owner") {
		t.Fatalf("owned table lists without its flag:\n%s", listing)
	}
	if out, err := ns.nft("", "add", "chain", "ip", nft.TableName, "intruder"); err == nil ||
		!strings.Contains(out+err.Error(), "Operation not permitted") {
		t.Fatalf("another process added a chain to the owned table: %v %s", err, out)
	}
	ns.mustNft(t, "", "flush", "ruleset")
	if got := ns.listed(t, f); got != ns.dumped(t, desired) {
		t.Fatalf("nft flush ruleset changed the owned table:\n%s", got)
	}

	// The owner goes (kill -9 closes its socket just the same): the table
	// stays, and serves, ownerless.
	first.Close()
	if got := ns.listed(t, f); got != ns.dumped(t, desired) {
		t.Fatalf("the table changed when its owner's socket closed:\n%s", got)
	}

	// The next owner reads it back and claims it with a change of one
	// element: no rewrite.
	second := ns.ownedNetlink(t)
	loaded := loadOn(t, second, f)
	if loaded == nil {
		t.Fatal("an ownerless persistent table is not read back for the next owner to build on")
	}
	next := nfttest.RealisticRuleset(f, append(svcs, nfttest.MakeService(f, 99, 2)))
	tx := nft.Diff(loaded, next)
	for _, op := range tx.Ops {
		if op.Kind == nft.OpResetTable {
			t.Fatal("the claim rewrites the table")
		}
	}
	apply(t, second, tx)
	if got := ns.listed(t, f); got != ns.dumped(t, next) {
		t.Fatalf("after the claim the kernel differs from the desired ruleset:\n%s", got)
	}
	if _, err := ns.nft("", "add", "chain", "ip", nft.TableName, "intruder"); err == nil {
		t.Fatal("another process changed the claimed table")
	}

	// A second live owner is refused: it cannot claim the table to read it
	// back, nor rewrite it; so is a cleanup while the owner lives. The table
	// is left as it was.
	third := ns.ownedNetlink(t)
	if _, err := third.Load(context.Background(), f); !errors.Is(err, unix.EPERM) ||
		!strings.Contains(err.Error(), "owned by another running process") {
		t.Fatalf("a second owner's reading: %v, want EPERM naming the owner", err)
	}
	err := third.Apply(context.Background(), nft.FullRewrite(desired))
	var owned *nft.TableOwnedError
	if !errors.Is(err, unix.EPERM) || !errors.As(err, &owned) || owned.Owner == 0 || owned.Family != f {
		t.Fatalf("a second owner's rewrite: %v, want EPERM and a TableOwnedError naming the owner's port", err)
	}
	cleanup := ns.netlink(t)
	if err := cleanup.Apply(context.Background(), &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}); !errors.Is(err, unix.EPERM) {
		t.Fatalf("deleting the table of a running owner: %v, want EPERM", err)
	}
	if got := ns.listed(t, f); got != ns.dumped(t, next) {
		t.Fatalf("refused transactions changed the table:\n%s", got)
	}

	// Once the owner is gone, --cleanup deletes the table.
	second.Close()
	third.Close()
	apply(t, cleanup, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}})
	if out, err := ns.nft("", "list", "table", "ip", nft.TableName); err == nil {
		t.Fatalf("table left after cleanup:\n%s", out)
	}
}

// TestNetlinkOwnershipChanges: a table written without ownership is
// rewritten owned when ownership is asked for, and an ownerless persistent
// one is rewritten without flags when it is not: the kernel never adds or
// drops the persistence of a table that exists.
func TestNetlinkOwnershipChanges(t *testing.T) {
	ns := newTestNS(t)
	ns.requireOwnedTables(t)
	f := nft.IPv6
	desired := nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 5, 2))

	plain := ns.netlink(t)
	apply(t, plain, nft.FullRewrite(desired))
	owned := ns.ownedNetlink(t)
	if rs := loadOn(t, owned, f); rs != nil {
		t.Fatal("a table without persistence is read back for an owner to claim")
	}
	apply(t, owned, nft.FullRewrite(desired))
	if l := ns.list(t, f); !strings.Contains(l, "flags owner") {
		t.Fatalf("rewritten table is not owned:\n%s", l)
	}
	owned.Close()

	unowned := ns.netlink(t)
	if rs := loadOn(t, unowned, f); rs != nil {
		t.Fatal("an ownerless persistent table is read back to be changed in place without ownership")
	}
	apply(t, unowned, nft.FullRewrite(desired))
	if l := ns.list(t, f); strings.Contains(l, "flags") {
		t.Fatalf("table still has flags after a rewrite without ownership:\n%s", l)
	}
	if rs := loadOn(t, unowned, f); rs == nil {
		t.Fatal("a table without flags is not read back")
	}
}

// TestNetlinkClaimsRaceNothing: the two families' backends claim and read
// back their tables at once, as a restarted nftproxy does; a claim is a
// commit that interrupts the other family's dumps, which must be retried,
// never turned into an error (the proxier would rewrite the table).
func TestNetlinkClaimsRaceNothing(t *testing.T) {
	ns := newTestNS(t)
	ns.requireOwnedTables(t)
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		n := ns.ownedNetlink(t)
		apply(t, n, nft.FullRewrite(nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 200, 2))))
		n.Close()
	}
	for round := range 30 {
		v4, v6 := ns.ownedNetlink(t), ns.ownedNetlink(t)
		errs := make(chan error, 2)
		for _, b := range []struct {
			n *Netlink
			f nft.Family
		}{{v4, nft.IPv4}, {v6, nft.IPv6}} {
			go func() {
				rs, err := b.n.Load(context.Background(), b.f)
				if err == nil && rs == nil {
					err = errors.New("no table read back")
				}
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		v4.Close()
		v6.Close()
	}
}

// TestNetlinkReadOnly: a read-only socket reads back a table another
// socket owns (which a proxy's socket would not build on), as it is, and
// never writes: its Apply is refused and the owner keeps the table.
func TestNetlinkReadOnly(t *testing.T) {
	ns := newTestNS(t)
	f := nft.IPv4
	desired := nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 5, 2))
	owner := ns.ownedNetlink(t)
	apply(t, owner, nft.FullRewrite(desired))
	ro, err := NewNetlink(NetlinkOptions{NetNSFd: ns.Fd, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	got := loadOn(t, ro, f)
	if got == nil {
		t.Fatal("read-only socket read no table")
	}
	if tx := nft.Diff(got, desired); !tx.Empty() {
		t.Errorf("table read back read-only differs from the one applied: %d ops", len(tx.Ops))
	}
	before := ns.list(t, f)
	if err := ro.Apply(context.Background(), nft.FullRewrite(desired)); !errors.Is(err, errReadOnly) {
		t.Errorf("read-only Apply: %v", err)
	}
	if after := ns.list(t, f); after != before {
		t.Errorf("read-only socket changed the table:\n%s", after)
	}
	apply(t, owner, nft.Diff(loadOn(t, owner, f), desired))
}

// TestNetlinkClaimThenRead: claiming both families' ownerless tables before
// reading either leaves both readings current; a claim after a reading
// (which Load makes when nothing was claimed) makes it stale.
func TestNetlinkClaimThenRead(t *testing.T) {
	ns := newTestNS(t)
	ns.requireOwnedTables(t)
	ctx := context.Background()
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		first := ns.ownedNetlink(t)
		apply(t, first, nft.FullRewrite(nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 5, 2))))
		first.Close() // ownerless now, as after kill -9
	}
	v4, v6 := ns.ownedNetlink(t), ns.ownedNetlink(t)
	for f, n := range map[nft.Family]*Netlink{nft.IPv4: v4, nft.IPv6: v6} {
		if err := n.Claim(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	r4, r6 := loadOn(t, v4, nft.IPv4), loadOn(t, v6, nft.IPv6)
	now, err := v4.Generation(ctx)
	if err != nil || r4 == nil || r6 == nil || r4.Generation != now || r6.Generation != now {
		t.Fatalf("claimed first, then read: readings at %v and %v, generation now %d (%v); want both current",
			r4 != nil && r4.Generation == now, r6 != nil && r6.Generation == now, now, err)
	}
	if _, err := ns.nft("", "add", "chain", "ip6", nft.TableName, "intruder"); err == nil {
		t.Fatal("another process changed a claimed table")
	}

	// Unclaimed: the second family's claim, inside its Load, moves the
	// generation past the first family's reading.
	v4.Close()
	v6.Close()
	v4, v6 = ns.ownedNetlink(t), ns.ownedNetlink(t)
	r4 = loadOn(t, v4, nft.IPv4)
	loadOn(t, v6, nft.IPv6)
	if now, err := v4.Generation(ctx); err != nil || now == r4.Generation {
		t.Errorf("a claim after a reading left the generation at %d (%v)", now, err)
	}
}
