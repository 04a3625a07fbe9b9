package nft

import "sort"

// A table written from nothing may reach the kernel in pieces, one
// transaction each, handed out while the ruleset is built (Editor.Piece):
// the kernel commits a piece while the caller builds and encodes the next,
// so that building and committing overlap instead of following each other,
// and no batch holds the whole table. Each piece only adds: the chains and
// sets that are new since the last piece, and the elements put since.
// Whatever the caller put in between two pieces reaches the kernel
// together, so a caller that takes pieces between whole Services never
// shows the data path half a Service.

// pieces is what an Editor handed out as pieces so far.
type pieces struct {
	sets   map[string]pieceSet
	chains map[string]*Chain
	// broken: the ruleset lost or changed something a piece had written;
	// only a transaction of the whole table writes it now.
	broken bool
}

// pieceSet is a set a piece created, and how far its elements were
// written.
type pieceSet struct {
	set  *Set
	mark slabMark
}

// Piece returns a transaction that adds to the kernel what the desired
// ruleset gained since the last Piece: the first one resets the table. Only
// an editor of a table written whole (NewEditor, or NewEditorFrom without a
// table) hands out pieces, until its first Commit; Commit it after the last
// piece is applied, as after Transaction.
//
// ok is false when the pieces cannot go on: the editor does not write the
// table whole, or since a piece the ruleset lost or changed one of its
// chains, sets or elements (two objects claiming one element, say), which
// a piece that only adds cannot express. Transaction then writes the whole
// table, over the pieces, in one transaction. Once false, it stays so.
//
// The operations of a piece do not change with the ruleset afterwards:
// a piece may be applied while the caller goes on building.
func (e *Editor) Piece() (tx *Transaction, ok bool) {
	if !e.reset || e.loaded != nil || e.pieces != nil && e.pieces.broken {
		return nil, false
	}
	tx = &Transaction{Family: e.rs.Family}
	if e.pieces == nil {
		e.pieces = &pieces{sets: map[string]pieceSet{}, chains: map[string]*Chain{}}
		tx.add(Op{Kind: OpResetTable})
	}
	ps := e.pieces
	if !ps.current(e.rs) {
		ps.broken = true
		return nil, false
	}
	var newSets []string
	for name, s := range e.rs.Sets {
		if _, ok := ps.sets[name]; !ok {
			m, ok := s.Elements.slabStart()
			if !ok {
				ps.broken = true
				return nil, false
			}
			newSets = append(newSets, name)
			ps.sets[name] = pieceSet{set: s, mark: m}
		}
	}
	sort.Strings(newSets)
	for _, name := range newSets {
		def := *ps.sets[name].set
		def.Elements = Elements{} // a definition: Apply reads no elements of it
		tx.add(Op{Kind: OpAddSet, Set: &def})
	}
	var newChains []*Chain
	for name, c := range e.rs.Chains {
		if _, ok := ps.chains[name]; !ok {
			newChains = append(newChains, c)
			ps.chains[name] = c
		}
	}
	sort.Slice(newChains, func(i, j int) bool { return newChains[i].Name < newChains[j].Name })
	tx.addChains(newChains)
	for _, name := range e.rs.SortedSetNames() {
		h := ps.sets[name]
		put, _ := h.set.Elements.appended(h.mark) // current checked it
		if put.Len() > 0 {
			view := *h.set
			view.Elements = put
			tx.add(Op{Kind: OpAddElements, Set: &view, AllElements: true})
		}
		h.mark = h.set.Elements.slabMark()
		ps.sets[name] = h
	}
	return tx, true
}

// current reports whether every chain, set and element the pieces wrote is
// still in rs as written. A chain replaced by one with the same rules
// (the builder makes some afresh on every call) still is.
func (ps *pieces) current(rs *Ruleset) bool {
	for name, h := range ps.sets {
		if rs.Sets[name] != h.set {
			return false
		}
		if _, ok := h.set.Elements.appended(h.mark); !ok {
			return false
		}
	}
	for name, c := range ps.chains {
		now := rs.Chains[name]
		if now == nil || now != c && !sameRules(rs.Family, c, now) {
			return false
		}
		ps.chains[name] = now
	}
	return true
}
