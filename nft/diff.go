package nft

import (
	"reflect"
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
func Diff(committed, desired *Ruleset) *Transaction {
	if committed == nil || committed.Family != desired.Family || definitionsChanged(committed, desired) {
		return fullRewrite(desired)
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
		var have map[string]Element
		if old, ok := committed.Sets[name]; ok {
			have = old.Elements
		}
		for _, k := range unionKeys(have, want.Elements) {
			c.element(want, elementOrNil(have, k), elementOrNil(want.Elements, k))
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

func elementOrNil(m map[string]Element, k string) *Element {
	if e, ok := m[k]; ok {
		return &e
	}
	return nil
}

// fullRewrite resets the table and writes the whole ruleset.
func fullRewrite(desired *Ruleset) *Transaction {
	tx := Diff(NewRuleset(desired.Family), desired)
	tx.Ops = append([]Op{{Kind: OpResetTable}}, tx.Ops...)
	return tx
}

// definitionsChanged reports whether a set or base chain present in both
// rulesets has a different definition.
func definitionsChanged(committed, desired *Ruleset) bool {
	for name, want := range desired.Sets {
		if have, ok := committed.Sets[name]; ok && !sameSetDefinition(have, want) {
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

func sameSetDefinition(a, b *Set) bool {
	return a.Name == b.Name && reflect.DeepEqual(a.Key, b.Key) && reflect.DeepEqual(a.Data, b.Data) &&
		a.Timeout == b.Timeout && a.Dynamic == b.Dynamic && a.Size == b.Size && a.Comment == b.Comment &&
		a.Endpoints == b.Endpoints
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

// sameElement reports whether two elements with the same key are the same:
// value, comment, and in an endpoints map the end of the range.
func sameElement(s *Set, a, b Element) bool {
	return a.Comment == b.Comment && a.End == b.End && s.ValueString(a) == s.ValueString(b)
}
