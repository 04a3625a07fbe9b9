package nft

import (
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Fragment is the part of a ruleset that one owner contributes: chains and
// sets it owns outright, and elements it needs in shared sets and maps.
// nftproxy has one fragment per Service and family, so a change to one
// Service touches only that Service's objects. Owned sets carry no
// elements (session affinity sets are filled by the kernel).
type Fragment struct {
	Chains   []*Chain
	Sets     []*Set
	Elements []SetElement
	datums   []Datum // the space Datums hands out
}

// Datums returns n zero Datums for the keys and data of the fragment's
// elements. They are carved from space the fragment keeps, so a fragment
// built again after Reset allocates nothing for them.
func (f *Fragment) Datums(n int) []Datum {
	if cap(f.datums)-len(f.datums) < n {
		f.datums = make([]Datum, 0, max(n, 2*cap(f.datums), 64))
	}
	i := len(f.datums)
	f.datums = f.datums[:i+n]
	d := f.datums[i : i+n : i+n]
	clear(d)
	return d
}

// Reset empties the fragment to build another in its memory. What it held
// must no longer be in use: an Editor keeps the chains and sets of a
// fragment it was given, but copies its elements, so a fragment may be
// reset once it has been given to Editor.Replace (as either argument).
func (f *Fragment) Reset() {
	clear(f.Chains)
	clear(f.Sets)
	clear(f.Elements)
	f.Chains, f.Sets, f.Elements, f.datums = f.Chains[:0], f.Sets[:0], f.Elements[:0], f.datums[:0]
}

// SetElement is an element of a named set.
type SetElement struct {
	Set     string
	Element Element
}

// Editor keeps the desired ruleset of one family as fragments come and go,
// and turns what changed since the last Commit into a Transaction whose size
// is proportional to the change, not to the ruleset. Elements are reference
// counted: several fragments may need the same element (two Services with
// the same endpoint share a hairpin element); it is deleted when the last
// one goes.
//
// After a failed Apply, the kernel state is unknown: drop the Editor and
// start a new one, whose first transaction rewrites the table whole, or,
// started with NewEditorFrom on the state read back from the kernel, only
// what differs from it.
type Editor struct {
	rs *Ruleset
	// shared holds the elements held more than once (see holding): an
	// element is held once if it is in its set and not here. Most
	// elements have one holder, and recording only the others keeps a map
	// insert per element, and the map's growth, out of a full sync
	// (docs/code-figures.md).
	shared map[setKey]holding
	reset  bool // the next transaction is not incremental: see loaded
	// loaded is the kernel's state the first transaction diffs against
	// (NewEditorFrom); nil: the first transaction resets the table.
	loaded *Ruleset
	// adopted are the sets whose elements the desired ruleset took over
	// from loaded (see putSet), by name, until the first Commit.
	adopted map[string]*adoption

	// Before-images of what changed since the last Commit: the chain or
	// element as it was (nil: absent), recorded on first touch.
	chainsBefore map[string]*Chain
	setsBefore   map[string]*Set
	elemsBefore  map[setKey]*Element

	keyBuf, valBuf []byte // scratch space of packed

	pieces *pieces // what Piece handed out
}

type setKey struct{ set, key string }

// NewEditor returns an editor for an empty table; its first transaction
// resets the table in the kernel.
func NewEditor(f Family) *Editor {
	return &Editor{rs: NewRuleset(f), shared: map[setKey]holding{}, reset: true,
		chainsBefore: map[string]*Chain{}, setsBefore: map[string]*Set{}, elemsBefore: map[setKey]*Element{}}
}

// NewEditorFrom returns an editor whose first transaction takes the kernel
// from loaded, the table as Loader.Load read it, to the desired ruleset:
// chains, sets and elements that did not change are not touched (a
// restart with unchanged state sends nothing). A nil loaded (no table)
// makes it NewEditor. The editor takes over the elements of loaded's sets
// (see adoption): the caller must not use them afterwards.
func NewEditorFrom(f Family, loaded *Ruleset) *Editor {
	e := NewEditor(f)
	e.loaded = loaded
	if loaded != nil {
		e.adopted = map[string]*adoption{}
		// The desired table is most often the one read back: sized as
		// it, the maps do not grow (and rehash) chain by chain.
		e.rs.Chains = make(map[string]*Chain, len(loaded.Chains))
	}
	return e
}

// Ruleset is the desired ruleset. Callers must not modify it.
func (e *Editor) Ruleset() *Ruleset { return e.rs }

// AddSet defines a set (without elements), unless one of that name is
// defined. A definition does not change while the set lives; Replace of a
// fragment with the set among its Sets removes it, elements included.
func (e *Editor) AddSet(s *Set) {
	if _, ok := e.rs.Sets[s.Name]; ok {
		return
	}
	e.putSet(s)
}

// putSet adds an empty copy of s's definition. Before the first
// transaction of an editor from a table read back, a set read back with
// the same definition is adopted instead: the desired set takes over its
// elements, marking those the fragments put (see adoption).
func (e *Editor) putSet(s *Set) {
	e.touchSet(s.Name)
	ns := &Set{Name: s.Name, Key: s.Key, Data: s.Data, Timeout: s.Timeout, Dynamic: s.Dynamic,
		Size: s.Size, Comment: s.Comment, EndpointsProto: s.EndpointsProto, Counter: s.Counter,
		PickProto: s.PickProto, PickMod: s.PickMod}
	if ls := e.loadedSet(s.Name); ls != nil {
		if SameSetDefinition(ls, ns) {
			ns.Elements, ls.Elements = ls.Elements, Elements{}
			ns.Elements.startMarking()
			e.adopted[s.Name] = &adoption{before: map[string]adoptedValue{}}
		} else {
			ns.Elements.reserve(ls.Elements.Len())
		}
	}
	e.rs.AddSet(ns)
}

func (e *Editor) loadedSet(name string) *Set {
	if !e.reset || e.loaded == nil {
		return nil
	}
	return e.loaded.Sets[name]
}

// adoption is what happened to the elements of a set adopted from the
// table read back, until the first transaction: at a restart, the
// desired set is built in the loaded set's memory instead of beside it (a
// second copy of every element, live while the whole desired state is
// built: docs/code-figures.md). Each element the
// fragments put is marked (Elements.putMarked); before records, per packed
// key, the value the kernel has for each element that was put new or
// different, or released. The first Transaction deletes the elements
// nobody put (sweep) and diffs only the keys of before.
type adoption struct {
	before map[string]adoptedValue
}

// adoptedValue is the kernel's value of an element; !had: the kernel has
// no such element.
type adoptedValue struct {
	value string
	had   bool
}

// record notes the kernel's value of the element of packed key k, unless
// it is noted already.
func (a *adoption) record(k string, had bool, value string) {
	if _, seen := a.before[k]; seen {
		return
	}
	a.before[strings.Clone(k)] = adoptedValue{value: strings.Clone(value), had: had}
}

// sweep deletes the elements of s nobody put, noting them, and stops
// marking (so a second sweep finds nothing).
func (a *adoption) sweep(s *Set) {
	for _, k := range s.Elements.unmarked() {
		v, _ := s.Elements.get(k)
		a.record(k, true, v)
		s.Elements.del(k)
	}
	s.Elements.stopMarking()
}

// Reserve makes room for n elements in set name, if it has none yet: a
// full sync into an empty table otherwise grows its big maps (hairpin
// connections, service IPs) from nothing, rehashing every key on each
// doubling (a sizeable share of the Editor's time at scale:
// docs/code-figures.md).
func (e *Editor) Reserve(name string, n int) {
	if s, ok := e.rs.Sets[name]; ok {
		s.Elements.reserve(n)
	}
}

// ReserveChains makes room for n chains, if there is none yet (see
// Reserve).
func (e *Editor) ReserveChains(n int) {
	if len(e.rs.Chains) == 0 && n > 0 {
		e.rs.Chains = make(map[string]*Chain, n)
	}
}

// The touch functions record before-images, which only an incremental
// Transaction needs: until the first Commit, the transaction is a Diff of
// the whole desired ruleset (against nothing or the table read back), so
// they record nothing (a noticeable share of a full sync's time and memory:
// docs/code-figures.md).

func (e *Editor) touchSet(name string) {
	if e.reset {
		return
	}
	if _, seen := e.setsBefore[name]; !seen {
		e.setsBefore[name] = e.rs.Sets[name]
	}
}

// Replace removes fragment old and adds fragment new (either may be nil).
// Sets named by elements must have been added with AddSet.
func (e *Editor) Replace(old, new *Fragment) {
	if old != nil {
		for _, c := range old.Chains {
			e.touchChain(c.Name)
			delete(e.rs.Chains, c.Name)
		}
		for _, se := range old.Elements {
			e.release(se)
		}
		for _, s := range old.Sets {
			e.touchSet(s.Name)
			delete(e.rs.Sets, s.Name)
		}
	}
	if new != nil {
		for _, s := range new.Sets {
			e.putSet(s)
		}
		for _, c := range new.Chains {
			e.touchChain(c.Name)
			e.rs.Chains[c.Name] = c
		}
		for _, se := range new.Elements {
			e.hold(se)
		}
	}
}

func (e *Editor) touchChain(name string) {
	if e.reset {
		return
	}
	if _, seen := e.chainsBefore[name]; !seen {
		e.chainsBefore[name] = e.rs.Chains[name]
	}
}

func (e *Editor) touchElement(s *Set, k setKey) {
	if e.reset {
		return
	}
	if _, seen := e.elemsBefore[k]; seen {
		return
	}
	e.elemsBefore[k.kept()] = s.Elements.at(k.key)
}

// packed returns the set key of an element, its packed key a view of the
// editor's scratch space: valid until the next call, and to be kept only
// as setKey.kept. Packing into fresh strings was two allocations per
// element of a full sync, whose bytes the set copies anyway.
func (e *Editor) packed(set string, key []Datum) setKey {
	e.keyBuf = appendPacked(e.keyBuf[:0], key)
	return setKey{set, view(e.keyBuf)}
}

// kept is k with a key of its own: a map key must be (an assignment to a
// map with string keys stores the key given, even for a key it had).
func (k setKey) kept() setKey { return setKey{k.set, strings.Clone(k.key)} }

// holding is how an element held more than once is held: by n holders
// beyond the first and, once two of them put different values (two
// Services with one external IP and port, which the API allows), by each
// holder's value, in the order they put them. The element has the last
// one's; when a holder releases it, the latest of the others'. Without
// them, the element would keep the value of a holder that is gone: a goto
// to its deleted chain, which the kernel refuses (EBUSY).
type holding struct {
	n      int
	values []string // nil: every holder put the element's value
}

func (e *Editor) hold(se SetElement) {
	s := e.mustSet(se.Set)
	k := e.packed(se.Set, se.Element.Key)
	if ad := e.adopted[se.Set]; ad != nil {
		e.holdAdopted(s, ad, k, se.Element)
		return
	}
	e.touchElement(s, k)
	// The latest holder's value wins. An element that was there already
	// is updated in place: one operation, not a lookup and an insert (a
	// fifth of hold's time).
	e.valBuf = appendValue(e.valBuf[:0], se.Element)
	v := view(e.valBuf)
	if _, existed, old := s.Elements.upsert(k.key, v); existed { // upsert copies v into the slab
		e.addHolder(k, old, v)
	}
}

// holdAdopted is hold for an element of an adopted set: an element there
// unmarked is the kernel's, which this first holder claims.
func (e *Editor) holdAdopted(s *Set, ad *adoption, k setKey, el Element) {
	e.valBuf = appendValue(e.valBuf[:0], el)
	v := view(e.valBuf)
	existed, marked, old := s.Elements.putMarked(k.key, v)
	if existed && marked {
		e.addHolder(k, old, v)
	}
	if !existed || old != v {
		ad.record(k.key, existed, old)
	}
}

// addHolder records one more holder of the element of k, which had value
// old and now has v.
func (e *Editor) addHolder(k setKey, old, v string) {
	h := e.shared[k]
	if h.values == nil && old != v {
		h.values = slices.Repeat([]string{strings.Clone(old)}, h.n+1)
	}
	if h.values != nil {
		h.values = append(h.values, strings.Clone(v))
	}
	h.n++
	e.shared[k.kept()] = h
}

func (e *Editor) release(se SetElement) {
	s := e.mustSet(se.Set)
	k := e.packed(se.Set, se.Element.Key)
	if ad := e.adopted[se.Set]; ad != nil {
		if v, ok := s.Elements.get(k.key); ok {
			ad.record(k.key, true, v)
		}
	}
	e.touchElement(s, k)
	h, ok := e.shared[k]
	if !ok { // the last holder
		s.Elements.del(k.key)
		return
	}
	if h.values != nil {
		e.valBuf = appendValue(e.valBuf[:0], se.Element)
		if i := slices.Index(h.values, view(e.valBuf)); i >= 0 {
			h.values = slices.Delete(h.values, i, i+1)
		} else { // a value no holder put: not the caller's to release
			h.values = h.values[:len(h.values)-1]
		}
		s.Elements.put(k.key, h.values[len(h.values)-1]) // an adopted set's mark stays
		if !slices.ContainsFunc(h.values, func(v string) bool { return v != h.values[0] }) {
			h.values = nil
		}
	}
	if h.n--; h.n == 0 {
		delete(e.shared, k)
	} else {
		e.shared[k.kept()] = h
	}
}

// elementKey is s.KeyString(key), the key of the element in s.Elements,
// written into one string. KeyString formats every field into a string of
// its own and joins them: several allocations for every element a sync
// puts (docs/code-figures.md). Addresses and plain integers, the fields of
// nftproxy's keys, are appended here; any other field takes datumText,
// whose protocol names are constants. TestElementKeyIsKeyString holds the
// two together.
func elementKey(s *Set, key []Datum) string {
	var buf [96]byte // a hairpin key of two IPv6 addresses fits
	b := buf[:0]
	for i, d := range key {
		t := TypeInteger
		if i < len(s.Key) {
			t = s.Key[i]
		}
		if i > 0 {
			b = append(b, " . "...)
		}
		switch {
		case (t == TypeIPv4Addr || t == TypeIPv6Addr) && d.Addr.IsValid():
			b = d.Addr.AppendTo(b) // as Addr.String, but for the zero Addr
		case t == TypeInteger || t == TypeInetService:
			b = strconv.AppendUint(b, uint64(d.Int), 10)
		default:
			b = append(b, datumText(t, d)...)
		}
	}
	return string(b)
}

func (e *Editor) mustSet(name string) *Set {
	s, ok := e.rs.Sets[name]
	if !ok {
		panic("nft: Editor element for undefined set " + name)
	}
	return s
}

// Transaction returns the operations that take the kernel from the state
// of the last Commit to the desired ruleset, in the order Diff uses; only
// the objects touched since then are compared.
func (e *Editor) Transaction() *Transaction {
	if e.reset {
		for name, ad := range e.adopted {
			ad.sweep(e.rs.Sets[name])
		}
		return diff(e.loaded, e.rs, e.adopted) // nil loaded: a full rewrite
	}
	c := newChanges(e.rs.Family)
	setNames := make([]string, 0, len(e.setsBefore))
	for n := range e.setsBefore {
		setNames = append(setNames, n)
	}
	sort.Strings(setNames)
	for _, n := range setNames {
		before, now := e.setsBefore[n], e.rs.Sets[n]
		switch {
		case before == nil && now != nil:
			c.newSets = append(c.newSets, now)
		case before != nil && now == nil:
			c.goneSets = append(c.goneSets, before)
		case before != nil && now != nil && !SameSetDefinition(before, now):
			// The builder names owned sets after their definition (an
			// affinity set's name holds its timeout), so this is a
			// programming error.
			panic("nft: Editor set " + n + " redefined in place")
		}
	}
	names := make([]string, 0, len(e.chainsBefore))
	for n := range e.chainsBefore {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c.chain(e.chainsBefore[n], e.rs.Chains[n])
	}
	keys := make([]setKey, 0, len(e.elemsBefore))
	for k := range e.elemsBefore {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].set != keys[j].set {
			return keys[i].set < keys[j].set
		}
		return keys[i].key < keys[j].key
	})
	for _, k := range keys {
		s := e.rs.Sets[k.set]
		if s == nil {
			continue // the set goes, and its elements with it
		}
		c.element(s, e.elemsBefore[k], s.Elements.at(k.key))
	}
	return c.transaction()
}

// Commit records that the last Transaction was applied.
func (e *Editor) Commit() {
	e.reset, e.loaded, e.adopted, e.pieces = false, nil, nil, nil
	// Fresh maps, not clear(): a cleared map keeps the buckets of the full
	// sync's before-images (one per element), and the next Transaction
	// would walk them all (docs/profiles.md).
	e.setsBefore = map[string]*Set{}
	e.chainsBefore = map[string]*Chain{}
	e.elemsBefore = map[setKey]*Element{}
}
