package nft

import (
	"reflect"
	"slices"
	"sort"
)

// Diff returns the transaction that turns the committed ruleset into the
// desired one. A nil committed ruleset means the kernel state is unknown:
// the transaction then starts by resetting the table and writes everything.
// Unchanged state gives an empty transaction.
//
// The committed ruleset may be one read back from the kernel (Loader): its
// chains carry a digest instead of rules and are rewritten unless the
// digest and the rule count match the desired rules.
//
// The operations come in the order described at changes, valid for the
// kernel at every step of the batch.
//
// Sets and base chains are defined by nftproxy's code and never change while
// it runs; if their definition differs from the committed one (an upgrade),
// Diff falls back to a full rewrite.
func Diff(committed, desired *Ruleset) *Transaction { return diff(committed, desired, nil) }

// diff is Diff where the element changes of the adopted sets (swept, see
// adoption) are the keys their adoption recorded, not a comparison of the
// two rulesets' elements: committed's adopted sets have none left.
func diff(committed, desired *Ruleset, adopted map[string]*adoption) *Transaction {
	if committed == nil || committed.Family != desired.Family || definitionsChanged(committed, desired) {
		return FullRewrite(desired)
	}
	c := newChanges(desired.Family)
	for _, name := range desired.SortedSetNames() {
		if _, ok := committed.Sets[name]; !ok {
			c.newSets = append(c.newSets, desired.Sets[name])
		}
	}
	for _, name := range unionKeys(committed.Chains, desired.Chains) {
		c.chain(committed.Chains[name], desired.Chains[name])
	}
	for _, name := range desired.SortedSetNames() {
		want := desired.Sets[name]
		if ad := adopted[name]; ad != nil {
			for _, k := range sortedKeys(ad.before) {
				var before *Element
				if b := ad.before[k]; b.had {
					e := unpackElement(k, b.value)
					before = &e
				}
				c.element(want, before, want.Elements.at(k))
			}
			continue
		}
		have := &Elements{}
		if old, ok := committed.Sets[name]; ok {
			have = &old.Elements
		}
		for _, k := range changedKeys(want, have) {
			c.element(want, have.at(k), want.Elements.at(k))
		}
	}
	for _, name := range committed.SortedSetNames() {
		if _, ok := desired.Sets[name]; !ok {
			c.goneSets = append(c.goneSets, committed.Sets[name])
		}
	}
	return c.transaction()
}

// unionKeys returns the keys of both maps, sorted.
func unionKeys[V any](a, b map[string]V) []string {
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k)
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// changedKeys returns, sorted, the keys of the elements of set want that
// are not in have or differ from have's, and of those of have that want
// lacks: the keys changes.element records something for. Sorting only
// these, not every key of both, keeps a diff against the table read back
// from the kernel, where few elements change, from sorting them all.
func changedKeys(want *Set, have *Elements) []string {
	var keys []string
	for k, w := range want.Elements.each() {
		if h, ok := have.get(k); !ok || !samePacked(want, k, h, w) {
			keys = append(keys, k)
		}
	}
	for k := range have.each() {
		if _, ok := want.Elements.get(k); !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// FullRewrite resets the table and writes the whole ruleset: the
// operations Diff makes from an empty table, in the same order, after
// OpResetTable, but each set's elements added by one op that names them
// all (Op.AllElements), encoded in the order of the set's map: the kernel
// does not care, and sorting the keys or copying the elements was a
// sizeable part of a full sync (docs/code-figures.md). Nothing is
// compared, so it does not go through changes: the operations are written
// once into a slice of its final size.
func FullRewrite(desired *Ruleset) *Transaction {
	setNames := desired.SortedSetNames()
	chains := make([]*Chain, 0, len(desired.Chains))
	for _, name := range sortedKeys(desired.Chains) {
		chains = append(chains, desired.Chains[name])
	}
	n := 1 + len(setNames)
	for _, ch := range chains {
		n += 1 + len(ch.Rules)
	}
	for _, s := range desired.Sets {
		if s.Elements.Len() > 0 {
			n++
		}
	}
	tx := &Transaction{Family: desired.Family, Ops: make([]Op, 0, n)}
	tx.add(Op{Kind: OpResetTable})
	for _, name := range setNames {
		tx.add(Op{Kind: OpAddSet, Set: desired.Sets[name]})
	}
	tx.addChains(chains)
	for _, name := range setNames {
		s := desired.Sets[name]
		if s.Elements.Len() > 0 {
			tx.add(Op{Kind: OpAddElements, Set: s, AllElements: true})
		}
	}
	return tx
}

// addChains adds new chains and their rules, the first rule of each with
// the digest of all of them.
func (t *Transaction) addChains(chains []*Chain) {
	digests := 0
	for _, ch := range chains {
		t.add(Op{Kind: OpAddChain, Chain: ch})
		if len(ch.Rules) > 0 {
			digests++
		}
	}
	// One array for the digests of every chain, not one allocation each.
	ds := make([]RulesDigest, 0, digests)
	var buf []byte
	for _, ch := range chains {
		for i, r := range ch.Rules {
			op := Op{Kind: OpAddRule, ChainName: ch.Name, Rule: r}
			if i == 0 {
				var d RulesDigest
				d, buf = digestRules(buf, t.Family, ch.Rules)
				ds = append(ds, d)
				op.Digest = &ds[len(ds)-1]
			}
			t.add(op)
		}
	}
}

// sortedKeys returns the keys of m, sorted.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// definitionsChanged reports whether a set or base chain present in both
// rulesets has a different definition.
func definitionsChanged(committed, desired *Ruleset) bool {
	for name, want := range desired.Sets {
		if have, ok := committed.Sets[name]; ok && !SameSetDefinition(have, want) {
			return true
		}
	}
	for name, want := range desired.Chains {
		have, ok := committed.Chains[name]
		if ok && (!reflect.DeepEqual(have.Base, want.Base) || have.Loaded != nil && have.Loaded.Foreign) {
			return true
		}
	}
	return false
}

func SameSetDefinition(a, b *Set) bool {
	return a.Name == b.Name && reflect.DeepEqual(a.Key, b.Key) && reflect.DeepEqual(a.Data, b.Data) &&
		a.Timeout == b.Timeout && a.Dynamic == b.Dynamic && a.Size == b.Size && a.Comment == b.Comment &&
		a.EndpointsProto == b.EndpointsProto && a.Counter == b.Counter &&
		a.PickProto == b.PickProto && a.PickMod == b.PickMod
}

func rulesEqual(f Family, a, b []Rule) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(f, b[i]) {
			return false
		}
	}
	return true
}

// SameElement reports whether two elements with the same key are the same:
// value, comment, and in an endpoints map the end of the range.
func SameElement(s *Set, a, b Element) bool {
	if a.Comment != b.Comment || a.End != b.End {
		return false
	}
	// Equal values have the same text; the text, which allocates, is
	// only written for values that are not equal field by field.
	if a.Verdict != nil && b.Verdict != nil && *a.Verdict == *b.Verdict ||
		a.Verdict == nil && b.Verdict == nil && slices.Equal(a.Data, b.Data) {
		return true
	}
	return s.ValueString(a) == s.ValueString(b)
}

// samePacked is SameElement for two packed values of the element with
// packed key k: equal values are compared without unpacking them.
func samePacked(s *Set, k, a, b string) bool {
	return a == b || SameElement(s, unpackElement(k, a), unpackElement(k, b))
}
