package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"

	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// This file encodes a Transaction into one nfnetlink batch: the bytes of
// BATCH_BEGIN, the nf_tables messages, and BATCH_END, ready for a single
// sendmsg. Every message and attribute is laid out as nft 1.0.6 writes it
// (captured with `nft --debug=mnl -f`, see TestNetlinkBytesMatchNft), so
// that `nft list` decompiles what we write.

const (
	nlmsgHeaderLen = 16 // struct nlmsghdr
	nlaHeaderLen   = 4  // struct nlattr
	// maxAttrLen is the largest attribute: nla_len is a u16, so a nested
	// element list must stay below it (the batch as a whole has no such
	// limit, only the socket's send buffer).
	maxAttrLen = 0xffff
)

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

// encoder appends netlink messages and attributes to one buffer.
type encoder struct {
	b   []byte
	err error // first encoding error (an attribute too long)
}

// beginMsg starts a message with an nfgenmsg header (family, version 0,
// res_id big-endian) and returns its offset for endMsg.
func (e *encoder) beginMsg(typ, flags uint16, seq uint32, family uint8, resID uint16) int {
	start := len(e.b)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0) // nlmsg_len, set by endMsg
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	e.b = binary.NativeEndian.AppendUint16(e.b, flags)
	e.b = binary.NativeEndian.AppendUint32(e.b, seq)
	e.b = binary.NativeEndian.AppendUint32(e.b, 0) // nlmsg_pid: 0 = to the kernel
	e.b = append(e.b, family, unix.NFNETLINK_V0)
	e.b = binary.BigEndian.AppendUint16(e.b, resID)
	return start
}

func (e *encoder) endMsg(start int) {
	binary.NativeEndian.PutUint32(e.b[start:], uint32(len(e.b)-start))
}

func (e *encoder) pad() {
	for len(e.b)%4 != 0 {
		e.b = append(e.b, 0)
	}
}

// attrHeader writes an attribute header for n bytes of data, or records an
// error if they do not fit.
func (e *encoder) attrHeader(typ uint16, n int) bool {
	if n+nlaHeaderLen > maxAttrLen {
		e.setErr(fmt.Errorf("attribute %d: %d bytes is too long for netlink", typ, n))
		return false
	}
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(n+nlaHeaderLen))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
	return true
}

func (e *encoder) attr(typ uint16, data []byte) {
	if e.attrHeader(typ, len(data)) {
		e.b = append(e.b, data...)
		e.pad()
	}
}

// str writes a NUL-terminated string attribute.
func (e *encoder) str(typ uint16, s string) {
	if e.attrHeader(typ, len(s)+1) {
		e.b = append(append(e.b, s...), 0)
		e.pad()
	}
}

func (e *encoder) u32(typ uint16, v uint32) {
	e.attrHeader(typ, 4)
	e.b = binary.BigEndian.AppendUint32(e.b, v)
}

func (e *encoder) u64(typ uint16, v uint64) {
	e.attrHeader(typ, 8)
	e.b = binary.BigEndian.AppendUint64(e.b, v)
}

// nest starts a nested attribute (NLA_F_NESTED, as nft sets it) and returns
// its offset for endNest.
func (e *encoder) nest(typ uint16) int {
	start := len(e.b)
	e.b = binary.NativeEndian.AppendUint16(e.b, 0)
	e.b = binary.NativeEndian.AppendUint16(e.b, typ|unix.NLA_F_NESTED)
	return start
}

func (e *encoder) endNest(start int) {
	n := len(e.b) - start
	if n > maxAttrLen {
		e.setErr(fmt.Errorf("nested attribute: %d bytes is too long for netlink", n))
		return
	}
	binary.NativeEndian.PutUint16(e.b[start:], uint16(n))
}

func (e *encoder) setErr(err error) {
	if e.err == nil {
		e.err = err
	}
}

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
	return &batch{enc: encoder{b: alloc(sizeHint(tx))}, family: tx.Family, firstSeq: o.firstSeq,
		owners: make([]int, 0, len(tx.Ops)+3), msgFlags: o.msgFlags, setIDs: map[string]uint32{},
		tableFlags: o.tableFlags, table: table}
}

// sizeHint estimates the bytes of tx's batch, a little high for the rules
// nftproxy writes (a cold start of 10,000 Services: 21 MiB estimated 23),
// so that the buffer is allocated once instead of growing by a quarter at
// a time, copying everything each time.
func sizeHint(tx *nft.Transaction) int {
	n := 2 * nlmsgHeaderLen
	for _, op := range tx.Ops {
		switch op.Kind {
		case nft.OpAddRule:
			n += 64 + len(op.ChainName) + len(op.Rule.Comment) + 112*len(op.Rule.Phrases)
			if op.Digest != nil {
				n += 24
			}
		case nft.OpAddElements, nft.OpDeleteElements:
			per := 48 + tupleLen(op.Set.Key) + tupleLen(op.Set.Data)
			if op.Set.Endpoints != 0 {
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
	start := b.enc.beginMsg(unix.NFNL_SUBSYS_NFTABLES<<8|msgType, flagRequest|flags|b.msgFlags,
		b.seq(), uint8(b.family), 0)
	b.owners = append(b.owners, b.op)
	return start
}

func (b *batch) end(start int) { b.enc.endMsg(start) }

// control writes BATCH_BEGIN or BATCH_END: family AF_UNSPEC, res_id
// NFNL_SUBSYS_NFTABLES so that the kernel hands the batch to nf_tables;
// a BATCH_BEGIN with a genID (not 0) carries it as NFNL_BATCH_GENID.
func (b *batch) control(msgType uint16, flags uint16, genID uint32) {
	start := b.enc.beginMsg(msgType, flagRequest|flags, b.seq(), unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	if genID != 0 {
		b.enc.u32(unix.NFNL_BATCH_GENID, genID)
	}
	b.owners = append(b.owners, opControl)
	b.enc.endMsg(start)
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
		if b.enc.err != nil {
			return nil, fmt.Errorf("op %d %s %q: %w", i, op.Kind, op.Target(), b.enc.err)
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

// Table flags, include/uapi/linux/netfilter/nf_tables.h.
const (
	// tableOwner: only the socket that set it may change the table, and
	// the kernel deletes the table when that socket closes (Linux 5.12)...
	tableOwner = 0x2 // NFT_TABLE_F_OWNER
	// ...unless tablePersist is set too: then the table stays, ownerless,
	// and a new owner may claim it (Linux 6.9).
	tablePersist = 0x4 // NFT_TABLE_F_PERSIST
	// ownedFlags are those of a table nftproxy owns.
	ownedFlags = tableOwner | tablePersist
)

// newTable writes a NEWTABLE that creates the table with flags, or, on a
// table that exists, sets them: the kernel claims an ownerless persistent
// table for this socket when flags are ownedFlags, and refuses
// (EOPNOTSUPP) to drop or add tablePersist on a table that exists.
func (b *batch) newTable(flags uint32) {
	m := b.begin(unix.NFT_MSG_NEWTABLE, flagCreate)
	b.enc.str(unix.NFTA_TABLE_NAME, b.table)
	b.enc.u32(unix.NFTA_TABLE_FLAGS, flags)
	b.end(m)
}

// ensureTable writes a NEWTABLE without flags: it creates the table if it
// does not exist and leaves the flags of one that does alone, so that it
// is accepted whatever flags an earlier owner left.
func (b *batch) ensureTable() {
	m := b.begin(unix.NFT_MSG_NEWTABLE, flagCreate)
	b.enc.str(unix.NFTA_TABLE_NAME, b.table)
	b.end(m)
}

func (b *batch) deleteTable() {
	m := b.begin(unix.NFT_MSG_DELTABLE, 0)
	b.enc.str(unix.NFTA_TABLE_NAME, b.table)
	b.end(m)
	b.setIDs = map[string]uint32{}
}

// hookNum maps a hook to its number in include/uapi/linux/netfilter.h.
var hookNum = map[nft.Hook]uint32{
	nft.HookPrerouting:  unix.NF_INET_PRE_ROUTING,
	nft.HookInput:       unix.NF_INET_LOCAL_IN,
	nft.HookForward:     unix.NF_INET_FORWARD,
	nft.HookOutput:      unix.NF_INET_LOCAL_OUT,
	nft.HookPostrouting: unix.NF_INET_POST_ROUTING,
}

// newChain writes NEWCHAIN; a base chain carries its type, policy accept and
// hook, in nft's attribute order.
func (b *batch) newChain(c *nft.Chain) {
	m := b.begin(unix.NFT_MSG_NEWCHAIN, flagCreate)
	b.enc.str(unix.NFTA_CHAIN_TABLE, b.table)
	b.enc.str(unix.NFTA_CHAIN_NAME, c.Name)
	if c.Base != nil {
		b.enc.str(unix.NFTA_CHAIN_TYPE, string(c.Base.Type))
		b.enc.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
		h := b.enc.nest(unix.NFTA_CHAIN_HOOK)
		b.enc.u32(unix.NFTA_HOOK_HOOKNUM, hookNum[c.Base.Hook])
		b.enc.u32(unix.NFTA_HOOK_PRIORITY, uint32(c.Base.Priority))
		b.enc.endNest(h)
	}
	b.end(m)
}

// chainMsg writes DELCHAIN, or DELRULE with only the chain (flush chain).
func (b *batch) chainMsg(msgType uint16, chain string) {
	m := b.begin(msgType, 0)
	b.enc.str(unix.NFTA_CHAIN_TABLE, b.table) // == NFTA_RULE_TABLE
	if msgType == unix.NFT_MSG_DELRULE {
		b.enc.str(unix.NFTA_RULE_CHAIN, chain)
	} else {
		b.enc.str(unix.NFTA_CHAIN_NAME, chain)
	}
	b.end(m)
}

// newRule writes NEWRULE (append). The comment travels as rule userdata
// (libnftnl NFTNL_UDATA_RULE_COMMENT = 0), and so does the digest of the
// chain's rules on a chain's first rule (see ruleUserdata).
func (b *batch) newRule(chain string, r nft.Rule, digest *nft.RulesDigest) error {
	m := b.begin(unix.NFT_MSG_NEWRULE, flagCreate|flagAppend)
	b.enc.str(unix.NFTA_RULE_TABLE, b.table)
	b.enc.str(unix.NFTA_RULE_CHAIN, chain)
	list := b.enc.nest(unix.NFTA_RULE_EXPRESSIONS)
	if err := b.lowerRule(r); err != nil {
		return err
	}
	b.enc.endNest(list)
	if err := b.enc.ruleUserdata(r.Comment, digest); err != nil {
		return err
	}
	b.end(m)
	return nil
}

// Verdict codes (include/uapi/linux/netfilter.h, nf_tables.h): NF_DROP,
// NF_ACCEPT and the negative NFT_* codes, sent as a big-endian u32.
const (
	nfDrop   = 0
	nfAccept = 1
)

func verdictCode(k nft.VerdictKind) uint32 {
	var code int32
	switch k {
	case nft.VerdictAccept:
		code = nfAccept
	case nft.VerdictDrop:
		code = nfDrop
	case nft.VerdictReturn:
		code = unix.NFT_RETURN
	case nft.VerdictJump:
		code = unix.NFT_JUMP
	case nft.VerdictGoto:
		code = unix.NFT_GOTO
	default:
		code = unix.NFT_BREAK // not produced by nftproxy
	}
	return uint32(code)
}
