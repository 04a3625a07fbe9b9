package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"context"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// load reads the table back on a new socket, as a restarted nftproxy does.
func load(t testing.TB, ns *testNS, f nft.Family) *nft.Ruleset {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rs, err := ns.netlink(t).Load(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestNetlinkLoadRoundTrip: what Load reads back is what was written —
// set definitions and elements equal, chains with their hooks, rule
// counts and digests — so diffing it against the same ruleset is empty.
func TestNetlinkLoadRoundTrip(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newTestNS(t)
			rs := nfttest.EveryPhraseRuleset(f)
			apply(t, ns.netlink(t), nft.Diff(nil, rs))
			got := load(t, ns, f)
			if got == nil {
				t.Fatal("Load found no table")
			}
			for name, want := range rs.Sets {
				have := got.Sets[name]
				if have == nil || !nft.SameSetDefinition(have, want) {
					t.Errorf("set %s: loaded %+v, want %+v", name, have, want)
					continue
				}
				if !sameElements(&have.Elements, &want.Elements) {
					t.Errorf("set %s: loaded elements %v, want %v", name, slices.Collect(have.Elements.All()), slices.Collect(want.Elements.All()))
				}
			}
			for name, want := range rs.Chains {
				have := got.Chains[name]
				switch {
				case have == nil || have.Loaded == nil:
					t.Errorf("chain %s: loaded %+v", name, have)
				case !reflect.DeepEqual(have.Base, want.Base) || have.Loaded.Foreign:
					t.Errorf("chain %s: loaded base %+v (foreign %v), want %+v", name, have.Base, have.Loaded.Foreign, want.Base)
				case !have.Loaded.Holds(f, want.Rules):
					t.Errorf("chain %s: loaded %+v does not hold its %d rules", name, *have.Loaded, len(want.Rules))
				case !slices.Equal(have.Loaded.Slots, nft.DNATMapSlots(want.Rules)):
					t.Errorf("chain %s: loaded slots %v, want %v", name, have.Loaded.Slots, nft.DNATMapSlots(want.Rules))
				}
			}
			if len(got.Sets) != len(rs.Sets) || len(got.Chains) != len(rs.Chains) {
				t.Errorf("loaded %d sets and %d chains, want %d and %d", len(got.Sets), len(got.Chains), len(rs.Sets), len(rs.Chains))
			}
			if tx := nft.Diff(got, rs); !tx.Empty() {
				t.Errorf("restart with an unchanged ruleset: %s", nfttest.OpCounts(tx))
			}
		})
	}
}

// TestNetlinkLoadGeneration: a table read back carries the ruleset
// generation it was read at, which Generation reads while nobody commits;
// any commit moves it, another process's in another table too.
func TestNetlinkLoadGeneration(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	ctx := context.Background()
	apply(t, n, nft.Diff(nil, nfttest.EveryPhraseRuleset(nft.IPv4)))
	rs, err := n.Load(ctx, nft.IPv4)
	if err != nil || rs == nil {
		t.Fatalf("Load: %v, %v", rs, err)
	}
	now, err := n.Generation(ctx)
	if err != nil || now != rs.Generation || now == 0 {
		t.Fatalf("read at generation %d, now %d (%v): want the same, not 0", rs.Generation, now, err)
	}
	ns.mustNft(t, "", "add", "table", "ip", "other")
	if moved, err := n.Generation(ctx); err != nil || moved == now {
		t.Errorf("after nft added a table: generation %d (%v), was %d", moved, err, now)
	}
}

// TestNetlinkLoadNoTable: no table, a table of the other family only, or a
// dormant table all load as nil (the first transaction writes it whole).
func TestNetlinkLoadNoTable(t *testing.T) {
	ns := newTestNS(t)
	if rs := load(t, ns, nft.IPv4); rs != nil {
		t.Errorf("empty namespace: loaded %d chains", len(rs.Chains))
	}
	apply(t, ns.netlink(t), nft.Diff(nil, nfttest.EveryPhraseRuleset(nft.IPv6)))
	ns.mustNft(t, "", "add", "table", "ip", "other")
	if rs := load(t, ns, nft.IPv4); rs != nil {
		t.Errorf("only an ip6 table of ours: loaded an ip one with %d chains", len(rs.Chains))
	}
	ns.mustNft(t, "", "add", "table", "ip6", nft.TableName, "{ flags dormant; }")
	if rs := load(t, ns, nft.IPv6); rs != nil {
		t.Errorf("dormant table: loaded %d chains", len(rs.Chains))
	}
}

// TestNetlinkRestart restarts against the kernel's state of 1,000
// Services: an unchanged ruleset sends nothing; a change sends only the
// change; a chain whose digest is gone (rewritten with nft), or which has
// a rule added by someone else, is rewritten alone; and a chain rewritten
// in place since it was created is rewritten when its first rules are
// wanted again.
func TestNetlinkRestart(t *testing.T) {
	f := nft.IPv4
	ns := newTestNS(t)
	svcs := nfttest.MakeServices(f, 1000, 3)
	desired := nfttest.RealisticRuleset(f, svcs)
	apply(t, ns.netlink(t), nft.Diff(nil, desired))

	restart := func(want *nft.Ruleset) *nft.Transaction {
		t.Helper()
		tx := nft.Diff(load(t, ns, f), want)
		for _, op := range tx.Ops {
			if op.Kind == nft.OpResetTable {
				t.Fatalf("restart resets the table: %s", nfttest.OpCounts(tx))
			}
		}
		apply(t, ns.netlink(t), tx)
		if got := ns.listed(t, f); got != ns.dumped(t, want) {
			t.Fatalf("after the restart transaction (%s) the kernel differs from the desired ruleset", nfttest.OpCounts(tx))
		}
		if again := nft.Diff(load(t, ns, f), want); !again.Empty() {
			t.Fatalf("a second restart is not empty: %s", nfttest.OpCounts(again))
		}
		return tx
	}

	if tx := restart(desired); !tx.Empty() {
		t.Errorf("unchanged: %s", nfttest.OpCounts(tx))
	}

	// One Service loses an endpoint: its chain is rewritten, nothing else.
	changed := slices.Clone(svcs)
	changed[500].Backends = changed[500].Backends[1:]
	desired = nfttest.RealisticRuleset(f, changed)
	tx := restart(desired)
	if got, want := nfttest.RewrittenChains(tx), []string{changed[500].Chain()}; !slices.Equal(got, want) {
		t.Errorf("one Service changed: rewrote %v (%s), want %v", got, nfttest.OpCounts(tx), want)
	}
	if n := len(tx.Ops); n != 3 {
		t.Errorf("one Service changed: %d ops (%s), want 3: flush and 2 rules", n, nfttest.OpCounts(tx))
	}

	// One Service gone, one new: its chains and elements, nothing else.
	changed = append(changed[1:], nfttest.MakeService(f, 5000, 3))
	desired = nfttest.RealisticRuleset(f, changed)
	tx = restart(desired)
	t.Logf("one Service gone, one new: %s", nfttest.OpCounts(tx))
	if n := tx.Changes(); n > 12 {
		t.Errorf("one Service gone, one new: %d changes (%s)", n, nfttest.OpCounts(tx))
	}

	// A chain written by nft carries no digest: rewritten, alone.
	victim := changed[100].Chain()
	var script strings.Builder
	fmt.Fprintf(&script, "flush chain ip %s %s\n", nft.TableName, victim)
	for _, r := range desired.Chains[victim].Rules {
		fmt.Fprintf(&script, "add rule ip %s %s %s\n", nft.TableName, victim, r.Text(f))
	}
	ns.mustNft(t, script.String(), "-f", "-")
	tx = restart(desired)
	if got := nfttest.RewrittenChains(tx); !slices.Equal(got, []string{victim}) || len(tx.Ops) != 1+len(desired.Chains[victim].Rules) {
		t.Errorf("chain without digest: rewrote %v (%s), want %s alone", got, nfttest.OpCounts(tx), victim)
	}

	// Rules someone else appended, one with an anonymous set: the count
	// differs; the anonymous set goes with its rule. A set someone else
	// added is deleted.
	ns.mustNft(t, "", "add", "rule", "ip", nft.TableName, "services", "counter")
	ns.mustNft(t, "", "add", "rule", "ip", nft.TableName, "masquerading", "ip daddr { 10.0.0.1, 10.0.0.2 } counter")
	ns.mustNft(t, "", "add", "set", "ip", nft.TableName, "foreign", "{ type ipv4_addr; }")
	tx = restart(desired)
	if got := nfttest.RewrittenChains(tx); !slices.Equal(got, []string{"masquerading", "services"}) {
		t.Errorf("chains with foreign rules: rewrote %v (%s), want masquerading and services", got, nfttest.OpCounts(tx))
	}
	if got := nfttest.OpCounts(tx); !strings.Contains(got, "delete-set:1") {
		t.Errorf("foreign set not deleted: %s", got)
	}

	// A chain rewritten in place keeps no stale digest: A, then B by an
	// incremental transaction, then a restart that wants A again.
	svcA := desired
	changed[200].Backends = changed[200].Backends[:1]
	svcB := nfttest.RealisticRuleset(f, changed)
	apply(t, ns.netlink(t), nft.Diff(svcA, svcB))
	tx = restart(svcA)
	if got := nfttest.RewrittenChains(tx); !slices.Equal(got, []string{changed[200].Chain()}) {
		t.Errorf("back to the first rules: rewrote %v (%s), want %s", got, nfttest.OpCounts(tx), changed[200].Chain())
	}
}

// TestNetlinkRestart10k measures a restart at 10,000 Services × 5
// endpoints (NFTPROXY_LOAD_SERVICES=100000 for more): Load's time, and the
// restart transaction, which must be empty.
func TestNetlinkRestart10k(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 services: not in -short")
	}
	count := 10000
	if s := os.Getenv("NFTPROXY_LOAD_SERVICES"); s != "" {
		fmt.Sscan(s, &count)
	}
	f := nft.IPv4
	ns := newTestNS(t)
	desired := nfttest.RealisticRuleset(f, nfttest.MakeServices(f, count, 5))
	start := time.Now()
	apply(t, ns.netlink(t), nft.Diff(nil, desired))
	t.Logf("%d Services: full rewrite %v (%d rules)", count, time.Since(start).Round(time.Millisecond), countRules(desired))

	n := ns.netlink(t)
	for round := range 3 {
		start = time.Now()
		loaded, err := n.Load(context.Background(), f)
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		start = time.Now()
		tx := nft.Diff(loaded, desired)
		t.Logf("round %d: Load %v (%d chains, %d sets, %d elements), Diff %v: %d ops",
			round, took.Round(time.Millisecond), len(loaded.Chains), len(loaded.Sets), countElements(loaded),
			time.Since(start).Round(time.Millisecond), len(tx.Ops))
		if !tx.Empty() {
			t.Fatalf("restart with unchanged state: %s", nfttest.OpCounts(tx))
		}
	}
}

func countRules(rs *nft.Ruleset) int {
	n := 0
	for _, c := range rs.Chains {
		n += len(c.Rules)
	}
	return n
}

func countElements(rs *nft.Ruleset) int {
	n := 0
	for _, s := range rs.Sets {
		n += s.Elements.Len()
	}
	return n
}

// sameElements reports whether two sets hold the same elements.
func sameElements(a, b *nft.Elements) bool {
	if a.Len() != b.Len() {
		return false
	}
	for e := range a.All() {
		if w, ok := b.Get(e.Key); !ok || !reflect.DeepEqual(w, e) {
			return false
		}
	}
	return true
}

// TestNetlinkPickMapKeyTypeRewritten: a pick map whose key type names
// integer for its numgen field, as nft writes it (here from nftproxy's own
// dump) and nftproxy did before setKeyMagic, loads as a map that is not
// the pick map wanted, so the next transaction writes it anew, and a
// restart finds nothing to do. (e2e/nodes' TestNftReleasesListRewrittenPickMaps
// lists the rewritten maps with every Debian release's nft.)
func TestNetlinkPickMapKeyTypeRewritten(t *testing.T) {
	f := nft.IPv4
	ns := newTestNS(t)
	// The pick maps and their chain of every phrase: Load reads back a
	// table that nft wrote only if it has no endpoints map (nft opens
	// those with an interval end Load refuses).
	rs := nfttest.PickMapsRuleset(f)
	ns.requireNftReads(t, rs.Dump())
	ns.mustNft(t, rs.Dump(), "-f", "-")
	loaded := load(t, ns, f)
	if loaded == nil {
		t.Fatal("Load found no table")
	}
	picks := 0
	for name, want := range rs.Sets {
		if want.PickProto == 0 {
			continue
		}
		picks++
		if have := loaded.Sets[name]; have == nil || nft.SameSetDefinition(have, want) || have.PickProto != 0 {
			t.Errorf("pick map %s written by nft (key type integer) loaded as %+v: want a set that is not the pick map", name, have)
		}
	}
	if picks == 0 {
		t.Fatal("no pick map in the ruleset")
	}
	apply(t, ns.netlink(t), nft.Diff(loaded, rs))
	got := load(t, ns, f)
	for name, want := range rs.Sets {
		if have := got.Sets[name]; want.PickProto != 0 && (have == nil || !nft.SameSetDefinition(have, want) || !sameElements(&have.Elements, &want.Elements)) {
			t.Errorf("pick map %s rewritten: loaded %+v, want %+v", name, have, want)
		}
	}
	if tx := nft.Diff(got, rs); !tx.Empty() {
		t.Errorf("restart after the rewrite: %s", nfttest.OpCounts(tx))
	}
}
