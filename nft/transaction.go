package nft

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"time"
)

// TableName is the one table nftproxy owns in each family. nftproxy never
// touches any other table.
const TableName = "nftproxy"

// OpKind is one kind of kernel operation.
type OpKind int

const (
	// OpResetTable makes the table exist and be empty, whatever was there
	// before (add table; delete table; add table, in the same batch).
	OpResetTable OpKind = iota
	// OpDeleteTable removes the table if it exists (add table; delete table).
	OpDeleteTable
	OpAddChain    // Chain: name and, for a base chain, its hook
	OpFlushChain  // Chain.Name: remove every rule
	OpDeleteChain // Chain.Name: remove the chain and its rules
	OpAddRule     // ChainName, Rule: append a rule
	OpAddSet      // Set: create the set, without elements
	OpDeleteSet   // Set.Name
	OpAddElements // Set (for types), Elements
	OpDeleteElements
)

var opNames = [...]string{"reset-table", "delete-table", "add-chain", "flush-chain",
	"delete-chain", "add-rule", "add-set", "delete-set", "add-elements", "delete-elements"}

func (k OpKind) String() string {
	if int(k) < len(opNames) {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", int(k))
}

// Op is one operation of a Transaction.
type Op struct {
	Kind      OpKind
	Chain     *Chain // OpAddChain, OpFlushChain, OpDeleteChain
	ChainName string // OpAddRule
	Rule      Rule   // OpAddRule
	Set       *Set   // OpAddSet, OpDeleteSet, OpAddElements, OpDeleteElements
	Elements  []Element
	// AllElements, on an OpAddElements, adds every element of Set, as
	// Set holds them when the transaction is applied, instead of
	// Elements: a full rewrite does not copy the elements of its sets
	// (a large share of a full sync's memory; docs/code-figures.md).
	AllElements bool
	// Digest, on the OpAddRule that writes the first rule of a chain
	// written whole, is the digest of all the chain's rules; the rule
	// stores it for Load (see digest.go).
	Digest *RulesDigest
}

// Transaction is an ordered list of operations on the table of one family,
// applied all-or-nothing.
type Transaction struct {
	Family Family
	Ops    []Op
}

// Changes counts the objects the transaction touches: one per chain, rule
// and set operation, and one per element added or deleted. An unchanged
// sync has zero changes.
func (t *Transaction) Changes() int {
	n := 0
	for _, op := range t.Ops {
		switch op.Kind {
		case OpAddElements, OpDeleteElements:
			n += op.ElementCount()
		default:
			n++
		}
	}
	return n
}

// ElementCount is the number of elements an element op adds or deletes.
func (op *Op) ElementCount() int {
	if op.AllElements {
		return op.Set.Elements.Len()
	}
	return len(op.Elements)
}

// AllOf returns the elements an element op adds or deletes.
func (op *Op) AllOf() iter.Seq[Element] {
	if op.AllElements {
		return op.Set.Elements.All()
	}
	return slices.Values(op.Elements)
}

// Empty reports whether the transaction does nothing.
func (t *Transaction) Empty() bool { return len(t.Ops) == 0 }

func (t *Transaction) add(op Op) { t.Ops = append(t.Ops, op) }

// Interface programs tables. Apply runs a transaction atomically: either
// every operation takes effect or none does.
type Interface interface {
	Apply(ctx context.Context, tx *Transaction) error
}

// Backend is what the proxier needs of the kernel's nftables
// (nftnl.Netlink) or of its fake (nftfake.Fake): the compiler, not a
// comment, keeps the two in step.
type Backend interface {
	// Apply commits a transaction, all or nothing.
	Interface
	// Load reads the table back, for a full sync to diff against.
	Loader
	// Generation tells whether a table read back is still current.
	GenerationReader
	// Claim takes an existing table of family f over for this backend
	// before it is read, when the backend owns its tables (a commit,
	// refused while another process owns the table); otherwise it does
	// nothing.
	Claim(ctx context.Context, f Family) error
	// LastCommit reports on the last transaction Apply committed.
	LastCommit() CommitStats
	// Owning reports whether the backend owns its tables and, when it
	// was asked to and cannot, why not.
	Owning() (bool, error)
}

// CommitStats is what a Backend reports of the last transaction it
// committed: where its time went (zero where the backend has no kernel)
// and the ruleset generation it made.
type CommitStats struct {
	Bytes                     int // sent to the kernel
	Encode, Kernel, KernelCPU time.Duration
	GenID                     uint32
}

// TableOwnedError is Apply's error when the kernel refused the transaction
// because another process's netlink socket owns the table
// (NFT_TABLE_F_OWNER): it stays refused until that socket closes.
type TableOwnedError struct {
	Family Family
	// Owner is the owning socket's netlink port (0: not known).
	Owner uint32
}

func (e *TableOwnedError) Error() string {
	if e.Owner == 0 {
		return fmt.Sprintf("table %s %s is owned by another process", e.Family, TableName)
	}
	return fmt.Sprintf("table %s %s is owned by another process (netlink port %d)", e.Family, TableName, int32(e.Owner))
}

// Loader reads back the table an Interface programs, so that a restarted
// nftproxy can diff against it instead of rewriting it (NewEditorFrom).
// Load returns the table of family f with its sets, their elements (but
// those of dynamic sets, which the packet path fills) and its chains, each
// chain with Loaded set in place of its rules. A nil Ruleset means there is
// no table, or one nftproxy cannot build on (a dormant table): the first
// transaction then writes it whole.
type Loader interface {
	Load(ctx context.Context, f Family) (*Ruleset, error)
}

// GenerationReader reads the ruleset generation: a counter the kernel
// moves with every commit to any table of the network namespace, by any
// process. A table read back is still the kernel's state while the
// generation is the one it was read at (Ruleset.Generation), so a reading
// made ahead of its use can be checked before it is built on.
type GenerationReader interface {
	Generation(ctx context.Context) (uint32, error)
}

// Target names the object an op works on, for error messages.
func (op Op) Target() string {
	switch {
	case op.Kind == OpResetTable || op.Kind == OpDeleteTable:
		return TableName
	case op.Chain != nil:
		return op.Chain.Name
	case op.Set != nil:
		return op.Set.Name
	}
	return op.ChainName
}
