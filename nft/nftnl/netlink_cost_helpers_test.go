package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Helpers for the kernel cost benchmarks: hand-written batches for shapes the
// Transaction model cannot express yet (interval maps, data lookups, the
// byteorder expression), and timing.

// Attributes and flags missing from x/sys/unix
// (include/uapi/linux/netfilter/nf_tables.h).
const (
	costSetConcat     = 0x80 // NFT_SET_CONCAT
	costSetDescConcat = 2    // NFTA_SET_DESC_CONCAT
	costSetFieldLen   = 1    // NFTA_SET_FIELD_LEN
	costSetElemKeyEnd = 10   // NFTA_SET_ELEM_KEY_END
	costBuckets       = 1 << 16
)

// costRaw sends one batch whose messages fill writes, exactly as Apply sends
// a transaction (one sendmsg, BATCH_END ACKed where the kernel ACKs it,
// GETGEN sentinel), and returns the kernel time: from sendmsg to the
// sentinel's reply.
func costRaw(n *Netlink, f nft.Family, fill func(b *batch) error) (time.Duration, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	first := n.seq.Next(0)
	b := newBatch(&nft.Transaction{Family: f}, batchOptions{firstSeq: first})
	b.control(unix.NFNL_MSG_BATCH_BEGIN, 0, 0)
	b.op = 0
	if err := fill(b); err != nil {
		return 0, err
	}
	if b.enc.Err() != nil {
		return 0, b.enc.Err()
	}
	b.op = -1
	b.control(unix.NFNL_MSG_BATCH_END, flagAck, 0)
	n.seq.Next(len(b.owners))
	if err := n.conn.SetDeadline(time.Now().Add(30 * time.Minute)); err != nil {
		return 0, err
	}
	sent := time.Now()
	if _, err := n.send(b.enc.Buf); err != nil {
		return 0, fmt.Errorf("send %d bytes: %w", len(b.enc.Buf), err)
	}
	res, err := n.readReplies(b)
	took := time.Since(sent)
	if err != nil {
		return took, err
	}
	if len(res.errs) > 0 {
		e := res.errs[0]
		return took, fmt.Errorf("message %d of %d: %w (kernel: %q; %d errors)", e.index, len(b.owners), e.Errno, e.Msg, len(res.errs))
	}
	if !res.confirmed {
		// Kernels before 6.10 ACK no BATCH_END: no error is success.
		if k, err := n.probeKernel(); err != nil || k.BatchEndACK {
			return took, fmt.Errorf("BATCH_END was not ACKed (kernel: %s, %v)", k, err)
		}
	}
	return took, nil
}

// costTx applies a transaction and returns its kernel time.
func costTx(n *Netlink, tx *nft.Transaction) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	err := n.Apply(ctx, tx)
	return n.LastBatch().Kernel, err
}

// --- raw messages ---

// costIntervalMap writes NEWSET for an interval map. With fieldLens (a
// concatenation) it asks for NFT_SET_CONCAT and NFTA_SET_DESC_CONCAT, which
// selects the pipapo backend; without, the kernel picks rbtree, whatever
// the key length. No userdata: nft lists these sets with raw types.
func (b *batch) costIntervalMap(name string, keyMagic, keyLen, dataMagic, dataLen uint32, fieldLens []uint32) {
	flags := uint32(unix.NFT_SET_INTERVAL | unix.NFT_SET_MAP)
	if len(fieldLens) > 0 {
		flags |= costSetConcat
	}
	b.costMap(name, flags, keyMagic, keyLen, dataMagic, dataLen, fieldLens)
}

// costExactMap writes NEWSET for a map without intervals (the kernel picks
// a hash).
func (b *batch) costExactMap(name string, keyMagic, keyLen, dataMagic, dataLen uint32) {
	b.costMap(name, unix.NFT_SET_MAP, keyMagic, keyLen, dataMagic, dataLen, nil)
}

// costMap writes NEWSET for a map with these flags and, with fieldLens,
// the lengths of its concatenated key's fields.
func (b *batch) costMap(name string, flags, keyMagic, keyLen, dataMagic, dataLen uint32, fieldLens []uint32) {
	b.lastSetID++
	id := b.lastSetID
	m := b.begin(unix.NFT_MSG_NEWSET, flagCreate)
	b.enc.Str(unix.NFTA_SET_TABLE, nft.TableName)
	b.enc.Str(unix.NFTA_SET_NAME, name)
	b.enc.BE32(unix.NFTA_SET_FLAGS, flags)
	b.enc.BE32(unix.NFTA_SET_KEY_TYPE, keyMagic)
	b.enc.BE32(unix.NFTA_SET_KEY_LEN, keyLen)
	b.enc.BE32(unix.NFTA_SET_DATA_TYPE, dataMagic)
	b.enc.BE32(unix.NFTA_SET_DATA_LEN, dataLen)
	b.enc.BE32(unix.NFTA_SET_ID, id)
	if len(fieldLens) > 0 {
		d := b.enc.Nest(unix.NFTA_SET_DESC)
		c := b.enc.Nest(costSetDescConcat)
		for _, l := range fieldLens {
			el := b.enc.Nest(unix.NFTA_LIST_ELEM)
			b.enc.BE32(costSetFieldLen, l)
			b.enc.EndNest(el)
		}
		b.enc.EndNest(c)
		b.enc.EndNest(d)
	}
	b.end(m)
	b.setIDs[name] = id
}

// costRange is one interval of a map: keys [lo, hi) for rbtree (hi is the
// key of the end element), [lo, hi] for pipapo (hi is KEY_END); data is
// the mapped value (nil when deleting).
type costRange struct {
	lo, hi, data []byte
}

// costIntervalElems writes NEWSETELEM or DELSETELEM for ranges: for rbtree
// a start element (with data) and an end element (NFT_SET_ELEM_INTERVAL_END)
// per range, as nft writes them; for pipapo one element with KEY and KEY_END.
func (b *batch) costIntervalElems(msgType uint16, set string, ranges []costRange, pipapo bool) {
	type elem struct {
		key, keyEnd, data []byte
		end               bool
	}
	var elems []elem
	for _, r := range ranges {
		if pipapo {
			elems = append(elems, elem{key: r.lo, keyEnd: r.hi, data: r.data})
		} else {
			elems = append(elems, elem{key: r.lo, data: r.data}, elem{key: r.hi, end: true})
		}
	}
	flags := uint16(0)
	if msgType == unix.NFT_MSG_NEWSETELEM {
		flags = flagCreate
	}
	setID := b.setIDs[set]
	for len(elems) > 0 {
		m := b.begin(msgType, flags)
		b.enc.Str(unix.NFTA_SET_ELEM_LIST_TABLE, nft.TableName)
		b.enc.Str(unix.NFTA_SET_ELEM_LIST_SET, set)
		if setID != 0 {
			b.enc.BE32(unix.NFTA_SET_ELEM_LIST_SET_ID, setID)
		}
		list := b.enc.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		i := 0
		for ; i < len(elems) && len(b.enc.Buf)-list < maxElemListLen; i++ {
			e := elems[i]
			el := b.enc.Nest(uint16(i + 1))
			if e.end {
				b.enc.BE32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
			}
			k := b.enc.Nest(unix.NFTA_SET_ELEM_KEY)
			b.enc.Attr(unix.NFTA_DATA_VALUE, e.key)
			b.enc.EndNest(k)
			if e.keyEnd != nil {
				k := b.enc.Nest(costSetElemKeyEnd)
				b.enc.Attr(unix.NFTA_DATA_VALUE, e.keyEnd)
				b.enc.EndNest(k)
			}
			if e.data != nil && msgType == unix.NFT_MSG_NEWSETELEM {
				d := b.enc.Nest(unix.NFTA_SET_ELEM_DATA)
				b.enc.Attr(unix.NFTA_DATA_VALUE, e.data)
				b.enc.EndNest(d)
			}
			b.enc.EndNest(el)
		}
		b.enc.EndNest(list)
		b.end(m)
		b.elements += i
		elems = elems[i:]
	}
}

// costRule writes NEWRULE (append) with the expressions exprs writes.
func (b *batch) costRule(chain string, exprs func(e *encoder)) {
	m := b.begin(unix.NFT_MSG_NEWRULE, flagCreate|flagAppend)
	b.enc.Str(unix.NFTA_RULE_TABLE, nft.TableName)
	b.enc.Str(unix.NFTA_RULE_CHAIN, chain)
	list := b.enc.Nest(unix.NFTA_RULE_EXPRESSIONS)
	exprs(&b.enc)
	b.enc.EndNest(list)
	b.end(m)
}

// costGlobalRule is the one rule of design h: the Service's address,
// protocol and port and a random bucket, looked up in one interval map
// whose value is the endpoint:
//
//	dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 65536 map @<set>
//
// [ payload load 4b @ network header + 16 => reg 1 ] [ meta load l4proto => reg 9 ]
// [ payload load 2b @ transport header + 2 => reg 10 ] [ numgen reg 11 = random mod 65536 ]
// [ byteorder reg 11 = hton(reg 11, 4, 4) ] [ lookup reg 1 set <set> dreg 1 ]
// [ nat dnat ip addr_min reg 1 proto_min reg 9 flags 0x2 ]
func costGlobalRule(set string, setID uint32) func(e *encoder) {
	return func(e *encoder) {
		e.payloadLoad(unix.NFT_PAYLOAD_NETWORK_HEADER, 16, 4, slotReg(0))
		e.metaLoad(unix.NFT_META_L4PROTO, slotReg(1))
		e.payloadLoad(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, slotReg(2))
		e.numgenRandom(slotReg(3), costBuckets)
		e.byteorderHton(slotReg(3), slotReg(3), 4, 4)
		e.lookupData(reg1, reg1, set, setID)
		e.dnat(uint32(nft.IPv4), reg1, slotReg(1), unix.NF_NAT_RANGE_PROTO_SPECIFIED)
	}
}

// costBucketRanges splits the buckets [0, 65536) into len(eps) ranges,
// one per endpoint, with key prefix (nil for design g) before the bucket
// and data addr . port. pipapo ranges end inclusive, rbtree ones exclusive.
func costBucketRanges(prefix []byte, eps []netip.AddrPort, pipapo bool) []costRange {
	out := make([]costRange, len(eps))
	for j, ep := range eps {
		lo := uint32(j * costBuckets / len(eps))
		hi := uint32((j + 1) * costBuckets / len(eps))
		if pipapo {
			hi--
		}
		out[j] = costRange{
			lo:   binary.BigEndian.AppendUint32(slices.Clone(prefix), lo),
			hi:   binary.BigEndian.AppendUint32(slices.Clone(prefix), hi),
			data: costAddrPort(ep),
		}
	}
	return out
}

// costAddrPort is the data ipv4_addr . inet_service: 4 + (2 + 2 padding) bytes.
func costAddrPort(ep netip.AddrPort) []byte {
	a := ep.Addr().As4()
	b := make([]byte, 8)
	copy(b, a[:])
	binary.BigEndian.PutUint16(b[4:], ep.Port())
	return b
}

// costVIPKey is the key prefix ip daddr . meta l4proto . th dport, each
// field padded to 4 bytes, as the registers hold it.
func costVIPKey(ip netip.Addr, proto uint8, port uint16) []byte {
	a := ip.As4()
	k := append(a[:], proto, 0, 0, 0)
	k = binary.BigEndian.AppendUint16(k, port)
	return append(k, 0, 0)
}

// costDeleteRanges strips the data of ranges, for DELSETELEM.
func costDeleteRanges(rs []costRange) []costRange {
	out := make([]costRange, len(rs))
	for i, r := range rs {
		out[i] = costRange{lo: r.lo, hi: r.hi}
	}
	return out
}

// costHairpin returns the hairpin-connections elements of endpoints.
func costHairpin(eps []netip.AddrPort) []nft.Element {
	var out []nft.Element
	for _, ep := range eps {
		out = append(out, nft.Element{Key: []nft.Datum{nft.Addr(ep.Addr()), nft.Addr(ep.Addr()), nfttest.TCP, nft.Int(uint32(ep.Port()))}})
	}
	return out
}

// costAltBackends is a second, disjoint set of n endpoints for Service i
// (10.64.0.0/10), to move a Service back and forth between two sets.
func costAltBackends(i, n int) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for j := range n {
		k := i*16 + j
		out[j] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(64 + k>>16), byte(k >> 8), byte(k)}), 8080)
	}
	return out
}

// costServiceElements are the operations of a cold start that fill the
// base table's sets for svcs: every ClusterIP, a reject for each Service
// without endpoints, and for each with endpoints its hairpin elements and
// dispatch(s) in service-ips (dispatch nil: none). withEndpoints, if not
// nil, sees each Service with endpoints, for the design's own elements.
func costServiceElements(rs *nft.Ruleset, svcs []nfttest.Service, dispatch func(nfttest.Service) []nft.Element,
	withEndpoints func(nfttest.Service)) []nft.Op {
	var cipEls, hpEls, noEpEls, sipEls []nft.Element
	for _, s := range svcs {
		cipEls = append(cipEls, nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP)}})
		if len(s.Backends) == 0 {
			noEpEls = append(noEpEls, nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)},
				Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "reject-chain"}})
			continue
		}
		if withEndpoints != nil {
			withEndpoints(s)
		}
		if dispatch != nil {
			sipEls = append(sipEls, dispatch(s)...)
		}
		hpEls = append(hpEls, costHairpin(s.Backends)...)
	}
	ops := []nft.Op{{Kind: nft.OpAddElements, Set: rs.Sets["cluster-ips"], Elements: cipEls}}
	if dispatch != nil {
		ops = append(ops, nft.Op{Kind: nft.OpAddElements, Set: rs.Sets["service-ips"], Elements: sipEls})
	}
	return append(ops,
		nft.Op{Kind: nft.OpAddElements, Set: rs.Sets["hairpin-connections"], Elements: hpEls},
		nft.Op{Kind: nft.OpAddElements, Set: rs.Sets["no-endpoint-services"], Elements: noEpEls})
}

// addOps adds each op in turn.
func (b *batch) addOps(ops []nft.Op) error {
	for _, op := range ops {
		if err := b.addOp(op); err != nil {
			return err
		}
	}
	return nil
}
