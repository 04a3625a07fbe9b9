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
// The order of operations follows the kernel's reference rules, so that the
// batch is valid at every step:
//  1. new sets and chains (so rules and elements can refer to them),
//  2. rewritten chains (flush, then their rules),
//  3. element deletions, then additions, set by set,
//  4. removed chains are flushed (dropping their references to sets and
//     chains), then removed sets deleted (dropping element references to
//     chains), then removed chains deleted.
//
// Sets and base chains are defined by nftproxy's code and never change while
// it runs; if their definition differs from the committed one (an upgrade),
// Diff falls back to a full rewrite.
func Diff(committed, desired *Ruleset) *Transaction {
	if committed == nil || committed.Family != desired.Family || definitionsChanged(committed, desired) {
		return fullRewrite(desired)
	}
	tx := &Transaction{Family: desired.Family}
	f := desired.Family

	setNames := desired.SortedSetNames()
	for _, name := range setNames {
		if _, ok := committed.Sets[name]; !ok {
			tx.add(Op{Kind: OpAddSet, Set: desired.Sets[name]})
		}
	}
	chainNames := desired.SortedChainNames()
	for _, name := range chainNames {
		if _, ok := committed.Chains[name]; !ok {
			tx.add(Op{Kind: OpAddChain, Chain: desired.Chains[name]})
		}
	}
	for _, name := range chainNames {
		want := desired.Chains[name]
		have, existed := committed.Chains[name]
		if existed && rulesEqual(f, have.Rules, want.Rules) {
			continue
		}
		if existed && len(have.Rules) > 0 {
			tx.add(Op{Kind: OpFlushChain, Chain: want})
		}
		for _, r := range want.Rules {
			tx.add(Op{Kind: OpAddRule, ChainName: name, Rule: r})
		}
	}
	for _, name := range setNames {
		want := desired.Sets[name]
		var have map[string]Element
		if old, ok := committed.Sets[name]; ok {
			have = old.Elements
		}
		del, add := diffElements(want, have, want.Elements)
		if len(del) > 0 {
			tx.add(Op{Kind: OpDeleteElements, Set: want, Elements: del})
		}
		if len(add) > 0 {
			tx.add(Op{Kind: OpAddElements, Set: want, Elements: add})
		}
	}

	var goneChains []string
	for name, c := range committed.Chains {
		if _, ok := desired.Chains[name]; !ok {
			goneChains = append(goneChains, name)
			if len(c.Rules) > 0 {
				tx.add(Op{Kind: OpFlushChain, Chain: c})
			}
		}
	}
	for _, name := range committed.SortedSetNames() {
		if _, ok := desired.Sets[name]; !ok {
			tx.add(Op{Kind: OpDeleteSet, Set: committed.Sets[name]})
		}
	}
	sort.Strings(goneChains)
	for _, name := range goneChains {
		tx.add(Op{Kind: OpDeleteChain, Chain: committed.Chains[name]})
	}
	return tx
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
		if have, ok := committed.Chains[name]; ok && !reflect.DeepEqual(have.Base, want.Base) {
			return true
		}
	}
	return false
}

func sameSetDefinition(a, b *Set) bool {
	return a.Name == b.Name && reflect.DeepEqual(a.Key, b.Key) && reflect.DeepEqual(a.Data, b.Data) &&
		a.Timeout == b.Timeout && a.Dynamic == b.Dynamic && a.Size == b.Size && a.Comment == b.Comment
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

// diffElements returns the elements to delete from have and to add from
// want, sorted by key. An element whose value or comment changed is deleted
// and added again (the kernel has no element update).
func diffElements(s *Set, have, want map[string]Element) (del, add []Element) {
	var delKeys, addKeys []string
	for k, h := range have {
		w, ok := want[k]
		if !ok || !sameElement(s, h, w) {
			delKeys = append(delKeys, k)
		}
	}
	for k, w := range want {
		h, ok := have[k]
		if !ok || !sameElement(s, h, w) {
			addKeys = append(addKeys, k)
		}
	}
	sort.Strings(delKeys)
	sort.Strings(addKeys)
	for _, k := range delKeys {
		del = append(del, have[k])
	}
	for _, k := range addKeys {
		add = append(add, want[k])
	}
	return del, add
}

func sameElement(s *Set, a, b Element) bool {
	return a.Comment == b.Comment && s.ValueString(a) == s.ValueString(b)
}
