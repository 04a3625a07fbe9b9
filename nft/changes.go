package nft

import "sort"

// changes is what differs between the committed and the desired state of a
// table, object by object. Diff and Editor both fill one; transaction turns
// it into operations in an order the kernel accepts at every step:
//  1. new sets and chains (so rules and elements can refer to them),
//  2. rewritten chains (flush, then their rules; the first rule carries
//     the digest of them all, see digest.go),
//  3. element deletions, then additions, set by set,
//  4. removed chains are flushed (dropping their references to sets and
//     chains), then removed sets deleted (dropping element references to
//     chains), then removed chains deleted.
type changes struct {
	f         Family
	digestBuf []byte // reused by digest
	newSets   []*Set
	newChains []*Chain
	rewrite   []rewrite
	elements  map[string]*elementChanges // by set name
	goneSets  []*Set
	gone      []*Chain // as committed
}

type rewrite struct {
	chain    *Chain // as desired
	hadRules bool
}

// digest is the digest the first rule of a chain written whole carries.
func (c *changes) digest(ch *Chain) *RulesDigest {
	if len(ch.Rules) == 0 {
		return nil
	}
	d, buf := digestRules(c.digestBuf, c.f, ch.Rules)
	c.digestBuf = buf
	return &d
}

type elementChanges struct {
	set      *Set
	del, add []Element
}

func newChanges(f Family) *changes { return &changes{f: f, elements: map[string]*elementChanges{}} }

// chain records the change of one chain; nil means absent. Callers go
// through chains in name order.
func (c *changes) chain(before, now *Chain) {
	switch {
	case before == nil && now != nil:
		c.newChains = append(c.newChains, now)
		c.rewrite = append(c.rewrite, rewrite{chain: now})
	case before != nil && now == nil:
		c.gone = append(c.gone, before)
	case before != nil && now != nil && !sameRules(c.f, before, now):
		c.rewrite = append(c.rewrite, rewrite{chain: now, hadRules: before.hasRules()})
	}
}

// element records the change of one element of set s; nil means absent.
// An element whose value or comment changed is deleted and added again
// (the kernel has no element update). Callers go through keys in order.
func (c *changes) element(s *Set, before, now *Element) {
	ec := c.elements[s.Name]
	if ec == nil {
		ec = &elementChanges{set: s}
		c.elements[s.Name] = ec
	}
	changed := before != nil && now != nil && !SameElement(s, *before, *now)
	if before != nil && (now == nil || changed) {
		ec.del = append(ec.del, *before)
	}
	if now != nil && (before == nil || changed) {
		ec.add = append(ec.add, *now)
	}
}

func (c *changes) transaction() *Transaction {
	tx := &Transaction{Family: c.f}
	for _, s := range c.newSets {
		tx.add(Op{Kind: OpAddSet, Set: s})
	}
	for _, ch := range c.newChains {
		tx.add(Op{Kind: OpAddChain, Chain: ch})
	}
	for _, rw := range c.rewrite {
		if rw.hadRules {
			tx.add(Op{Kind: OpFlushChain, Chain: rw.chain})
		}
		for i, r := range rw.chain.Rules {
			op := Op{Kind: OpAddRule, ChainName: rw.chain.Name, Rule: r}
			if i == 0 {
				op.Digest = c.digest(rw.chain)
			}
			tx.add(op)
		}
	}
	names := make([]string, 0, len(c.elements))
	for n := range c.elements {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ec := c.elements[n]
		if len(ec.del) > 0 {
			tx.add(Op{Kind: OpDeleteElements, Set: ec.set, Elements: ec.del})
		}
		if len(ec.add) > 0 {
			tx.add(Op{Kind: OpAddElements, Set: ec.set, Elements: ec.add})
		}
	}
	for _, ch := range c.gone {
		if ch.hasRules() {
			tx.add(Op{Kind: OpFlushChain, Chain: ch})
		}
	}
	for _, s := range c.goneSets {
		tx.add(Op{Kind: OpDeleteSet, Set: s})
	}
	for _, ch := range c.gone {
		tx.add(Op{Kind: OpDeleteChain, Chain: ch})
	}
	return tx
}
