package nftnl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// handoverTable is the table that carries the traffic while table
// nftproxy is deleted and created again (handover). It is owned by the
// socket that writes it, so the kernel deletes it if nftproxy dies
// before it does (from Linux 5.12 on, NFT_TABLE_F_OWNER; before, the next
// rewrite deletes it).
const handoverTable = "nftproxy-handover"

// rewriteAttempts bounds the listings of a rewrite that raced with
// another commit.
const rewriteAttempts = 3

// errGenerationMoved: the kernel refused a batch because the ruleset's
// generation is no longer the one the batch was computed against.
var errGenerationMoved = errors.New("the ruleset changed since it was listed")

// tableListing is what clearInPlace needs to know of table nftproxy in
// the kernel: its flags, and its chains and sets, without rules or
// elements.
type tableListing struct {
	gen   uint32 // the generation it was read at
	found bool
	flags uint32
	owner uint32 // netlink port of the owning socket, 0: none
	use   uint32 // objects in the table (NFTA_TABLE_USE)
	// chains holds every chain, as decodeChain reads it; bindings are the
	// anonymous chains of rules, which go with their rule.
	chains   map[string]*nft.Chain
	bindings map[string]bool
	// sets holds the named sets (decodeSet: a nil Key for one nftproxy
	// could not have written); anonymous counts the anonymous ones.
	sets      map[string]*nft.Set
	anonymous int
	// handover: a handover table this socket owns, or an unowned one, is
	// left over (its deletion failed, or nftproxy died during a handover
	// on a kernel without NFT_TABLE_F_OWNER).
	handover bool
}

// listTable reads the listing of table nftproxy of family f: one table
// dump, then, if the table exists, one dump of chains and one of sets.
func (n *Netlink) listTable(f nft.Family) (*tableListing, error) {
	gen, err := n.generation()
	if err != nil {
		return nil, err
	}
	l := &tableListing{gen: gen, chains: map[string]*nft.Chain{}, bindings: map[string]bool{}, sets: map[string]*nft.Set{}}
	port := n.conn.PID()
	tables, err := n.tables(f)
	if err != nil {
		return nil, fmt.Errorf("dump tables: %w", err)
	}
	for _, t := range tables {
		switch t.name {
		case nft.TableName:
			l.found, l.flags, l.use, l.owner = true, t.flags, t.use, t.owner
		case handoverTable:
			// Ours, or left by an nftproxy that died on a kernel
			// without NFT_TABLE_F_OWNER: no other handover table is
			// unowned.
			l.handover = t.owner == port || t.flags&tableOwner == 0
		}
	}
	if !l.found {
		return l, nil
	}
	if err := n.dump(unix.NFT_MSG_GETCHAIN, f, nil, l.addChain); err != nil {
		return nil, fmt.Errorf("dump chains: %w", err)
	}
	table := func(e *encoder) { e.Str(unix.NFTA_SET_TABLE, nft.TableName) }
	if err := n.dump(unix.NFT_MSG_GETSET, f, table, func(attrs []byte) error { return l.addSet(f, attrs) }); err != nil {
		return nil, fmt.Errorf("dump sets: %w", err)
	}
	return l, nil
}

func (l *tableListing) addChain(attrs []byte) error {
	var d nlcodec.Decoder
	c, binding := decodeChain(&d, attrs)
	if c != nil {
		l.chains[c.Name] = c
		l.bindings[c.Name] = binding
	}
	return d.Err()
}

func (l *tableListing) addSet(f nft.Family, attrs []byte) error {
	var d nlcodec.Decoder
	a := decodeSetAttrs(&d, attrs)
	switch {
	case string(nlcodec.StringBytes(a.table)) != nft.TableName:
	case a.flags&unix.NFT_SET_ANONYMOUS != 0:
		l.anonymous++
	default:
		s := a.set(&d, f)
		l.sets[s.Name] = s
	}
	return d.Err()
}

// clearable reports whether the table can be cleared in place and given
// flags: it does not exist, or it keeps its persistence and holds nothing
// but chains and sets (no named object or flowtable, which only another
// program could have added). A table another running process owns is
// "clearable": the batch is refused (EPERM), as any other would be.
func (l *tableListing) clearable(flags, port uint32) bool {
	switch {
	case !l.found:
		return true
	case l.owner != 0 && l.owner != port:
		return true
	case (l.flags^flags)&tablePersist != 0:
		return false
	}
	return l.use == uint32(len(l.chains)+len(l.sets)+l.anonymous)
}

// kept returns the sets and chains of the listing that tx adds again as
// they are: those clearInPlace keeps (emptied) instead of deleting.
func (l *tableListing) kept(tx *nft.Transaction) (sets, chains map[string]bool) {
	sets, chains = map[string]bool{}, map[string]bool{}
	if !l.found {
		return sets, chains
	}
	for _, op := range tx.Ops {
		switch op.Kind {
		case nft.OpAddSet:
			if have := l.sets[op.Set.Name]; have != nil && have.Key != nil && nft.SameSetDefinition(have, op.Set) {
				sets[op.Set.Name] = true
			}
		case nft.OpAddChain:
			have := l.chains[op.Chain.Name]
			if have != nil && !have.Loaded.Foreign && !l.bindings[have.Name] && reflect.DeepEqual(have.Base, op.Chain.Base) {
				chains[op.Chain.Name] = true
			}
		}
	}
	return sets, chains
}

// clearInPlace writes OpResetTable as a clearing of the table listed in
// b.inPlace: NEWTABLE with the table's flags (creating it, claiming it
// or waking it), every rule deleted (DELRULE naming only the table, as
// `nft flush table` writes it), the kept sets flushed and the others
// deleted, then the chains not kept deleted. The transaction's later
// operations refill the kept objects and add the others.
func (b *batch) clearInPlace() {
	l := b.inPlace
	b.newTable(b.tableFlags)
	if l.handover {
		b.deleteTableNamed(handoverTable)
	}
	if !l.found {
		return
	}
	if len(l.chains) > 0 {
		m := b.begin(unix.NFT_MSG_DELRULE, 0)
		b.enc.Str(unix.NFTA_RULE_TABLE, b.table)
		b.end(m)
	}
	for _, name := range slices.Sorted(maps.Keys(l.sets)) {
		if b.keptSets[name] {
			b.flushSet(name)
		} else {
			b.delSet(name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(l.chains)) {
		if !b.keptChains[name] && !l.bindings[name] {
			b.chainMsg(unix.NFT_MSG_DELCHAIN, name)
		}
	}
}

// rewrite applies tx, which starts with OpResetTable (the whole table
// written again), without refusing a connection: it lists the table and
// clears it in place, or hands over when it cannot. A listing or a batch
// that raced with another commit is done again.
//
// Not as "add table; delete table; add table" and every object after: the
// kernel publishes an interval set's elements to the packet path only at
// the end of a commit (nft_set_commit_update), after the new rules already
// run, so until then the new table's endpoints maps match nothing while
// the old table's elements are gone for the new generation, and new
// connections are refused (docs/rewrite.md: the kernel's code path, the
// reproduction, the measurements). Hash sets have no such step. A table
// cleared in place keeps its sets, whose published structures serve the
// packet path until the commit's end, and its base chains stay hooked.
// What to keep or delete comes from a listing of the table's chains and
// sets (no rules, no elements) read just before; the batch carries the
// generation it was read at, so the kernel refuses it whole if anyone
// committed in between, and the rewrite lists again.
//
// A table whose persistence must change (--own-tables switched) cannot be
// kept: the kernel refuses to add or drop NFT_TABLE_F_PERSIST on a table
// that exists. Its traffic is handed over through a second table instead
// (handover).
func (n *Netlink) rewrite(ctx context.Context, tx *nft.Transaction, opts batchOptions) error {
	var total BatchStats
	defer func() { n.last = total }()
	for attempt := 1; ; attempt++ {
		start := time.Now()
		l, err := n.listTable(tx.Family)
		total.List += time.Since(start)
		if err == nil {
			if l.clearable(opts.tableFlags, n.conn.PID()) {
				o := opts
				o.inPlace, o.genID = l, l.gen
				err = n.commit(ctx, tx, o)
				total.add(n.last)
			} else {
				err = n.handover(ctx, tx, opts, &total)
			}
		}
		raced := errors.Is(err, errLoadRaced) || errors.Is(err, errGenerationMoved)
		if !raced || attempt == rewriteAttempts || ctx.Err() != nil {
			return err
		}
	}
}

// handover rewrites a table that cannot be cleared in place, in three
// batches, each of which leaves the packet path a table that translates:
//  1. the handover table, written whole beside table nftproxy. Its
//     interval sets are new and match nothing until this commit ends, so
//     its DNAT rules miss and the NAT core goes on to table nftproxy's
//     chains, which are untouched.
//  2. table nftproxy deleted and created again, with the flags it must
//     have. The handover table, whose sets are published, translates
//     until the new table's are.
//  3. the handover table deleted: its chains run after table nftproxy's
//     (at an equal priority netfilter puts a later hook first), which
//     translate.
//
// The handover table is deleted however the second batch went.
func (n *Netlink) handover(ctx context.Context, tx *nft.Transaction, opts batchOptions, total *BatchStats) error {
	temp := opts
	temp.table, temp.tableFlags = handoverTable, tableOwner
	err := n.commit(ctx, tx, temp)
	total.add(n.last)
	if errors.Is(err, errOwnedRefused) {
		// A kernel without NFT_TABLE_F_OWNER (Linux 5.10): an ordinary
		// table, which the next rewrite deletes if nftproxy dies before
		// it does (tableListing.handover).
		temp.tableFlags = 0
		err = n.commit(ctx, tx, temp)
		total.add(n.last)
	}
	if err != nil {
		return fmt.Errorf("write table %s: %w", handoverTable, err)
	}
	err = n.commit(ctx, tx, opts)
	total.add(n.last)
	del := batchOptions{table: handoverTable, msgFlags: opts.msgFlags, endFlags: opts.endFlags}
	derr := n.commit(ctx, &nft.Transaction{Family: tx.Family, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}, del)
	total.add(n.last)
	if derr != nil {
		derr = fmt.Errorf("delete table %s: %w", handoverTable, derr)
	}
	return errors.Join(err, derr)
}
