package nft

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// phraseSamples has one phrase of every kind, every field set.
func phraseSamples() []Phrase {
	return []Phrase{
		MatchPrefix{Field: FieldSrcAddr, Prefix: netip.MustParsePrefix("10.244.0.0/16"), Negate: true},
		MatchSet{Fields: []Field{FieldDstAddr, FieldL4Proto}, Set: "s", Negate: true},
		MatchL4Proto{Proto: ProtoTCP},
		MatchCtStateNew{},
		MatchCtStatusDNAT{},
		MatchMarkBits{Mask: 0x4000},
		SetMarkBits{Bits: 0x4000},
		ToggleMarkBits{Bits: 0x4000},
		Masquerade{},
		Reject{},
		RejectTCPReset{},
		VerdictPhrase{Verdict{Kind: VerdictGoto, Chain: "c"}},
		VmapLookup{Fields: []Field{FieldDstAddr}, Map: "m"},
		MatchRandom{Mod: 3},
		DNAT{To: netip.MustParseAddrPort("10.244.1.1:8080")},
		MatchFibLocal{Field: FieldSrcAddr},
		MatchIifname{Name: "veth", Prefix: true, Negate: true},
		UpdateSet{Field: FieldSrcAddr, Set: "a"},
		DNATMap{Proto: ProtoUDP, Map: "m"},
		DNATMap{Proto: ProtoUDP, Map: "m", Slot: 1},
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
		for _, f := range []Family{IPv4, IPv6} {
			base := DigestRules(f, []Rule{{Phrases: []Phrase{p}}})
			for _, m := range mutations(reflect.ValueOf(p)) {
				q := m.Interface().(Phrase)
				if DigestRules(f, []Rule{{Phrases: []Phrase{q}}}) == base {
					t.Errorf("%s: %#v and %#v have the same digest", f, p, q)
				}
			}
		}
	}
	// Every phrase of rule.go is sampled (checkEveryPhraseKind names them).
	for _, c := range everyPhraseRuleset(IPv4).Chains {
		for _, r := range c.Rules {
			for _, p := range r.Phrases {
				if !kinds[fmt.Sprintf("%T", p)] {
					t.Errorf("phraseSamples has no %T", p)
				}
			}
		}
	}
	r := Rule{Phrases: []Phrase{Drop()}}
	if DigestRules(IPv4, []Rule{r}) == DigestRules(IPv4, []Rule{{Phrases: r.Phrases, Comment: "c"}}) {
		t.Error("a comment does not change the digest")
	}
	if DigestRules(IPv4, []Rule{r}) == DigestRules(IPv6, []Rule{r}) {
		t.Error("the family does not change the digest")
	}
	if DigestRules(IPv4, []Rule{r, r}) == DigestRules(IPv4, []Rule{r}) {
		t.Error("the number of rules does not change the digest")
	}
	// Phrases split differently across rules.
	a := []Rule{{Phrases: []Phrase{MatchCtStateNew{}}}, {Phrases: []Phrase{Drop()}}}
	b := []Rule{{Phrases: []Phrase{MatchCtStateNew{}, Drop()}}, {}}
	if DigestRules(IPv4, a) == DigestRules(IPv4, b) {
		t.Error("rule boundaries do not change the digest")
	}
}

// TestDigestAgreesWithText: two rules have the same digest exactly when
// they have the same text (Rule.Equal).
func TestDigestAgreesWithText(t *testing.T) {
	for _, f := range []Family{IPv4, IPv6} {
		var rules []Rule
		for _, rs := range []*Ruleset{everyPhraseRuleset(f), realisticRuleset(f, makeServices(f, 20, 3))} {
			for _, c := range rs.Chains {
				rules = append(rules, c.Rules...)
			}
		}
		// Same text, different value: an unmasked prefix lists masked.
		rules = append(rules,
			Rule{Phrases: []Phrase{MatchPrefix{Field: FieldDstAddr, Prefix: prefix(f, "10.96.0.1/12", "fd00:96::1/108")}, Drop()}},
			Rule{Phrases: []Phrase{MatchPrefix{Field: FieldDstAddr, Prefix: prefix(f, "10.96.0.0/12", "fd00:96::/108")}, Drop()}})
		for i, a := range rules {
			for _, b := range rules[i+1:] {
				sameText := a.Text(f) == b.Text(f)
				sameDigest := DigestRules(f, []Rule{a}) == DigestRules(f, []Rule{b})
				if sameText != sameDigest {
					t.Errorf("%s: same text %v, same digest %v:\n%s\n%s", f, sameText, sameDigest, a.Text(f), b.Text(f))
				}
			}
		}
	}
}

// TestRuleUserdata: the comment and the digest share the userdata; a digest
// that would not fit the kernel's 256 bytes next to a long comment is left
// out, the comment never.
func TestRuleUserdata(t *testing.T) {
	d := RulesDigest{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	for _, tc := range []struct {
		comment string
		digest  *RulesDigest
	}{
		{"masquerade", nil},
		{"", &d},
		{"masquerade", &d},
		{strings.Repeat("c", 235), &d}, // 2+236 + 2+16 = 256: fits
		{strings.Repeat("c", 236), &d}, // 257: the digest is left out
		{strings.Repeat("c", 253), &d},
	} {
		var e encoder
		if err := e.ruleUserdata(tc.comment, tc.digest); err != nil {
			t.Fatal(err)
		}
		attrs := parseNLAs(e.b)
		if len(attrs) != 1 || len(attrs[0].data) > 256 {
			t.Fatalf("comment of %d bytes: %v", len(tc.comment), attrs)
		}
		want := tc.digest != nil && (tc.comment == "" || 2+len(tc.comment)+1+2+16 <= 256)
		if got, ok := ruleDigest(attrs[0].data); ok != want || ok && got != d {
			t.Errorf("comment of %d bytes: digest %x %v, want %v", len(tc.comment), got, ok, want)
		}
		if tc.comment != "" && !strings.HasPrefix(string(attrs[0].data[2:]), tc.comment+"\x00") {
			t.Errorf("comment of %d bytes lost", len(tc.comment))
		}
	}
	var e encoder
	if e.ruleUserdata("", nil); len(e.b) != 0 {
		t.Errorf("no comment, no digest: wrote %x", e.b)
	}
	if err := e.ruleUserdata(strings.Repeat("c", 254), nil); err == nil {
		t.Error("a 254-byte comment was accepted: with its type, length and NUL it exceeds 256 bytes")
	}
}

// TestDecodeInvertsEncode: the set types and element values Load decodes
// are the ones newSet and setElements encode, for every set shape.
func TestDecodeInvertsEncode(t *testing.T) {
	for _, f := range []Family{IPv4, IPv6} {
		for _, rs := range []*Ruleset{everyPhraseRuleset(f), realisticRuleset(f, makeServices(f, 60, 2))} {
			for _, s := range rs.Sets {
				key, ok := decodeTypes(typeMagic(s.Key), uint32(tupleLen(s.Key)))
				if !ok || !reflect.DeepEqual(key, s.Key) {
					t.Errorf("%s: key types %v decoded as %v", s.Name, s.Key, key)
				}
				for e := range s.Elements.All() {
					b, err := encodeKey(f, s, e.Key)
					if err != nil {
						t.Fatal(err)
					}
					got, err := decodeTupleOrder(nil, f, s.Key, b, s.Endpoints != 0)
					if err != nil || s.KeyString(got) != s.KeyString(e.Key) {
						t.Errorf("%s: key %s decoded as %v (%v)", s.Name, s.KeyString(e.Key), got, err)
					}
				}
			}
		}
	}
	if _, ok := decodeTypes(typeMagic([]DataType{TypeIPv4Addr}), 16); ok {
		t.Error("a length that does not fit the type was accepted")
	}
	if _, ok := decodeTypes(50, 4); ok {
		t.Error("an unknown type was accepted")
	}
	mark := []DataType{TypeMark}
	b, _ := encodeTuple(IPv4, mark, []Datum{Int(0x4000)})
	if got, _ := decodeTupleOrder(nil, IPv4, mark, b, false); got[0].Int != 0x4000 {
		t.Errorf("mark decoded as %v", got)
	}
	for _, k := range []VerdictKind{VerdictAccept, VerdictDrop, VerdictReturn, VerdictJump, VerdictGoto} {
		var e encoder
		e.verdict(Verdict{Kind: k, Chain: "c"})
		var got Verdict
		forEachAttr(e.b, func(t uint16, d []byte) { got = decodeVerdict(d) })
		if got.Kind != k {
			t.Errorf("verdict %s decoded as %s", k, got.Kind)
		}
	}
}

// opCounts summarises a transaction: operations by kind, and elements.
func opCounts(tx *Transaction) string {
	kinds := map[OpKind]int{}
	for _, op := range tx.Ops {
		if op.Kind == OpAddElements || op.Kind == OpDeleteElements {
			kinds[op.Kind] += len(op.Elements)
		} else {
			kinds[op.Kind]++
		}
	}
	var parts []string
	for k := OpResetTable; k <= OpDeleteElements; k++ {
		if kinds[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", k, kinds[k]))
		}
	}
	return strings.Join(parts, " ")
}

// rewrittenChains names the chains a transaction flushes or adds rules to.
func rewrittenChains(tx *Transaction) []string {
	seen := map[string]bool{}
	for _, op := range tx.Ops {
		switch op.Kind {
		case OpFlushChain:
			seen[op.Chain.Name] = true
		case OpAddRule:
			seen[op.ChainName] = true
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// loadedForm returns rs as a Loader returns it: chains with a digest
// instead of rules.
func loadedForm(rs *Ruleset) *Ruleset {
	out := rs.Clone()
	for _, c := range out.Chains {
		c.Loaded = &LoadedRules{Count: len(c.Rules)}
		if len(c.Rules) > 0 {
			c.Loaded.Digest, c.Loaded.HasDigest = DigestRules(rs.Family, c.Rules), true
		}
		c.Rules = nil
	}
	return out
}

// TestDiffLoaded: against a loaded ruleset, a chain is kept when count and
// digest match, rewritten (flush and rules) otherwise; a foreign chain
// definition or a changed set definition rewrites the table.
func TestDiffLoaded(t *testing.T) {
	f := IPv4
	svcs := makeServices(f, 30, 2)
	desired := realisticRuleset(f, svcs)
	if tx := Diff(loadedForm(desired), desired); !tx.Empty() {
		t.Fatalf("unchanged: %s", opCounts(tx))
	}
	victim := svcs[3].chain()
	for name, spoil := range map[string]func(*LoadedRules){
		"no digest":       func(l *LoadedRules) { l.HasDigest = false },
		"other digest":    func(l *LoadedRules) { l.Digest[0]++ },
		"one rule more":   func(l *LoadedRules) { l.Count++ },
		"one rule less":   func(l *LoadedRules) { l.Count-- },
		"no rules at all": func(l *LoadedRules) { *l = LoadedRules{} },
	} {
		loaded := loadedForm(desired)
		spoil(loaded.Chains[victim].Loaded)
		tx := Diff(loaded, desired)
		flush := loaded.Chains[victim].Loaded.Count > 0
		want := len(desired.Chains[victim].Rules)
		if flush {
			want++
		}
		if got := rewrittenChains(tx); len(got) != 1 || got[0] != victim || len(tx.Ops) != want {
			t.Errorf("%s: %s on %v, want %d ops on %s", name, opCounts(tx), got, want, victim)
		}
		if tx.Ops[0].Kind == OpAddRule && tx.Ops[0].Digest == nil || flush && tx.Ops[1].Digest == nil {
			t.Errorf("%s: the first rule carries no digest", name)
		}
	}
	// A chain nftproxy no longer wants, loaded: flushed and deleted.
	loaded := loadedForm(realisticRuleset(f, append(svcs, makeService(f, 98, 2))))
	if tx := Diff(loaded, desired); opCounts(tx) != "flush-chain:1 delete-chain:1 delete-elements:2" {
		t.Errorf("gone Service: %s", opCounts(tx))
	}
	// Definitions that differ: a full rewrite.
	loaded = loadedForm(desired)
	loaded.Chains["nat-output"].Loaded.Foreign = true
	if tx := Diff(loaded, desired); tx.Ops[0].Kind != OpResetTable {
		t.Errorf("foreign base chain: %s", opCounts(tx))
	}
	loaded = loadedForm(desired)
	loaded.Sets["cluster-ips"].Key = nil
	if tx := Diff(loaded, desired); tx.Ops[0].Kind != OpResetTable {
		t.Errorf("set of another type: %s", opCounts(tx))
	}
}

// TestFakeRestart: the Fake keeps digests like the kernel; an editor
// started from its Load sends nothing for an unchanged ruleset, only the
// change for a changed one, and rewrites a chain rewritten in place since
// it was created when its first rules are wanted again.
func TestFakeRestart(t *testing.T) {
	ctx := context.Background()
	f := IPv4
	fk := NewFake()
	if rs, err := fk.Load(ctx, f); rs != nil || err != nil {
		t.Fatalf("empty Fake: loaded %v, %v", rs, err)
	}
	editor := func(frags map[int]*Fragment) *Editor {
		loaded, err := fk.Load(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		ed := NewEditorFrom(f, loaded)
		for _, s := range editorSets() {
			ed.AddSet(s)
		}
		for i := range len(frags) {
			ed.Replace(nil, frags[i])
		}
		return ed
	}
	run := func(ed *Editor) *Transaction {
		tx := ed.Transaction()
		if err := fk.Apply(ctx, tx); err != nil {
			t.Fatal(err)
		}
		ed.Commit()
		return tx
	}
	frags := map[int]*Fragment{}
	for i := range 20 {
		frags[i] = svcFragment(i, []int{i, i + 1})
	}
	first := run(editor(frags))
	if first.Ops[0].Kind != OpResetTable {
		t.Errorf("first start: %s", opCounts(first))
	}
	if tx := run(editor(frags)); !tx.Empty() {
		t.Errorf("restart, unchanged: %s", opCounts(tx))
	}
	// B by an incremental change, then a restart wanting A again.
	ed := editor(frags)
	run(ed)
	ed.Replace(frags[5], svcFragment(5, []int{7}))
	if tx := run(ed); len(rewrittenChains(tx)) != 1 {
		t.Fatalf("incremental change: %s", opCounts(tx))
	}
	tx := run(editor(frags))
	if got := rewrittenChains(tx); len(got) != 1 || got[0] != "svc-5" {
		t.Errorf("restart wanting the first rules again: %s on %v", opCounts(tx), got)
	}
	if got, want := fk.Dump(f), editor(frags).Ruleset().Dump(); got != want {
		t.Errorf("after the restarts the Fake differs:\n%s\nwant:\n%s", got, want)
	}
	// A rule added without a digest (by hand): the chain is rewritten.
	if err := fk.Apply(ctx, &Transaction{Family: f, Ops: []Op{{Kind: OpFlushChain, Chain: &Chain{Name: "svc-3"}},
		{Kind: OpAddRule, ChainName: "svc-3", Rule: frags[3].Chains[0].Rules[0]},
		{Kind: OpAddRule, ChainName: "svc-3", Rule: frags[3].Chains[0].Rules[1]}}}); err != nil {
		t.Fatal(err)
	}
	if got := rewrittenChains(run(editor(frags))); len(got) != 1 || got[0] != "svc-3" {
		t.Errorf("chain without digest: rewrote %v", got)
	}
	fk.FailNextLoad = fmt.Errorf("injected")
	if _, err := fk.Load(ctx, f); err == nil {
		t.Error("FailNextLoad was not returned")
	}
}
