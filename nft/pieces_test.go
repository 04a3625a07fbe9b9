package nft_test

import (
	"context"
	"math/rand"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
)

// TestPiecesWriteTheTable: a table built from nothing and handed out in
// pieces, each applied only after the next one is built, ends as the
// table the editor's one transaction writes. Every piece after the first
// only adds, and no element is written twice.
func TestPiecesWriteTheTable(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	ed := nft.NewEditor(nft.IPv4)
	whole := nft.NewEditor(nft.IPv4)
	for _, s := range nft.EditorSets() {
		ed.AddSet(s)
		whole.AddSet(s)
	}
	fk := nftfake.New()
	var pending *nft.Transaction
	elements := 0
	apply := func() {
		t.Helper()
		if pending == nil {
			return
		}
		if err := fk.Apply(context.Background(), pending); err != nil {
			t.Fatal(err)
		}
		elements += pending.Changes() - chainSetOps(pending)
		pending = nil
	}
	for i := 0; i < 120; i++ {
		backends := []int{rng.Intn(40), 40 + rng.Intn(40)}
		ed.Replace(nil, nft.SvcFragment(i, backends))
		whole.Replace(nil, nft.SvcFragment(i, backends))
		if i%25 == 0 || i == 119 {
			tx, ok := ed.Piece()
			if !ok {
				t.Fatalf("piece after Service %d refused", i)
			}
			if first := i == 0; (tx.Ops[0].Kind == nft.OpResetTable) != first {
				t.Fatalf("piece after Service %d: first op %v", i, tx.Ops[0].Kind)
			}
			// The previous piece goes to the kernel only now: what was
			// built since must not have reached it.
			apply()
			pending = tx
		}
	}
	apply()
	ed.Commit()
	want := nftfake.New()
	if err := want.Apply(context.Background(), whole.Transaction()); err != nil {
		t.Fatal(err)
	}
	if got, w := fk.Dump(nft.IPv4), want.Dump(nft.IPv4); got != w {
		t.Fatalf("pieces wrote:\n%s\nwant:\n%s", got, w)
	}
	held := 0
	for _, s := range want.Ruleset(nft.IPv4).Sets {
		held += s.Elements.Len()
	}
	if elements != held {
		t.Fatalf("pieces added %d elements, the table holds %d", elements, held)
	}
	if tx := ed.Transaction(); !tx.Empty() {
		t.Fatalf("after the last piece, %d ops left", len(tx.Ops))
	}
}

// chainSetOps counts the operations of tx that are not element changes.
func chainSetOps(tx *nft.Transaction) int {
	n := 0
	for _, op := range tx.Ops {
		if op.Kind != nft.OpAddElements && op.Kind != nft.OpDeleteElements {
			n++
		}
	}
	return n
}

// TestPiecesStopWhenAPieceIsOutdated: once the ruleset changes something
// a piece wrote (an element of two holders takes the second's value), no
// further piece is handed out, and the editor's transaction rewrites the
// whole table over what the pieces wrote.
func TestPiecesStopWhenAPieceIsOutdated(t *testing.T) {
	key := []nft.Datum{nft.Addr(netip.MustParseAddr("192.0.2.1")), nft.Int(uint32(nft.ProtoTCP)), nft.Int(80)}
	frag := func(chain string) *nft.Fragment {
		return &nft.Fragment{Chains: []*nft.Chain{{Name: chain}}, Elements: []nft.SetElement{{"dispatch",
			nft.Element{Key: key, Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: chain}, Comment: chain}}}}
	}
	fk := nftfake.New()
	ed := nft.NewEditor(nft.IPv4)
	for _, s := range nft.EditorSets() {
		ed.AddSet(s)
	}
	ed.Replace(nil, frag("a"))
	tx, ok := ed.Piece()
	if !ok {
		t.Fatal("first piece refused")
	}
	if err := fk.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	ed.Replace(nil, frag("b"))
	if _, ok := ed.Piece(); ok {
		t.Fatal("a piece handed out after the element it wrote changed value")
	}
	ed.Replace(nil, frag("c"))
	if _, ok := ed.Piece(); ok {
		t.Fatal("pieces went on after they stopped")
	}
	tx = ed.Transaction()
	if tx.Ops[0].Kind != nft.OpResetTable {
		t.Fatalf("transaction after the pieces stopped begins with %v, want a reset", tx.Ops[0].Kind)
	}
	if err := fk.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	ed.Commit()
	e, ok := fk.Ruleset(nft.IPv4).Sets["dispatch"].Elements.Get(key)
	if !ok || e.Verdict.Chain != "c" {
		t.Fatalf("dispatch element %+v, want the latest holder's", e)
	}
}

// TestPiecesOnlyForAWholeTable: an editor that diffs against a table read
// back, or that committed, hands out no piece.
func TestPiecesOnlyForAWholeTable(t *testing.T) {
	fk := nftfake.New()
	ed := nft.NewEditor(nft.IPv4)
	for _, s := range nft.EditorSets() {
		ed.AddSet(s)
	}
	ed.Replace(nil, nft.SvcFragment(1, []int{1}))
	if err := fk.Apply(context.Background(), ed.Transaction()); err != nil {
		t.Fatal(err)
	}
	ed.Commit()
	if _, ok := ed.Piece(); ok {
		t.Fatal("a committed editor handed out a piece")
	}
	loaded, err := fk.Load(context.Background(), nft.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := nft.NewEditorFrom(nft.IPv4, loaded).Piece(); ok {
		t.Fatal("an editor of a table read back handed out a piece")
	}
}
