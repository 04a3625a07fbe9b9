package nft

import (
	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"testing"
)

// editorSets are the shared sets the fragments of editorTest use.
func editorSets() []*Set {
	return []*Set{
		{Name: "ips", Key: []DataType{TypeIPv4Addr}},
		{Name: "dispatch", Key: []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService}, Data: []DataType{TypeVerdict}},
	}
}

// svcFragment is a Service-like fragment: a chain DNATing to its backends,
// a dispatch element, and one shared element per backend in "ips".
func svcFragment(i int, backends []int) *Fragment {
	chain := fmt.Sprintf("svc-%d", i)
	vip := netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})
	fr := &Fragment{Chains: []*Chain{{Name: chain}}}
	for j, b := range backends {
		to := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(b)}), 8080)
		ph := []Phrase{MatchL4Proto{ProtoTCP}}
		if left := len(backends) - j; left > 1 {
			ph = append(ph, MatchRandom{Mod: uint32(left)})
		}
		fr.Chains[0].Rules = append(fr.Chains[0].Rules, Rule{Phrases: append(ph, DNAT{To: to})})
		fr.Elements = append(fr.Elements, SetElement{"ips", Element{Key: []Datum{Addr(to.Addr())}}})
	}
	if len(backends) > 0 {
		fr.Elements = append(fr.Elements, SetElement{"dispatch", Element{
			Key:     []Datum{Addr(vip), Int(uint32(ProtoTCP)), Int(80)},
			Verdict: &Verdict{Kind: VerdictGoto, Chain: chain}, Comment: chain}})
	} else {
		fr.Chains = nil
	}
	return fr
}

// TestEditorMatchesFullRebuild: after every random change, the Fake that
// received only the Editor's transactions equals a ruleset built from
// scratch, and the change cost a handful of operations.
func TestEditorMatchesFullRebuild(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	fk := NewFake()
	ed := NewEditor(IPv4)
	for _, s := range editorSets() {
		ed.AddSet(s)
	}
	frags := map[int]*Fragment{}
	backends := map[int][]int{}
	for i := 0; i < 50; i++ {
		backends[i] = []int{rng.Intn(20), 20 + rng.Intn(20)}
		frags[i] = svcFragment(i, backends[i])
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
		want := NewRuleset(IPv4)
		for _, s := range editorSets() {
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
		if got := fk.Dump(IPv4); got != want.Dump() {
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
		fr := svcFragment(i, uniq)
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
	fk := NewFake()
	ed := NewEditor(IPv4)
	for _, s := range editorSets() {
		ed.AddSet(s)
	}
	a, b := svcFragment(1, []int{7}), svcFragment(2, []int{7})
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
	if !fk.Ruleset(IPv4).Sets["ips"].Elements.Has([]Datum{Addr(netip.MustParseAddr("10.244.0.7"))}) {
		t.Fatalf("shared element deleted while still needed; ops %+v", tx.Ops)
	}
}

// TestEditorReserveKeepsWhatIsThere: Reserve and ReserveChains make room
// only in an empty set or chain table; what an editor holds stays, and a
// table built after reserving is the one built without.
func TestEditorReserveKeepsWhatIsThere(t *testing.T) {
	build := func(reserve bool) *Ruleset {
		ed := NewEditor(IPv4)
		for _, s := range editorSets() {
			ed.AddSet(s)
		}
		if reserve {
			ed.ReserveChains(10)
			ed.Reserve("ips", 100)
			ed.Reserve("no-such-set", 100)
		}
		ed.Replace(nil, svcFragment(1, []int{7, 8}))
		if reserve {
			ed.ReserveChains(10)
			ed.Reserve("ips", 100)
			ed.Reserve("dispatch", 100)
		}
		ed.Replace(nil, svcFragment(2, []int{9}))
		return ed.Ruleset()
	}
	got, want := build(true), build(false)
	if Diff(want, got).Changes() != 0 || got.Dump() != want.Dump() {
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
	build := func(reuse bool) *Ruleset {
		ed := NewEditor(IPv4)
		for _, s := range editorSets() {
			ed.AddSet(s)
		}
		ed.AddSet(NewEndpointsMap(IPv4, "endpoints-tcp", ProtoTCP))
		var scratch Fragment
		for i := range 40 {
			fr := &Fragment{}
			datums := func(n int) []Datum { return make([]Datum, n) }
			if reuse {
				fr = &scratch
				fr.Reset()
				datums = fr.Datums
				// The same space each time: written, then zero again.
				z := fr.Datums(4)
				if z[0] != (Datum{}) || z[3] != (Datum{}) {
					t.Fatalf("Datums handed out %v, not zeros", z)
				}
				z[0], z[3] = Int(1), Int(2)
			}
			vip := datums(3)
			vip[0], vip[1], vip[2] = Addr(netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})), Int(uint32(ProtoTCP)), Int(80)
			chain := fmt.Sprintf("svc-%d", i)
			fr.Chains = append(fr.Chains, &Chain{Name: chain, Rules: []Rule{{Phrases: []Phrase{DNATMap{Proto: ProtoTCP, Map: "endpoints-tcp", Slot: uint16(i)}}}}})
			fr.Elements = append(fr.Elements, SetElement{"dispatch", Element{Key: vip, Verdict: &Verdict{Kind: VerdictGoto, Chain: chain}}})
			var eps []netip.AddrPort
			for j := range 1 + i%7 { // fragments of different sizes: the space grows
				eps = append(eps, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), byte(j)}), 8080))
			}
			if reuse {
				fr.AddEndpointsElements("endpoints-tcp", uint16(i), eps)
			} else {
				for _, e := range EndpointsElements(uint16(i), eps) {
					fr.Elements = append(fr.Elements, SetElement{"endpoints-tcp", e})
				}
			}
			for j, ep := range eps {
				ip := datums(1)
				ip[0] = Addr(ep.Addr())
				fr.Elements = append(fr.Elements, SetElement{"ips", Element{Key: ip, Comment: fmt.Sprint(j)}})
			}
			ed.Replace(nil, fr)
		}
		return ed.rs
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
		fk := NewFake()
		ed := NewEditor(IPv4)
		for _, s := range editorSets() {
			ed.AddSet(s)
		}
		for i := range 40 {
			ed.Replace(nil, svcFragment(i, randomBackends()))
		}
		if err := fk.Apply(ctx, ed.Transaction()); err != nil {
			t.Fatal(err)
		}
		// Behind our back: a stray shared element, a dispatch element
		// whose comment differs.
		sets := map[string]*Set{}
		for _, s := range editorSets() {
			sets[s.Name] = s
		}
		drift := &Transaction{Family: IPv4, Ops: []Op{
			{Kind: OpAddElements, Set: sets["ips"], Elements: []Element{{Key: []Datum{Addr(netip.MustParseAddr("10.244.9.9"))}}}},
		}}
		if rs := fk.Ruleset(IPv4); rs != nil {
			for e := range rs.Sets["dispatch"].Elements.All() {
				changed := e
				changed.Comment = "drifted"
				drift.Ops = append(drift.Ops,
					Op{Kind: OpDeleteElements, Set: sets["dispatch"], Elements: []Element{e}},
					Op{Kind: OpAddElements, Set: sets["dispatch"], Elements: []Element{changed}})
				break
			}
		}
		if err := fk.Apply(ctx, drift); err != nil {
			t.Fatal(err)
		}

		// The desired state: some Services changed, gone or new; a few
		// replaced once more before the first transaction.
		final := map[int]*Fragment{}
		adopting := NewEditorFrom(IPv4, mustLoad(t, fk, IPv4))
		beside := NewEditor(IPv4)
		for _, e := range []*Editor{adopting, beside} {
			for _, s := range editorSets() {
				e.AddSet(s)
			}
		}
		for i := range 50 {
			if rng.Intn(5) == 0 {
				continue // gone (or never there)
			}
			fr := svcFragment(i, randomBackends())
			adopting.Replace(nil, fr)
			if rng.Intn(6) == 0 {
				next := svcFragment(i, randomBackends())
				adopting.Replace(fr, next)
				fr = next
			}
			final[i] = fr
			beside.Replace(nil, fr)
		}
		want := Diff(mustLoad(t, fk, IPv4), beside.Ruleset())
		got := adopting.Transaction()
		if opCounts(got) != opCounts(want) || got.Changes() != want.Changes() {
			t.Fatalf("seed %d: adopting editor sends %s (%d changes), Diff %s (%d)",
				seed, opCounts(got), got.Changes(), opCounts(want), want.Changes())
		}
		if err := fk.Apply(ctx, got); err != nil {
			t.Fatal(err)
		}
		adopting.Commit()
		if g, w := fk.Dump(IPv4), beside.Ruleset().Dump(); g != w {
			t.Fatalf("seed %d: kernel after the adopting editor's transaction:\n%s\nwant:\n%s", seed, g, w)
		}
		// The editor goes on incrementally from there.
		adopting.Replace(final[1], svcFragment(1, []int{31, 32}))
		if err := fk.Apply(ctx, adopting.Transaction()); err != nil {
			t.Fatal(err)
		}
		adopting.Commit()
		if tx := adopting.Transaction(); !tx.Empty() {
			t.Fatalf("seed %d: no change, but %s", seed, opCounts(tx))
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
	key := []Datum{Addr(netip.MustParseAddr("192.0.2.1")), Int(uint32(ProtoTCP)), Int(80)}
	frag := func(chain string) *Fragment {
		return &Fragment{Chains: []*Chain{{Name: chain}}, Elements: []SetElement{{"dispatch",
			Element{Key: key, Verdict: &Verdict{Kind: VerdictGoto, Chain: chain}, Comment: chain}}}}
	}
	for _, adopt := range []bool{false, true} {
		for _, release := range [][]string{{"c", "b", "a"}, {"a", "b", "c"}, {"b", "a", "c"}} {
			fk := NewFake()
			ed := NewEditor(IPv4)
			if adopt { // the table has a, b and c already: a restart
				for _, s := range editorSets() {
					ed.AddSet(s)
				}
				for _, c := range []string{"a", "b", "c"} {
					ed.Replace(nil, frag(c))
				}
				if err := fk.Apply(context.Background(), ed.Transaction()); err != nil {
					t.Fatal(err)
				}
				loaded, err := fk.Load(context.Background(), IPv4)
				if err != nil {
					t.Fatal(err)
				}
				ed = NewEditorFrom(IPv4, loaded)
			}
			for _, s := range editorSets() {
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
				e, ok := fk.Ruleset(IPv4).Sets["dispatch"].Elements.Get(key)
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
			if len(ed.shared) != 0 {
				t.Errorf("holders left: %v", ed.shared)
			}
		}
	}
}
