package nftnl

import (
	"fmt"
	"runtime/debug"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file encodes a Transaction into one nfnetlink batch: the bytes of
// BATCH_BEGIN, the nf_tables messages, and BATCH_END, ready for a single
// sendmsg. Every message and attribute is laid out as nft 1.0.6 writes it
// (captured with `nft --debug=mnl -f`, see TestNetlinkBytesMatchNft), so
// that `nft list` decompiles what we write. The messages of each object
// are in its own file (table.go, chain.go, rule.go, set.go, element.go).

// maxElemListLen bounds the NFTA_SET_ELEM_LIST_ELEMENTS attribute of one
// NEWSETELEM/DELSETELEM message. Longer element lists are split across
// several messages of the same batch; the kernel still commits them
// all-or-nothing. A variable so tests can force splitting.
var maxElemListLen = 60 << 10

// Message flags, include/uapi/linux/netlink.h. nft 1.0.6 requests no ACKs
// inside a batch (checked with strace); errors are reported regardless.
const (
	flagRequest = unix.NLM_F_REQUEST
	flagAck     = unix.NLM_F_ACK
	flagCreate  = unix.NLM_F_CREATE
	flagAppend  = unix.NLM_F_APPEND
)

// encoder is the nfnetlink encoder, with the nf_tables parts (expressions,
// userdata) as methods of its own.
type encoder struct{ nlcodec.Encoder }

// batch encodes the operations of one transaction. Message i of the batch
// has sequence number firstSeq+i; owners[i] is the index of the Op that
// produced it (-1 for BATCH_BEGIN and BATCH_END), so a kernel error can be
// traced back to the operation.
type batch struct {
	enc      encoder
	family   nft.Family
	firstSeq uint32
	// owners holds, per message, the index of the Op it belongs to, or
	// opControl (BATCH_BEGIN, BATCH_END) or opClaim.
	owners     []int
	op         int    // index of the Op being encoded
	msgFlags   uint16 // extra flags for every message (flagAck to measure ACK-all)
	tableFlags uint32 // of a table the batch creates
	table      string // the table the batch writes: TableName, or handoverTable
	// inPlace, when set, is the table in the kernel that OpResetTable
	// clears in place (see clearInPlace); nil: OpResetTable deletes and
	// recreates the table. keptSets and keptChains are the objects the
	// clearing keeps, which the transaction's OpAddSet and OpAddChain
	// then leave alone.
	inPlace              *tableListing
	keptSets, keptChains map[string]bool

	// setIDs names the sets created in this batch: NEWSET carries an ID
	// that later messages of the same batch may use to find the set. IDs
	// are local to a batch.
	setIDs    map[string]uint32
	lastSetID uint32
	elements  int
	scratch   elemScratch
}

// Owners of the messages that belong to no Op.
const (
	opControl = -1 // BATCH_BEGIN, BATCH_END
	opClaim   = -2 // the NEWTABLE that claims the table (batchOptions.claim)
)

// batchOptions are what encodeTransaction needs besides the transaction.
type batchOptions struct {
	firstSeq uint32
	// tableFlags are the flags of a table the batch creates (OpResetTable).
	tableFlags uint32
	// claim starts the batch with a NEWTABLE that claims the table for the
	// sending socket (ownedFlags).
	claim bool
	// table is the table the batch writes (default TableName).
	table string
	// inPlace makes OpResetTable clear this table in place instead of
	// deleting and recreating it (see clearInPlace).
	inPlace *tableListing
	// genID, if not 0, is the ruleset generation the batch was computed
	// against: BATCH_BEGIN carries it (NFNL_BATCH_GENID) and the kernel
	// refuses the whole batch with ERESTART if the generation moved.
	genID    uint32
	msgFlags uint16 // added to every nf_tables message (flagAck: ACK-every-message mode)
	endFlags uint16 // added to BATCH_END
	// buffer, if set, returns the buffer to encode into: length 0,
	// capacity n (sizeHint). Default: make.
	buffer func(n int) []byte
}

// newBatch returns an empty batch for tx with room for its messages (most
// ops write one).
func newBatch(tx *nft.Transaction, o batchOptions) *batch {
	alloc := o.buffer
	if alloc == nil {
		alloc = func(n int) []byte { return make([]byte, 0, n) }
	}
	table := o.table
	if table == "" {
		table = nft.TableName
	}
	return &batch{enc: encoder{nlcodec.Encoder{Buf: alloc(sizeHint(tx))}}, family: tx.Family, firstSeq: o.firstSeq,
		owners: make([]int, 0, len(tx.Ops)+3), msgFlags: o.msgFlags, setIDs: map[string]uint32{},
		tableFlags: o.tableFlags, table: table}
}

// sizeHint estimates the bytes of tx's batch, a little high for the rules
// nftproxy writes, so that the buffer is allocated once instead of growing
// by a quarter at a time, copying everything each time.
func sizeHint(tx *nft.Transaction) int {
	n := 2 * nlcodec.HeaderLen
	for _, op := range tx.Ops {
		switch op.Kind {
		case nft.OpAddRule:
			n += 64 + len(op.ChainName) + len(op.Rule.Comment) + 112*len(op.Rule.Phrases)
			if op.Digest != nil {
				n += 24
			}
		case nft.OpAddElements, nft.OpDeleteElements:
			per := 48 + tupleLen(op.Set.Key) + tupleLen(op.Set.Data)
			if op.Set.EndpointsProto != 0 {
				per += 40 // the range's end: an element of its own
			}
			n += per * op.ElementCount()
			if op.AllElements {
				n += op.Set.Elements.ValueBytes() // comments, and more
			} else {
				for _, e := range op.Elements {
					n += len(e.Comment)
				}
			}
			n += 64 + len(op.Set.Name)
		default:
			n += 128
		}
	}
	return n
}

func (b *batch) seq() uint32 { return b.firstSeq + uint32(len(b.owners)) }

// begin starts an nf_tables message owned by the current op.
func (b *batch) begin(msgType uint16, flags uint16) int {
	start := b.enc.BeginMsg(unix.NFNL_SUBSYS_NFTABLES<<8|msgType, flagRequest|flags|b.msgFlags,
		b.seq(), uint8(b.family), 0)
	b.owners = append(b.owners, b.op)
	return start
}

func (b *batch) end(start int) { b.enc.EndMsg(start) }

// control writes BATCH_BEGIN or BATCH_END: family AF_UNSPEC, res_id
// NFNL_SUBSYS_NFTABLES so that the kernel hands the batch to nf_tables;
// a BATCH_BEGIN with a genID (not 0) carries it as NFNL_BATCH_GENID.
func (b *batch) control(msgType uint16, flags uint16, genID uint32) {
	start := b.enc.BeginMsg(msgType, flagRequest|flags, b.seq(), unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	if genID != 0 {
		b.enc.BE32(unix.NFNL_BATCH_GENID, genID)
	}
	b.owners = append(b.owners, opControl)
	b.enc.EndMsg(start)
}

// encodeTransaction returns the batch for tx.
func encodeTransaction(tx *nft.Transaction, o batchOptions) (*batch, error) {
	b := newBatch(tx, o)
	if o.inPlace != nil {
		b.inPlace = o.inPlace
		b.keptSets, b.keptChains = o.inPlace.kept(tx)
	}
	b.control(unix.NFNL_MSG_BATCH_BEGIN, 0, o.genID)
	if o.claim {
		b.op = opClaim
		b.newTable(ownedFlags)
	}
	for i, op := range tx.Ops {
		b.op = i
		if err := b.addOp(op); err != nil {
			return nil, fmt.Errorf("op %d %s %q: %w", i, op.Kind, op.Target(), err)
		}
		if b.enc.Err() != nil {
			return nil, fmt.Errorf("op %d %s %q: %w", i, op.Kind, op.Target(), b.enc.Err())
		}
	}
	b.op = opControl
	b.control(unix.NFNL_MSG_BATCH_END, o.endFlags, 0)
	return b, nil
}

func (b *batch) addOp(op nft.Op) error {
	switch op.Kind {
	case nft.OpResetTable:
		if b.inPlace != nil {
			b.clearInPlace()
			break
		}
		// add; delete; add: the table exists and is empty whatever was
		// there, in one atomic step (the kernel's DELTABLE drops the
		// table's chains, rules and sets). Only for a table no traffic
		// goes through: see clearInPlace.
		b.ensureTable()
		b.deleteTable()
		b.newTable(b.tableFlags)
	case nft.OpDeleteTable:
		b.ensureTable()
		b.deleteTable()
	case nft.OpAddChain:
		if !b.keptChains[op.Chain.Name] {
			b.newChain(op.Chain)
		}
	case nft.OpFlushChain:
		b.chainMsg(unix.NFT_MSG_DELRULE, op.Chain.Name)
	case nft.OpDeleteChain:
		b.chainMsg(unix.NFT_MSG_DELCHAIN, op.Chain.Name)
	case nft.OpAddRule:
		return b.newRule(op.ChainName, op.Rule, op.Digest)
	case nft.OpAddSet:
		if b.keptSets[op.Set.Name] {
			return nil // kept by clearInPlace, with this definition
		}
		return b.newSet(op.Set)
	case nft.OpDeleteSet:
		b.delSet(op.Set.Name)
	case nft.OpAddElements:
		return b.setElements(unix.NFT_MSG_NEWSETELEM, &op)
	case nft.OpDeleteElements:
		return b.setElements(unix.NFT_MSG_DELSETELEM, &op)
	default:
		return fmt.Errorf("unknown op kind %d", int(op.Kind))
	}
	return nil
}

// offHeapBatch is the size from which a batch is encoded into memory of
// its own (batchBuffer) instead of the Go heap.
const offHeapBatch = 1 << 20

// releaseBeforeBatch is the size from which the heap's free memory is
// returned to the kernel before the batch is mapped: a full sync of a
// large cluster maps its batch when the heap is fullest, and the peak RSS
// of the process is that heap, freed garbage included, plus the batch.
// Releasing it costs one garbage collection, a small share of such a sync
// (docs/code-figures.md); smaller full syncs stay below the threshold and
// pay nothing.
const releaseBeforeBatch = 32 << 20

// batchBuffer holds a large batch outside the Go heap, in an anonymous
// mapping unmapped as soon as Apply is done with it. In the heap, the
// batch of a full sync counted twice toward the peak: as live memory while
// the sync's other data is live too, and in the heap goal the collector
// then grows to (GOGC). Nothing may keep a slice of it after Apply: the
// batch's bytes are only sent.
type batchBuffer struct{ region []byte }

func (bb *batchBuffer) get(n int) []byte {
	if n < offHeapBatch {
		return make([]byte, 0, n)
	}
	if n >= releaseBeforeBatch {
		// The batch comes on top of whatever the heap holds, the
		// garbage of building it included: return that to the kernel
		// first.
		debug.FreeOSMemory()
	}
	r, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, 0, n) // the heap will do
	}
	bb.region = r
	return r[:0]
}

// release unmaps the region. A batch that outgrew it was moved to the
// heap by append; the region is unmapped all the same.
func (bb *batchBuffer) release() {
	if bb.region != nil {
		_ = unix.Munmap(bb.region)
		bb.region = nil
	}
}
