package nft_test

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"testing"
)

// TestEditorMatchesFullRebuild: after every random change, the nftfake.Fake that
// received only the Editor's transactions equals a ruleset built from
// scratch, and the change cost a handful of operations.
func TestEditorMatchesFullRebuild(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	fk := nftfake.New()
	ed := nft.NewEditor(nft.IPv4)
	for _, s := range nft.EditorSets() {
		ed.AddSet(s)
	}
	frags := map[int]*nft.Fragment{}
	backends := map[int][]int{}
	for i := 0; i < 50; i++ {
		backends[i] = []int{rng.Intn(20), 20 + rng.Intn(20)}
		frags[i] = nft.SvcFragment(i, backends[i])
		ed.Replace(nil, frags[i])
	}
	commit := func(maxChanges int) {
		t.Helper()
		tx := ed.Transaction()
		if err := fk.Apply(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		ed.Commit()
		if maxChanges >= 0 && tx.Changes() > maxChanges {
			t.Fatalf("%d changes, want at most %d: %+v", tx.Changes(), maxChanges, tx.Ops)
		}
		want := nft.NewRuleset(nft.IPv4)
		for _, s := range nft.EditorSets() {
			want.AddSet(s)
		}
		for _, fr := range frags {
			for _, c := range fr.Chains {
				want.AddChain(c)
			}
			for _, se := range fr.Elements {
				want.AddElement(se.Set, se.Element)
			}
		}
		if got := fk.Dump(nft.IPv4); got != want.Dump() {
			t.Fatalf("kernel differs from full rebuild:\n%s\nwant:\n%s", got, want.Dump())
		}
	}
	commit(-1)
	for step := 0; step < 300; step++ {
		i := rng.Intn(60)
		var next []int
		switch rng.Intn(4) {
		case 0: // remove
		default:
			for n := rng.Intn(4); n > 0; n-- {
				next = append(next, rng.Intn(40))
			}
		}
		// dedupe backends
		seen := map[int]bool{}
		var uniq []int
		for _, b := range next {
			if !seen[b] {
				seen[b] = true
				uniq = append(uniq, b)
			}
		}
		fr := nft.SvcFragment(i, uniq)
		ed.Replace(frags[i], fr)
		if len(uniq) == 0 {
			delete(frags, i)
		} else {
			frags[i] = fr
		}
		// One Service: its chain (flush, ≤3 rules, or delete), its dispatch
		// element (delete + add), ≤3 old and ≤3 new shared elements.
		commit(2 + 3 + 2 + 6)
	}
	if tx := ed.Transaction(); !tx.Empty() {
		t.Fatalf("no change, but %d ops", len(tx.Ops))
	}
}

func TestEditorSharedElementSurvivesOneOwner(t *testing.T) {
	fk := nftfake.New()
	ed := nft.NewEditor(nft.IPv4)
	for _, s := range nft.EditorSets() {
		ed.AddSet(s)
	}
	a, b := nft.SvcFragment(1, []int{7}), nft.SvcFragment(2, []int{7})
	ed.Replace(nil, a)
	ed.Replace(nil, b)
	if err := fk.Apply(context.Background(), ed.Transaction()); err != nil {
		t.Fatal(err)
	}
	ed.Commit()
	ed.Replace(a, nil)
	tx := ed.Transaction()
	if err := fk.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if !fk.Ruleset(nft.IPv4).Sets["ips"].Elements.Has([]nft.Datum{nft.Addr(netip.MustParseAddr("10.244.0.7"))}) {
		t.Fatalf("shared element deleted while still needed; ops %+v", tx.Ops)
	}
}

// TestEditorReserveKeepsWhatIsThere: Reserve and ReserveChains make room
// only in an empty set or chain table; what an editor holds stays, and a
// table built after reserving is the one built without.
func TestEditorReserveKeepsWhatIsThere(t *testing.T) {
	build := func(reserve bool) *nft.Ruleset {
		ed := nft.NewEditor(nft.IPv4)
		for _, s := range nft.EditorSets() {
			ed.AddSet(s)
		}
		if reserve {
			ed.ReserveChains(10)
			ed.Reserve("ips", 100)
			ed.Reserve("no-such-set", 100)
		}
		ed.Replace(nil, nft.SvcFragment(1, []int{7, 8}))
		if reserve {
			ed.ReserveChains(10)
			ed.Reserve("ips", 100)
			ed.Reserve("dispatch", 100)
		}
		ed.Replace(nil, nft.SvcFragment(2, []int{9}))
		return ed.Ruleset()
	}
	got, want := build(true), build(false)
	if nft.Diff(want, got).Changes() != 0 || got.Dump() != want.Dump() {
		t.Errorf("reserving changed the table:\n%s\nwant\n%s", got.Dump(), want.Dump())
	}
	if n := got.Sets["ips"].Elements.Len(); n != 3 {
		t.Errorf("ips holds %d elements, want 3", n)
	}
}

// TestFragmentReuse: fragments built one after another in the memory of
// one (Reset, Datums, AddEndpointsElements), each given to the Editor
// before the next, leave the Editor with the ruleset of fragments built
// apart in memory of their own: the Editor keeps nothing of a fragment's
// elements, and Datums hands out space no other element uses.
func TestFragmentReuse(t *testing.T) {
	build := func(reuse bool) *nft.Ruleset {
		ed := nft.NewEditor(nft.IPv4)
		for _, s := range nft.EditorSets() {
			ed.AddSet(s)
		}
		ed.AddSet(nft.NewEndpointsMap(nft.IPv4, "endpoints-tcp", nft.ProtoTCP))
		var scratch nft.Fragment
		for i := range 40 {
			fr := &nft.Fragment{}
			datums := func(n int) []nft.Datum { return make([]nft.Datum, n) }
			if reuse {
				fr = &scratch
				fr.Reset()
				datums = fr.Datums
				// The same space each time: written, then zero again.
				z := fr.Datums(4)
				if z[0] != (nft.Datum{}) || z[3] != (nft.Datum{}) {
					t.Fatalf("Datums handed out %v, not zeros", z)
				}
				z[0], z[3] = nft.Int(1), nft.Int(2)
			}
			vip := datums(3)
			vip[0], vip[1], vip[2] = nft.Addr(netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})), nft.Int(uint32(nft.ProtoTCP)), nft.Int(80)
			chain := fmt.Sprintf("svc-%d", i)
			fr.Chains = append(fr.Chains, &nft.Chain{Name: chain, Rules: []nft.Rule{{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoTCP, Map: "endpoints-tcp", Slot: uint16(i)}}}}})
			fr.Elements = append(fr.Elements, nft.SetElement{"dispatch", nft.Element{Key: vip, Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: chain}}})
			var eps []netip.AddrPort
			for j := range 1 + i%7 { // fragments of different sizes: the space grows
				eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j)}), 8080))
			}
			if reuse {
				fr.AddEndpointsElements("endpoints-tcp", uint16(i), eps, "")
			} else {
				for _, e := range nft.EndpointsElements(uint16(i), eps) {
					fr.Elements = append(fr.Elements, nft.SetElement{"endpoints-tcp", e})
				}
			}
			for j, ep := range eps {
				ip := datums(1)
				ip[0] = nft.Addr(ep.Addr())
				fr.Elements = append(fr.Elements, nft.SetElement{"ips", nft.Element{Key: ip, Comment: fmt.Sprint(j)}})
			}
			ed.Replace(nil, fr)
		}
		return ed.Ruleset()
	}
	if got, want := build(true).Dump(), build(false).Dump(); got != want {
		t.Errorf("fragments built in one's memory:\n%s\nwant:\n%s", got, want)
	}
}

// TestEditorAdoptionMatchesDiff: an editor from the table read back, which
// builds the desired sets in the memory of the sets read back, sends what
// Diff of the table read back against the desired ruleset built beside it
// sends, and leaves the kernel equal to that ruleset: with elements kept,
// changed (in the kernel behind our back too), added, dropped, shared by
// several fragments, stray ones the kernel has and no fragment wants, and
// fragments replaced before the first transaction.
func TestEditorAdoptionMatchesDiff(t *testing.T) {
	ctx := context.Background()
	for seed := int64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewSource(seed))
		randomBackends := func() []int {
			seen := map[int]bool{}
			var out []int
			for n := rng.Intn(4); n > 0; n-- {
				if b := rng.Intn(30); !seen[b] {
					seen[b] = true
					out = append(out, b)
				}
			}
			return out
		}
		fk := nftfake.New()
		ed := nft.NewEditor(nft.IPv4)
		for _, s := range nft.EditorSets() {
			ed.AddSet(s)
		}
		for i := range 40 {
			ed.Replace(nil, nft.SvcFragment(i, randomBackends()))
		}
		if err := fk.Apply(ctx, ed.Transaction()); err != nil {
			t.Fatal(err)
		}
		// Behind our back: a stray shared element, a dispatch element
		// whose comment differs.
		sets := map[string]*nft.Set{}
		for _, s := range nft.EditorSets() {
			sets[s.Name] = s
		}
		drift := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{
			{Kind: nft.OpAddElements, Set: sets["ips"], Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(netip.MustParseAddr("10.244.9.9"))}}}},
		}}
		if rs := fk.Ruleset(nft.IPv4); rs != nil {
			for e := range rs.Sets["dispatch"].Elements.All() {
				changed := e
				changed.Comment = "drifted"
				drift.Ops = append(drift.Ops,
					nft.Op{Kind: nft.OpDeleteElements, Set: sets["dispatch"], Elements: []nft.Element{e}},
					nft.Op{Kind: nft.OpAddElements, Set: sets["dispatch"], Elements: []nft.Element{changed}})
				break
			}
		}
		if err := fk.Apply(ctx, drift); err != nil {
			t.Fatal(err)
		}

		// The desired state: some Services changed, gone or new; a few
		// replaced once more before the first transaction.
		final := map[int]*nft.Fragment{}
		adopting := nft.NewEditorFrom(nft.IPv4, nfttest.MustLoad(t, fk, nft.IPv4))
		beside := nft.NewEditor(nft.IPv4)
		for _, e := range []*nft.Editor{adopting, beside} {
			for _, s := range nft.EditorSets() {
				e.AddSet(s)
			}
		}
		for i := range 50 {
			if rng.Intn(5) == 0 {
				continue // gone (or never there)
			}
			fr := nft.SvcFragment(i, randomBackends())
			adopting.Replace(nil, fr)
			if rng.Intn(6) == 0 {
				next := nft.SvcFragment(i, randomBackends())
				adopting.Replace(fr, next)
				fr = next
			}
			final[i] = fr
			beside.Replace(nil, fr)
		}
		want := nft.Diff(nfttest.MustLoad(t, fk, nft.IPv4), beside.Ruleset())
		got := adopting.Transaction()
		if nfttest.OpCounts(got) != nfttest.OpCounts(want) || got.Changes() != want.Changes() {
			t.Fatalf("seed %d: adopting editor sends %s (%d changes), Diff %s (%d)",
				seed, nfttest.OpCounts(got), got.Changes(), nfttest.OpCounts(want), want.Changes())
		}
		if err := fk.Apply(ctx, got); err != nil {
			t.Fatal(err)
		}
		adopting.Commit()
		if g, w := fk.Dump(nft.IPv4), beside.Ruleset().Dump(); g != w {
			t.Fatalf("seed %d: kernel after the adopting editor's transaction:\n%s\nwant:\n%s", seed, g, w)
		}
		// The editor goes on incrementally from there.
		adopting.Replace(final[1], nft.SvcFragment(1, []int{31, 32}))
		if err := fk.Apply(ctx, adopting.Transaction()); err != nil {
			t.Fatal(err)
		}
		adopting.Commit()
		if tx := adopting.Transaction(); !tx.Empty() {
			t.Fatalf("seed %d: no change, but %s", seed, nfttest.OpCounts(tx))
		}
	}
}

// TestEditorSharedElementOfTwoValues: two fragments may put one key with
// different values (two Services with one external IP and port). The
// element has the latest holder's value; when that holder goes, the
// remaining one's, so that it never points to a chain that is gone (the
// kernel refuses to delete a chain an element uses). Also when the editor
// started from the table read back.
func TestEditorSharedElementOfTwoValues(t *testing.T) {
	key := []nft.Datum{nft.Addr(netip.MustParseAddr("192.0.2.1")), nft.Int(uint32(nft.ProtoTCP)), nft.Int(80)}
	frag := func(chain string) *nft.Fragment {
		return &nft.Fragment{Chains: []*nft.Chain{{Name: chain}}, Elements: []nft.SetElement{{"dispatch",
			nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: chain}, Comment: chain}}}}
	}
	for _, adopt := range []bool{false, true} {
		for _, release := range [][]string{{"c", "b", "a"}, {"a", "b", "c"}, {"b", "a", "c"}} {
			fk := nftfake.New()
			ed := nft.NewEditor(nft.IPv4)
			if adopt { // the table has a, b and c already: a restart
				for _, s := range nft.EditorSets() {
					ed.AddSet(s)
				}
				for _, c := range []string{"a", "b", "c"} {
					ed.Replace(nil, frag(c))
				}
				if err := fk.Apply(context.Background(), ed.Transaction()); err != nil {
					t.Fatal(err)
				}
				loaded, err := fk.Load(context.Background(), nft.IPv4)
				if err != nil {
					t.Fatal(err)
				}
				ed = nft.NewEditorFrom(nft.IPv4, loaded)
			}
			for _, s := range nft.EditorSets() {
				ed.AddSet(s)
			}
			held := map[string]bool{"a": true, "b": true, "c": true}
			for _, c := range []string{"a", "b", "c"} {
				ed.Replace(nil, frag(c))
			}
			latest := func() string {
				for _, c := range []string{"c", "b", "a"} {
					if held[c] {
						return c
					}
				}
				return ""
			}
			for i := 0; ; i++ {
				if err := fk.Apply(context.Background(), ed.Transaction()); err != nil {
					t.Fatalf("adopted %v, released %v: %v", adopt, release[:i], err)
				}
				ed.Commit()
				e, ok := fk.Ruleset(nft.IPv4).Sets["dispatch"].Elements.Get(key)
				switch want := latest(); {
				case want == "" && ok:
					t.Fatalf("adopted %v: element kept after every holder released it", adopt)
				case want != "" && (!ok || e.Verdict.Chain != want || e.Comment != want):
					t.Fatalf("adopted %v, released %v: element %+v, want the value of %s", adopt, release[:i], e, want)
				}
				if i == len(release) {
					break
				}
				ed.Replace(frag(release[i]), nil)
				held[release[i]] = false
			}
			if nft.SharedCount(ed) != 0 {
				t.Errorf("holders left: %v", nft.SharedCount(ed))
			}
		}
	}
}
