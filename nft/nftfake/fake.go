// Package nftfake is a faithful in-memory fake of the kernel backend
// (nft/nftnl) for tests: it applies a Transaction all-or-nothing to
// rulesets it keeps per family, refuses with the kernel's errno what the
// kernel refuses (the kernel tests run the same table of mistakes against
// both), and reads its tables back with rule digests as Load does.
package nftfake

import (
	"github.com/nftproxy/nftproxy/nft"

	"context"
	"fmt"
	"maps"
	"sync"

	"golang.org/x/sys/unix"
)

// Fake is an in-memory Interface for tests. It applies a transaction
// atomically to a copy of its state and checks what the kernel checks:
// objects exist before they are used, referenced chains and sets cannot be
// deleted, names and comments fit the kernel's limits, element keys fit
// their set, no duplicate elements, no
// overlapping ranges in an endpoints map. A failed
// transaction leaves the state untouched, like a rejected batch.
//
// It is also a Loader: like the kernel, it keeps the rules digest the
// first rule of a chain carries (Op.Digest), and Load returns chains with
// that digest instead of rules. A Fake outlives the proxier that uses it,
// as the kernel's table outlives a restart.
type Fake struct {
	mu     sync.Mutex
	tables map[nft.Family]*nft.Ruleset
	// gen is the ruleset generation: like the kernel's, it moves with
	// every commit, whatever its family.
	gen uint32
	// digests holds, per family and chain, the digest its first rule
	// carries.
	digests map[nft.Family]map[string]nft.RulesDigest
	// Transactions counts successful Apply calls; Ops the operations they
	// carried; Loads the Load calls. Tests use them to check how much work
	// a sync did.
	Transactions int
	Ops          int
	Loads        int
	// FailNext, if set, is returned by the next Apply instead of applying;
	// FailNextLoad likewise by the next Load.
	FailNext     error
	FailNextLoad error
}

var (
	_ nft.Loader           = (*Fake)(nil)
	_ nft.GenerationReader = (*Fake)(nil)
)

// New returns an empty Fake.
func New() *Fake {
	return &Fake{tables: map[nft.Family]*nft.Ruleset{}, digests: map[nft.Family]map[string]nft.RulesDigest{}}
}

// Apply implements Interface.
func (fk *Fake) Apply(_ context.Context, tx *nft.Transaction) error {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	if err := fk.FailNext; err != nil {
		fk.FailNext = nil
		return err
	}
	var rs *nft.Ruleset
	if cur := fk.tables[tx.Family]; cur != nil {
		rs = cur.Clone()
	}
	digests := maps.Clone(fk.digests[tx.Family])
	for i, op := range tx.Ops {
		var err error
		rs, err = applyOp(rs, tx.Family, op)
		if err != nil {
			return fmt.Errorf("apply transaction (%d ops): op %d %s: %w", len(tx.Ops), i, op.Kind, err)
		}
		digests = keepDigest(digests, rs, op)
	}
	if rs == nil {
		delete(fk.tables, tx.Family)
	} else {
		fk.tables[tx.Family] = rs
	}
	fk.digests[tx.Family] = digests
	fk.gen++
	fk.Transactions++
	fk.Ops += len(tx.Ops)
	return nil
}

// keepDigest updates the rules digests after op, as the kernel keeps them
// in the userdata of each chain's first rule.
func keepDigest(digests map[string]nft.RulesDigest, rs *nft.Ruleset, op nft.Op) map[string]nft.RulesDigest {
	switch op.Kind {
	case nft.OpResetTable, nft.OpDeleteTable:
		return map[string]nft.RulesDigest{}
	case nft.OpFlushChain, nft.OpDeleteChain:
		delete(digests, op.Chain.Name)
	case nft.OpAddRule:
		if len(rs.Chains[op.ChainName].Rules) != 1 {
			break // not the first rule
		}
		if digests == nil {
			digests = map[string]nft.RulesDigest{}
		}
		if op.Digest != nil {
			digests[op.ChainName] = *op.Digest
		} else {
			delete(digests, op.ChainName)
		}
	}
	return digests
}

// Load implements Loader: the table as Netlink.Load would read it back.
func (fk *Fake) Load(_ context.Context, f nft.Family) (*nft.Ruleset, error) {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	if err := fk.FailNextLoad; err != nil {
		fk.FailNextLoad = nil
		return nil, err
	}
	fk.Loads++
	cur := fk.tables[f]
	if cur == nil {
		return nil, nil
	}
	rs := cur.Clone()
	rs.Generation = fk.gen
	for name, c := range rs.Chains {
		d, ok := fk.digests[f][name]
		c.Loaded = &nft.LoadedRules{Count: len(c.Rules), Digest: d, HasDigest: ok, Slots: nft.DNATMapSlots(c.Rules)}
		c.Rules = nil
	}
	for _, s := range rs.Sets {
		if s.Dynamic {
			s.Elements = nft.Elements{} // the packet path's, not read
		}
	}
	return rs, nil
}

// Generation implements GenerationReader.
func (fk *Fake) Generation(context.Context) (uint32, error) {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	return fk.gen, nil
}

var _ nft.Backend = (*Fake)(nil)

// Claim implements nft.Backend: the fake's tables are nobody's.
func (fk *Fake) Claim(context.Context, nft.Family) error { return nil }

// LastCommit implements nft.Backend: the generation the last transaction
// made; the fake spends no kernel time.
func (fk *Fake) LastCommit() nft.CommitStats {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	return nft.CommitStats{GenID: fk.gen}
}

// Owning implements nft.Backend: the fake's tables are never owned.
func (fk *Fake) Owning() (bool, error) { return false, nil }

// Ruleset returns a copy of the table of a family, or nil if there is none.
func (fk *Fake) Ruleset(f nft.Family) *nft.Ruleset {
	fk.mu.Lock()
	defer fk.mu.Unlock()
	if rs := fk.tables[f]; rs != nil {
		return rs.Clone()
	}
	return nil
}

// Rulesets returns a copy of the tables of both families, for a tracer.
func (fk *Fake) Rulesets() map[nft.Family]*nft.Ruleset {
	return map[nft.Family]*nft.Ruleset{nft.IPv4: fk.Ruleset(nft.IPv4), nft.IPv6: fk.Ruleset(nft.IPv6)}
}

// Dump returns the table of a family in nft syntax ("" if there is none).
func (fk *Fake) Dump(f nft.Family) string {
	if rs := fk.Ruleset(f); rs != nil {
		return rs.Dump()
	}
	return ""
}

func opErr(errno error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errno)
}

func applyOp(rs *nft.Ruleset, f nft.Family, op nft.Op) (*nft.Ruleset, error) {
	switch op.Kind {
	case nft.OpResetTable:
		return nft.NewRuleset(f), nil
	case nft.OpDeleteTable:
		return nil, nil
	}
	if rs == nil {
		return nil, opErr(unix.ENOENT, "table %s %s", f, nft.TableName)
	}
	if err := checkLimits(op); err != nil {
		return nil, err
	}
	switch op.Kind {
	case nft.OpAddChain:
		if have, ok := rs.Chains[op.Chain.Name]; ok {
			if (have.Base == nil) != (op.Chain.Base == nil) {
				return nil, opErr(unix.EEXIST, "chain %q", op.Chain.Name)
			}
			return rs, nil
		}
		rs.Chains[op.Chain.Name] = &nft.Chain{Name: op.Chain.Name, Base: op.Chain.Base}
	case nft.OpFlushChain:
		c, ok := rs.Chains[op.Chain.Name]
		if !ok {
			return nil, opErr(unix.ENOENT, "chain %q", op.Chain.Name)
		}
		c.Rules = nil
	case nft.OpDeleteChain:
		if _, ok := rs.Chains[op.Chain.Name]; !ok {
			return nil, opErr(unix.ENOENT, "chain %q", op.Chain.Name)
		}
		if by := chainReferrer(rs, op.Chain.Name); by != "" {
			return nil, opErr(unix.EBUSY, "chain %q is used by %s", op.Chain.Name, by)
		}
		delete(rs.Chains, op.Chain.Name)
	case nft.OpAddRule:
		c, ok := rs.Chains[op.ChainName]
		if !ok {
			return nil, opErr(unix.ENOENT, "chain %q", op.ChainName)
		}
		if err := checkRule(rs, f, op.Rule); err != nil {
			return nil, fmt.Errorf("rule %q in chain %q: %w", op.Rule.Text(f), op.ChainName, err)
		}
		c.Rules = append(c.Rules, op.Rule)
	case nft.OpAddSet:
		return rs, addSet(rs, f, op.Set)
	case nft.OpDeleteSet:
		if _, ok := rs.Sets[op.Set.Name]; !ok {
			return nil, opErr(unix.ENOENT, "set %q", op.Set.Name)
		}
		if by := setReferrer(rs, f, op.Set.Name); by != "" {
			return nil, opErr(unix.EBUSY, "set %q is used by %s", op.Set.Name, by)
		}
		delete(rs.Sets, op.Set.Name)
	case nft.OpAddElements:
		return rs, addElements(rs, f, op)
	case nft.OpDeleteElements:
		return rs, deleteElements(rs, op)
	default:
		return nil, opErr(unix.EINVAL, "unknown op %d", int(op.Kind))
	}
	return rs, nil
}

// addSet adds set, or checks that the set of its name has its definition.
func addSet(rs *nft.Ruleset, f nft.Family, set *nft.Set) error {
	if have, ok := rs.Sets[set.Name]; ok {
		if !nft.SameSetDefinition(have, set) {
			return opErr(unix.EEXIST, "set %q", set.Name)
		}
		return nil
	}
	if set.EndpointsProto != 0 {
		if err := nft.CheckEndpointsMap(f, set); err != nil {
			return opErr(unix.EINVAL, "%v", err)
		}
	}
	if set.PickProto != 0 {
		if err := nft.CheckPickMap(f, set); err != nil {
			return opErr(unix.EINVAL, "%v", err)
		}
	}
	s := *set
	s.Elements = nft.Elements{}
	rs.Sets[s.Name] = &s
	return nil
}

// deleteElements deletes op's elements, each of which must be there.
func deleteElements(rs *nft.Ruleset, op nft.Op) error {
	s, ok := rs.Sets[op.Set.Name]
	if !ok {
		return opErr(unix.ENOENT, "set %q", op.Set.Name)
	}
	for e := range op.AllOf() {
		// An endpoints map's element is found by its whole range.
		if have, ok := s.Elements.Get(e.Key); !ok || have.End != e.End {
			return opErr(unix.ENOENT, "element %s in set %q", s.ElementKeyText(e), s.Name)
		}
		s.Elements.Delete(e.Key)
	}
	return nil
}

// maxNameLen is the longest chain or set name the kernel takes: its
// NFT_CHAIN_MAXNAMELEN and NFT_SET_MAXNAMELEN count the terminating NUL,
// and a longer name fails the batch with ERANGE.
const maxNameLen = unix.NFT_CHAIN_MAXNAMELEN - 1

// checkLimits checks the names and comments an operation writes against
// the kernel's limits (comments: see MaxComment). A set's comment shares
// the set's userdata with its type's: set comments are constants, never
// checked here.
func checkLimits(op nft.Op) error {
	name := func(what, n string) error {
		if len(n) > maxNameLen {
			return opErr(unix.ERANGE, "%s name %q: longer than %d bytes", what, n, maxNameLen)
		}
		return nil
	}
	comment := func(c string) error {
		if len(c) > nft.MaxComment {
			return opErr(unix.ERANGE, "comment %q: longer than %d bytes", c, nft.MaxComment)
		}
		return nil
	}
	switch op.Kind {
	case nft.OpAddChain:
		return name("chain", op.Chain.Name)
	case nft.OpAddSet:
		return name("set", op.Set.Name)
	case nft.OpAddRule:
		return comment(op.Rule.Comment)
	case nft.OpAddElements:
		for e := range op.AllOf() {
			if err := comment(e.Comment); err != nil {
				return err
			}
		}
	}
	return nil
}

func addElements(rs *nft.Ruleset, f nft.Family, op nft.Op) error {
	s, ok := rs.Sets[op.Set.Name]
	if !ok {
		return opErr(unix.ENOENT, "set %q", op.Set.Name)
	}
	var ranges map[uint32][]nft.Element // endpoints maps: elements by slot
	if s.EndpointsProto != 0 {
		ranges = serviceRanges(s)
	}
	for e := range op.AllOf() {
		k := s.KeyString(e.Key)
		if err := checkTuple(f, s.Key, e.Key); err != nil {
			return fmt.Errorf("element %s in set %q: %w", k, s.Name, err)
		}
		if err := nft.CheckRange(s, e); err != nil {
			return opErr(unix.EINVAL, "%v", err)
		}
		if ranges != nil {
			if err := checkOverlap(s, ranges, e); err != nil {
				return err
			}
		}
		switch {
		case s.IsVerdictMap():
			if e.Verdict == nil {
				return opErr(unix.EINVAL, "element %s in map %q has no verdict", k, s.Name)
			}
			if err := checkVerdictTarget(rs, *e.Verdict); err != nil {
				return fmt.Errorf("element %s in map %q: %w", k, s.Name, err)
			}
		case s.IsMap():
			if err := checkTuple(f, s.Data, e.Data); err != nil {
				return fmt.Errorf("element %s in map %q: %w", k, s.Name, err)
			}
		case e.Verdict != nil || len(e.Data) > 0:
			return opErr(unix.EINVAL, "element %s of set %q has data", k, s.Name)
		}
		if have, ok := s.Elements.Get(e.Key); ok && !nft.SameElement(s, have, e) {
			return opErr(unix.EEXIST, "element %s in set %q", k, s.Name)
		}
		s.Elements.Put(e)
	}
	return nil
}

// checkTuple checks that values fit the types: the right number of fields,
// addresses of the right family where addresses are expected, integers
// within their length.
func checkTuple(f nft.Family, types []nft.DataType, vals []nft.Datum) error {
	if len(types) != len(vals) {
		return opErr(unix.EINVAL, "%d fields for a %d-field type", len(vals), len(types))
	}
	for i, t := range types {
		switch t {
		case nft.TypeIPv4Addr:
			if !vals[i].Addr.Is4() {
				return opErr(unix.EINVAL, "field %d: %v is not an IPv4 address", i, vals[i].Addr)
			}
		case nft.TypeIPv6Addr:
			if !vals[i].Addr.Is6() || vals[i].Addr.Is4In6() {
				return opErr(unix.EINVAL, "field %d: %v is not an IPv6 address", i, vals[i].Addr)
			}
		default:
			if t.Len < 4 && vals[i].Int >= 1<<(8*t.Len) {
				return opErr(unix.ERANGE, "field %d: %d does not fit %s", i, vals[i].Int, t.Name)
			}
		}
	}
	return nil
}

func checkVerdictTarget(rs *nft.Ruleset, v nft.Verdict) error {
	if v.Kind != nft.VerdictJump && v.Kind != nft.VerdictGoto {
		return nil
	}
	c, ok := rs.Chains[v.Chain]
	if !ok {
		return opErr(unix.ENOENT, "chain %q", v.Chain)
	}
	if c.Base != nil {
		return opErr(unix.EOPNOTSUPP, "%s to base chain %q", v.Kind, v.Chain)
	}
	return nil
}

// checkRule checks every reference a rule makes.
func checkRule(rs *nft.Ruleset, f nft.Family, r nft.Rule) error {
	for _, p := range r.Phrases {
		switch p := p.(type) {
		case nft.VerdictPhrase:
			if err := checkVerdictTarget(rs, p.Verdict); err != nil {
				return err
			}
		case nft.MatchSet:
			s, ok := rs.Sets[p.Set]
			if !ok {
				return opErr(unix.ENOENT, "set %q", p.Set)
			}
			if s.IsMap() || !fieldsFit(f, p.Fields, s.Key) {
				return opErr(unix.EINVAL, "set %q does not fit %s", p.Set, nft.FieldsText(f, p.Fields))
			}
		case nft.VmapLookup:
			s, ok := rs.Sets[p.Map]
			if !ok {
				return opErr(unix.ENOENT, "map %q", p.Map)
			}
			if !s.IsVerdictMap() || !fieldsFit(f, p.Fields, s.Key) {
				return opErr(unix.EINVAL, "map %q does not fit %s", p.Map, nft.FieldsText(f, p.Fields))
			}
		case nft.MatchPrefix:
			if p.Prefix.Bits() <= 0 {
				// nft writes no such match, and neither does our encoder.
				return opErr(unix.EINVAL, "prefix %v matches everything", p.Prefix)
			}
		case nft.MatchRandom:
			if p.Mod == 0 {
				return opErr(unix.ERANGE, "numgen random mod 0")
			}
		case nft.DNAT:
			if !f.Contains(p.To.Addr()) {
				return opErr(unix.EINVAL, "dnat to %v in a %s table", p.To, f)
			}
		case nft.DNATMap:
			if err := dataMapOf(rs, p.Map); err != nil {
				return err
			}
			if p.Slot >= nft.EndpointsSlots {
				// The kernel would take it, but its last range's end
				// cannot be written; the encoder refuses it too.
				return opErr(unix.ERANGE, "endpoints slot %d", p.Slot)
			}
		case nft.DNATPick:
			if err := dataMapOf(rs, p.Map); err != nil {
				return err
			}
			if !nft.PickModOK(p.Mod) {
				return opErr(unix.ERANGE, "pick of %d endpoints", p.Mod)
			}
		}
	}
	return nil
}

// dataMapOf checks the map a DNATMap or DNATPick phrase looks up. The
// kernel checks only that it has data, and that the data is not a
// verdict: it takes another protocol's map, as it cannot tell.
func dataMapOf(rs *nft.Ruleset, name string) error {
	s, ok := rs.Sets[name]
	if !ok {
		return opErr(unix.ENOENT, "map %q", name)
	}
	if !s.IsMap() {
		return opErr(unix.EINVAL, "set %q is not a map", name)
	}
	if s.IsVerdictMap() {
		return opErr(unix.ENODATA, "map %q holds verdicts", name)
	}
	return nil
}

func fieldsFit(f nft.Family, fields []nft.Field, key []nft.DataType) bool {
	if len(fields) != len(key) {
		return false
	}
	for i, fd := range fields {
		if fd.Type(f) != key[i] {
			return false
		}
	}
	return true
}

// chainReferrer names an object that jumps or goes to the chain, or "".
func chainReferrer(rs *nft.Ruleset, name string) string {
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			for _, p := range r.Phrases {
				if v, ok := p.(nft.VerdictPhrase); ok && v.Verdict.Chain == name {
					return fmt.Sprintf("a rule in chain %q", c.Name)
				}
			}
		}
	}
	for _, s := range rs.Sets {
		for e := range s.Elements.All() {
			if e.Verdict != nil && e.Verdict.Chain == name {
				return fmt.Sprintf("element %s of map %q", s.KeyString(e.Key), s.Name)
			}
		}
	}
	return ""
}

// setReferrer names a rule that uses the set, or "".
func setReferrer(rs *nft.Ruleset, f nft.Family, name string) string {
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			for _, p := range r.Phrases {
				if set, ok := phraseSet(p); ok && set == name {
					return fmt.Sprintf("rule %q in chain %q", r.Text(f), c.Name)
				}
			}
		}
	}
	return ""
}

// phraseSet is the named set or map a phrase looks up, if any.
func phraseSet(p nft.Phrase) (string, bool) {
	switch p := p.(type) {
	case nft.MatchSet:
		return p.Set, true
	case nft.VmapLookup:
		return p.Map, true
	case nft.DNATMap:
		return p.Map, true
	case nft.DNATPick:
		return p.Map, true
	}
	return "", false
}

// serviceRanges indexes the elements of an endpoints map by the slot
// whose buckets they cover.
func serviceRanges(s *nft.Set) map[uint32][]nft.Element {
	m := make(map[uint32][]nft.Element)
	for e := range s.Elements.All() {
		slot := nft.ElementSlot(e)
		m[slot] = append(m[slot], e)
	}
	return m
}

// checkOverlap fails, as the rbtree does (EEXIST), if e overlaps an
// element other than itself, and records e in ranges. Ranges never cross
// slots (CheckRange), so only e's slot is searched.
func checkOverlap(s *nft.Set, ranges map[uint32][]nft.Element, e nft.Element) error {
	slot := nft.ElementSlot(e)
	lo := e.Key[0].Int
	for _, have := range ranges[slot] {
		hlo := have.Key[0].Int
		if lo == hlo && e.End == have.End {
			continue // the same element: addElements compares the values
		}
		if lo <= have.End && hlo <= e.End {
			return opErr(unix.EEXIST, "element %s in endpoints map %q overlaps %s",
				s.ElementKeyText(e), s.Name, s.ElementKeyText(have))
		}
	}
	ranges[slot] = append(ranges[slot], e)
	return nil
}

// Discard is a backend that applies nothing and keeps nothing, as the
// kernel's netlink backend keeps nothing once a batch is sent: a proxier on
// it costs its own work only, and its transactions cost the size of the
// change, as the kernel's commits do. Fake, which copies its whole table at
// each transaction (so that a refused one leaves it untouched), costs the
// size of the table instead: more than the proxier's own work at each
// change (the proxier's benchmarks, and the cluster bench's hollow
// proxies, 200 to a process, use Discard). Load finds no table.
type Discard struct {
	// Ops counts the operations applied; OnApply, if set, sees each
	// transaction. Neither is safe for concurrent use.
	Ops     int
	OnApply func(*nft.Transaction)
}

// Apply implements nft.Backend.
func (d *Discard) Apply(_ context.Context, tx *nft.Transaction) error {
	d.Ops += len(tx.Ops)
	if d.OnApply != nil {
		d.OnApply(tx)
	}
	return nil
}

// Load implements nft.Backend: there is never a table to read back.
func (d *Discard) Load(context.Context, nft.Family) (*nft.Ruleset, error) { return nil, nil }

// Generation implements nft.Backend.
func (d *Discard) Generation(context.Context) (uint32, error) { return 0, nil }

// Claim implements nft.Backend.
func (d *Discard) Claim(context.Context, nft.Family) error { return nil }

// LastCommit implements nft.Backend.
func (d *Discard) LastCommit() nft.CommitStats { return nft.CommitStats{} }

// Owning implements nft.Backend: nothing is owned.
func (d *Discard) Owning() (bool, error) { return false, nil }
