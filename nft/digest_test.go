package nft_test

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"

	"context"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// phraseSamples has one phrase of every kind, every field set.
func phraseSamples() []nft.Phrase {
	return []nft.Phrase{
		nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: netip.MustParsePrefix("10.244.0.0/16"), Negate: true},
		nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto}, Set: "s", Negate: true},
		nft.MatchL4Proto{Proto: nft.ProtoTCP},
		nft.MatchCtStateNew{},
		nft.MatchCtStatusDNAT{},
		nft.MatchCtDirection{Reply: true},
		nft.MatchMarkBits{Mask: 0x4000},
		nft.SetMarkBits{Bits: 0x4000},
		nft.ToggleMarkBits{Bits: 0x4000},
		nft.Masquerade{},
		nft.Reject{},
		nft.RejectTCPReset{},
		nft.VerdictPhrase{nft.Verdict{Kind: nft.VerdictGoto, Chain: "c"}},
		nft.VmapLookup{Fields: []nft.Field{nft.FieldDstAddr}, Map: "m"},
		nft.MatchRandom{Mod: 3},
		nft.DNAT{To: netip.MustParseAddrPort("10.244.1.1:8080")},
		nft.MatchFibLocal{Field: nft.FieldSrcAddr},
		nft.MatchIifname{Name: "veth", Prefix: true, Negate: true},
		nft.UpdateSet{Field: nft.FieldSrcAddr, Set: "a"},
		nft.DNATMap{Proto: nft.ProtoUDP, Map: "m"},
		nft.DNATMap{Proto: nft.ProtoUDP, Map: "m", Slot: 1},
		nft.DNATPick{Proto: nft.ProtoUDP, Map: "m", Mod: 2},
		nft.DNATPick{Proto: nft.ProtoTCP, Map: "m", Mod: 3},
	}
}

// mutations returns copies of v, each with one field (or part of one)
// changed.
func mutations(v reflect.Value) []reflect.Value {
	switch x := v.Interface().(type) {
	case netip.Prefix:
		a := x.Addr().AsSlice()
		a[0]++
		other, _ := netip.AddrFromSlice(a)
		return []reflect.Value{reflect.ValueOf(netip.PrefixFrom(other, x.Bits())),
			reflect.ValueOf(netip.PrefixFrom(x.Addr(), x.Bits()-1).Masked())}
	case netip.AddrPort:
		return []reflect.Value{reflect.ValueOf(netip.AddrPortFrom(x.Addr().Next(), x.Port())),
			reflect.ValueOf(netip.AddrPortFrom(x.Addr(), x.Port()+1))}
	}
	one := func(f func(reflect.Value)) []reflect.Value {
		c := reflect.New(v.Type()).Elem()
		c.Set(v)
		f(c)
		return []reflect.Value{c}
	}
	switch v.Kind() {
	case reflect.Bool:
		return one(func(c reflect.Value) { c.SetBool(!c.Bool()) })
	case reflect.Int, reflect.Int32:
		return one(func(c reflect.Value) { c.SetInt(c.Int() + 1) })
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return one(func(c reflect.Value) { c.SetUint(c.Uint() + 1) })
	case reflect.String:
		return one(func(c reflect.Value) { c.SetString(c.String() + "x") })
	case reflect.Slice:
		return one(func(c reflect.Value) {
			c.Set(reflect.Append(reflect.AppendSlice(reflect.MakeSlice(v.Type(), 0, v.Len()+1), v), reflect.Zero(v.Type().Elem())))
		})
	case reflect.Struct:
		var out []reflect.Value
		for i := range v.NumField() {
			for _, m := range mutations(v.Field(i)) {
				c := reflect.New(v.Type()).Elem()
				c.Set(v)
				c.Field(i).Set(m)
				out = append(out, c)
			}
		}
		return out
	}
	panic(fmt.Sprintf("no mutation for %s", v.Type()))
}

// TestDigestSeesEveryField: changing any field of any phrase, or a rule's
// comment, changes the digest, and so does the family; a phrase kind the
// digest does not know falls back to its text. (A field added to a phrase
// without digestPhrase writing it fails here.)
func TestDigestSeesEveryField(t *testing.T) {
	kinds := map[string]bool{}
	for _, p := range phraseSamples() {
		kinds[fmt.Sprintf("%T", p)] = true
		for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
			base := nft.DigestRules(f, []nft.Rule{{Phrases: []nft.Phrase{p}}})
			for _, m := range mutations(reflect.ValueOf(p)) {
				q := m.Interface().(nft.Phrase)
				if nft.DigestRules(f, []nft.Rule{{Phrases: []nft.Phrase{q}}}) == base {
					t.Errorf("%s: %#v and %#v have the same digest", f, p, q)
				}
			}
		}
	}
	// Every phrase of rule.go is sampled (checkEveryPhraseKind names them).
	for _, c := range nfttest.EveryPhraseRuleset(nft.IPv4).Chains {
		for _, r := range c.Rules {
			for _, p := range r.Phrases {
				if !kinds[fmt.Sprintf("%T", p)] {
					t.Errorf("phraseSamples has no %T", p)
				}
			}
		}
	}
	r := nft.Rule{Phrases: []nft.Phrase{nft.Drop()}}
	if nft.DigestRules(nft.IPv4, []nft.Rule{r}) == nft.DigestRules(nft.IPv4, []nft.Rule{{Phrases: r.Phrases, Comment: "c"}}) {
		t.Error("a comment does not change the digest")
	}
	if nft.DigestRules(nft.IPv4, []nft.Rule{r}) == nft.DigestRules(nft.IPv6, []nft.Rule{r}) {
		t.Error("the family does not change the digest")
	}
	if nft.DigestRules(nft.IPv4, []nft.Rule{r, r}) == nft.DigestRules(nft.IPv4, []nft.Rule{r}) {
		t.Error("the number of rules does not change the digest")
	}
	// Phrases split differently across rules.
	a := []nft.Rule{{Phrases: []nft.Phrase{nft.MatchCtStateNew{}}}, {Phrases: []nft.Phrase{nft.Drop()}}}
	b := []nft.Rule{{Phrases: []nft.Phrase{nft.MatchCtStateNew{}, nft.Drop()}}, {}}
	if nft.DigestRules(nft.IPv4, a) == nft.DigestRules(nft.IPv4, b) {
		t.Error("rule boundaries do not change the digest")
	}
}

// TestDigestAgreesWithText: two rules have the same digest exactly when
// they have the same text (Rule.Equal).
func TestDigestAgreesWithText(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		var rules []nft.Rule
		for _, rs := range []*nft.Ruleset{nfttest.EveryPhraseRuleset(f), nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 20, 3))} {
			for _, c := range rs.Chains {
				rules = append(rules, c.Rules...)
			}
		}
		// Same text, different value: an unmasked prefix lists masked.
		rules = append(rules,
			nft.Rule{Phrases: []nft.Phrase{nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: nfttest.Prefix(f, "10.96.0.1/12", "fd00:96::1/108")}, nft.Drop()}},
			nft.Rule{Phrases: []nft.Phrase{nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: nfttest.Prefix(f, "10.96.0.0/12", "fd00:96::/108")}, nft.Drop()}})
		for i, a := range rules {
			for _, b := range rules[i+1:] {
				sameText := a.Text(f) == b.Text(f)
				sameDigest := nft.DigestRules(f, []nft.Rule{a}) == nft.DigestRules(f, []nft.Rule{b})
				if sameText != sameDigest {
					t.Errorf("%s: same text %v, same digest %v:\n%s\n%s", f, sameText, sameDigest, a.Text(f), b.Text(f))
				}
			}
		}
	}
}

// loadedForm returns rs as a Loader returns it: chains with a digest
// instead of rules.
func loadedForm(rs *nft.Ruleset) *nft.Ruleset {
	out := rs.Clone()
	for _, c := range out.Chains {
		c.Loaded = &nft.LoadedRules{Count: len(c.Rules)}
		if len(c.Rules) > 0 {
			c.Loaded.Digest, c.Loaded.HasDigest = nft.DigestRules(rs.Family, c.Rules), true
		}
		c.Rules = nil
	}
	return out
}

// TestDiffLoaded: against a loaded ruleset, a chain is kept when count and
// digest match, rewritten (flush and rules) otherwise; a foreign chain
// definition or a changed set definition rewrites the table.
func TestDiffLoaded(t *testing.T) {
	f := nft.IPv4
	svcs := nfttest.MakeServices(f, 30, 2)
	desired := nfttest.RealisticRuleset(f, svcs)
	if tx := nft.Diff(loadedForm(desired), desired); !tx.Empty() {
		t.Fatalf("unchanged: %s", nfttest.OpCounts(tx))
	}
	victim := svcs[3].Chain()
	for name, spoil := range map[string]func(*nft.LoadedRules){
		"no digest":       func(l *nft.LoadedRules) { l.HasDigest = false },
		"other digest":    func(l *nft.LoadedRules) { l.Digest[0]++ },
		"one rule more":   func(l *nft.LoadedRules) { l.Count++ },
		"one rule less":   func(l *nft.LoadedRules) { l.Count-- },
		"no rules at all": func(l *nft.LoadedRules) { *l = nft.LoadedRules{} },
	} {
		loaded := loadedForm(desired)
		spoil(loaded.Chains[victim].Loaded)
		tx := nft.Diff(loaded, desired)
		flush := loaded.Chains[victim].Loaded.Count > 0
		want := len(desired.Chains[victim].Rules)
		if flush {
			want++
		}
		if got := nfttest.RewrittenChains(tx); len(got) != 1 || got[0] != victim || len(tx.Ops) != want {
			t.Errorf("%s: %s on %v, want %d ops on %s", name, nfttest.OpCounts(tx), got, want, victim)
		}
		if tx.Ops[0].Kind == nft.OpAddRule && tx.Ops[0].Digest == nil || flush && tx.Ops[1].Digest == nil {
			t.Errorf("%s: the first rule carries no digest", name)
		}
	}
	// A chain nftproxy no longer wants, loaded: flushed and deleted.
	loaded := loadedForm(nfttest.RealisticRuleset(f, append(svcs, nfttest.MakeService(f, 98, 2))))
	if tx := nft.Diff(loaded, desired); nfttest.OpCounts(tx) != "flush-chain:1 delete-chain:1 delete-elements:2" {
		t.Errorf("gone Service: %s", nfttest.OpCounts(tx))
	}
	// Definitions that differ: a full rewrite.
	loaded = loadedForm(desired)
	loaded.Chains["nat-output"].Loaded.Foreign = true
	if tx := nft.Diff(loaded, desired); tx.Ops[0].Kind != nft.OpResetTable {
		t.Errorf("foreign base chain: %s", nfttest.OpCounts(tx))
	}
	loaded = loadedForm(desired)
	loaded.Sets["cluster-ips"].Key = nil
	if tx := nft.Diff(loaded, desired); tx.Ops[0].Kind != nft.OpResetTable {
		t.Errorf("set of another type: %s", nfttest.OpCounts(tx))
	}
}

// TestFakeRestart: the nftfake.Fake keeps digests like the kernel; an editor
// started from its Load sends nothing for an unchanged ruleset, only the
// change for a changed one, and rewrites a chain rewritten in place since
// it was created when its first rules are wanted again.
func TestFakeRestart(t *testing.T) {
	ctx := context.Background()
	f := nft.IPv4
	fk := nftfake.New()
	if rs, err := fk.Load(ctx, f); rs != nil || err != nil {
		t.Fatalf("empty nftfake.Fake: loaded %v, %v", rs, err)
	}
	editor := func(frags map[int]*nft.Fragment) *nft.Editor {
		loaded, err := fk.Load(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		ed := nft.NewEditorFrom(f, loaded)
		for _, s := range nft.EditorSets() {
			ed.AddSet(s)
		}
		for i := range len(frags) {
			ed.Replace(nil, frags[i])
		}
		return ed
	}
	run := func(ed *nft.Editor) *nft.Transaction {
		tx := ed.Transaction()
		if err := fk.Apply(ctx, tx); err != nil {
			t.Fatal(err)
		}
		ed.Commit()
		return tx
	}
	frags := map[int]*nft.Fragment{}
	for i := range 20 {
		frags[i] = nft.SvcFragment(i, []int{i, i + 1})
	}
	first := run(editor(frags))
	if first.Ops[0].Kind != nft.OpResetTable {
		t.Errorf("first start: %s", nfttest.OpCounts(first))
	}
	if tx := run(editor(frags)); !tx.Empty() {
		t.Errorf("restart, unchanged: %s", nfttest.OpCounts(tx))
	}
	// B by an incremental change, then a restart wanting A again.
	ed := editor(frags)
	run(ed)
	ed.Replace(frags[5], nft.SvcFragment(5, []int{7}))
	if tx := run(ed); len(nfttest.RewrittenChains(tx)) != 1 {
		t.Fatalf("incremental change: %s", nfttest.OpCounts(tx))
	}
	tx := run(editor(frags))
	if got := nfttest.RewrittenChains(tx); len(got) != 1 || got[0] != "svc-5" {
		t.Errorf("restart wanting the first rules again: %s on %v", nfttest.OpCounts(tx), got)
	}
	if got, want := fk.Dump(f), editor(frags).Ruleset().Dump(); got != want {
		t.Errorf("after the restarts the nftfake.Fake differs:\n%s\nwant:\n%s", got, want)
	}
	// A rule added without a digest (by hand): the chain is rewritten.
	if err := fk.Apply(ctx, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: "svc-3"}},
		{Kind: nft.OpAddRule, ChainName: "svc-3", Rule: frags[3].Chains[0].Rules[0]},
		{Kind: nft.OpAddRule, ChainName: "svc-3", Rule: frags[3].Chains[0].Rules[1]}}}); err != nil {
		t.Fatal(err)
	}
	if got := nfttest.RewrittenChains(run(editor(frags))); len(got) != 1 || got[0] != "svc-3" {
		t.Errorf("chain without digest: rewrote %v", got)
	}
	fk.FailNextLoad = fmt.Errorf("injected")
	if _, err := fk.Load(ctx, f); err == nil {
		t.Error("FailNextLoad was not returned")
	}
}
