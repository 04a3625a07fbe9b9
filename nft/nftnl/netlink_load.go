package nftnl

import (
	"maps"
	"unsafe"

	"github.com/nftproxy/nftproxy/nft"

	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime/debug"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft/nlsock"
)

// This file reads table nftproxy back from the kernel (Netlink.Load) with
// nf_tables dump requests on the Apply socket: the table, its chains, its
// rules (only to count them and take the digest of the first, see
// digest.go), its sets and their elements.

var _ nft.Loader = (*Netlink)(nil)

// loadAttempts bounds the retries of a Load that raced with a change of
// the ruleset (by anyone: the generation moved, or a dump was interrupted).
const loadAttempts = 3

// errLoadRaced: the ruleset changed while it was being read.
var errLoadRaced = errors.New("the ruleset changed while it was read")

// Attributes and flags golang.org/x/sys/unix does not name
// (include/uapi/linux/netfilter/nf_tables.h).
const (
	nftaChainFlags     = 10 // NFTA_CHAIN_FLAGS
	nftaHookDevs       = 4  // NFTA_HOOK_DEVS
	nftaSetExpr        = 17 // NFTA_SET_EXPR
	nftaSetExpressions = 18 // NFTA_SET_EXPRESSIONS
	nftChainBase       = 1  // NFT_CHAIN_BASE, on every base chain
)

// setFlagsKnown are the set flags nftproxy writes (newSet); a set with
// others was written by someone else.
const setFlagsKnown = unix.NFT_SET_MAP | unix.NFT_SET_TIMEOUT | unix.NFT_SET_EVAL

// releaseAfterLoad is the number of elements from which Load returns the
// heap's free memory to the kernel once it has read the table: the dumps'
// messages are garbage by then, and the caller builds the whole desired
// state on top of what was read (a restart at 100,000 Services of 10
// endpoints reads 2.1 million elements).
const releaseAfterLoad = 500_000

func releaseAfterLargeLoad(rs *nft.Ruleset) {
	if rs == nil {
		return
	}
	n := 0
	for _, s := range rs.Sets {
		n += s.Elements.Len()
	}
	if n >= releaseAfterLoad {
		debug.FreeOSMemory()
	}
}

// Load implements Loader. It reads the kernel's state of table nftproxy in
// family f: about 0.4 s for 10,000 Services with 5 endpoints each
// (TestNetlinkRestart10k), most of it the kernel serialising rules only to
// count them and read the first one's digest (see loadRules). The reads
// are several dumps; they are repeated if the ruleset generation moved in
// between, so the result is one consistent state.
func (n *Netlink) Load(ctx context.Context, f nft.Family) (*nft.Ruleset, error) {
	wrap := func(err error) error { return fmt.Errorf("load table %s %s: %w", f, nft.TableName, err) }
	if err := ctx.Err(); err != nil {
		return nil, wrap(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil, wrap(errors.New("netlink socket closed"))
	}
	deadline := nlsock.Until(ctx, replyTimeout)
	stop, err := nlsock.Deadline(ctx, n.conn, deadline)
	if err != nil {
		return nil, wrap(err)
	}
	defer stop()
	for attempt := 1; ; attempt++ {
		rs, err := n.loadOnce(ctx, deadline, f)
		if err == nil {
			releaseAfterLargeLoad(rs)
			return rs, nil
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		}
		if !errors.Is(err, errLoadRaced) || attempt == loadAttempts {
			return nil, wrap(err)
		}
	}
}

// buildsOn reports whether a table with flags can be changed in place: a
// dormant table (or one with flags we never set) is not what incremental
// transactions expect, and a table to be owned must be persistent to be
// claimed (the kernel never adds the flag to a table that exists). Other
// tables are rewritten.
func (n *Netlink) buildsOn(flags uint32) bool {
	if n.owning {
		return flags&tablePersist != 0 && flags&^ownedFlags == 0
	}
	return flags == 0
}

// loadOnce claims the table if it is to be owned, then reads it once,
// between two generation reads. (Another family's claim, or anyone's
// commit, may interrupt a dump of the claim too: it is retried like the
// reading.)
func (n *Netlink) loadOnce(ctx context.Context, deadline time.Time, f nft.Family) (*nft.Ruleset, error) {
	if err := n.claimExisting(ctx, f); err != nil {
		return nil, err
	}
	gen, err := n.generation()
	if err != nil {
		return nil, err
	}
	rs, err := n.loadDumps(ctx, deadline, f)
	if err != nil {
		return nil, err
	}
	if after, err := n.generation(); err != nil {
		return nil, err
	} else if after != gen {
		return nil, errLoadRaced
	}
	return rs, nil
}

// tableInfo is a table as the kernel's table dump describes it.
type tableInfo struct {
	name              string
	flags, use, owner uint32 // owner: netlink port of the owning socket, 0: none
}

// tables dumps the tables of family f.
func (n *Netlink) tables(f nft.Family) ([]tableInfo, error) {
	var out []tableInfo
	err := n.dump(unix.NFT_MSG_GETTABLE, f, nil, func(attrs []byte) error {
		var t tableInfo
		forEachAttr(attrs, func(typ uint16, data []byte) {
			switch typ {
			case unix.NFTA_TABLE_NAME:
				t.name = cstr(data)
			case unix.NFTA_TABLE_FLAGS:
				t.flags = be32(data)
			case unix.NFTA_TABLE_USE:
				t.use = be32(data)
			case nftaTableOwner:
				t.owner = be32(data)
			}
		})
		out = append(out, t)
		return nil
	})
	return out, err
}

// tableFlags returns the flags of the table of family f, if it exists.
func (n *Netlink) tableFlags(f nft.Family) (found bool, flags uint32, err error) {
	tables, err := n.tables(f)
	if err != nil {
		return false, 0, fmt.Errorf("dump tables: %w", err)
	}
	for _, t := range tables {
		if t.name == nft.TableName {
			return true, t.flags, nil
		}
	}
	return false, 0, nil
}

// claimExisting claims the table for this socket before it is read back,
// when it is to be owned and can be claimed: then nobody can change it
// between the reading and the transaction diffed against it. A table owned
// by a running process is refused (EPERM).
func (n *Netlink) claimExisting(ctx context.Context, f nft.Family) error {
	if !n.owning || n.claimed {
		return nil
	}
	found, flags, err := n.tableFlags(f)
	if err != nil || !found || !n.buildsOn(flags) {
		return err
	}
	return n.apply(ctx, &nft.Transaction{Family: f})
}

func (n *Netlink) loadDumps(ctx context.Context, deadline time.Time, f nft.Family) (*nft.Ruleset, error) {
	found, flags, err := n.tableFlags(f)
	if err != nil {
		return nil, err
	}
	if !found || !n.buildsOn(flags) {
		return nil, nil
	}
	rs := nft.NewRuleset(f)
	if err := n.dump(unix.NFT_MSG_GETCHAIN, f, nil, func(attrs []byte) error {
		if c := decodeChain(attrs); c != nil {
			rs.Chains[c.Name] = c
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dump chains: %w", err)
	}
	tableAttr := func(typ uint16) func(*encoder) {
		return func(e *encoder) { e.str(typ, nft.TableName) }
	}
	if err := n.dump(unix.NFT_MSG_GETSET, f, tableAttr(unix.NFTA_SET_TABLE), func(attrs []byte) error {
		if s := decodeSet(f, attrs); s != nil {
			rs.Sets[s.Name] = s
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("dump sets: %w", err)
	}
	// The rules and the elements are read by two sockets at once: the
	// kernel does a dump's work in the reader's context, so the second
	// socket puts it on the other core. Each job touches its own objects
	// (a chain's Loaded, a set's elements). The largest sets go first.
	jobs := loadJobs(rs)
	queue := make(chan func(*Netlink) error, len(jobs))
	for _, j := range jobs {
		queue <- j
	}
	close(queue)
	work := func(on *Netlink) error {
		for j := range queue {
			if err := j(on); err != nil {
				for range queue { // drain: the other worker stops too
				}
				return err
			}
		}
		return nil
	}
	helped := make(chan error, 1)
	if other, stop, err := n.loadHelper(ctx, deadline); err == nil {
		go func() {
			defer other.Close()
			defer stop()
			helped <- work(other)
		}()
	} else {
		helped <- nil // no second socket: this one does it all
	}
	err = work(n)
	if herr := <-helped; err == nil {
		err = herr
	}
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// loadJobs are the dumps that fill in rs once its chains and sets are
// known: each set's elements (but the dynamic sets'), the plain sets
// (hash tables, read back in O(n²)) before the endpoints maps (many small
// ones), then each chain's rules (see loadRules).
func loadJobs(rs *nft.Ruleset) []func(*Netlink) error {
	f := rs.Family
	var jobs []func(*Netlink) error
	for _, maps := range []bool{false, true} {
		for _, name := range rs.SortedSetNames() {
			s := rs.Sets[name]
			if s.Dynamic || s.Key == nil || (s.Endpoints != 0) != maps {
				continue // filled by the packet path, not ours to read, or not in this pass
			}
			jobs = append(jobs, func(on *Netlink) error { return on.loadElements(f, s) })
		}
	}
	for _, name := range slices.Sorted(maps.Keys(rs.Chains)) {
		c := rs.Chains[name]
		jobs = append(jobs, func(on *Netlink) error {
			if err := on.loadRules(f, c); err != nil {
				return fmt.Errorf("dump rules: %w", err)
			}
			return nil
		})
	}
	return jobs
}

// loadElements reads the elements of set s, closing the ranges of an
// endpoints map.
func (n *Netlink) loadElements(f nft.Family, s *nft.Set) error {
	req := func(e *encoder) {
		e.str(unix.NFTA_SET_ELEM_LIST_TABLE, nft.TableName)
		e.str(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
	}
	var ends []uint32
	var sc elementScratch
	if err := n.dump(unix.NFT_MSG_GETSETELEM, f, req, func(attrs []byte) error {
		return decodeElements(f, s, attrs, &ends, &sc)
	}); err != nil {
		return fmt.Errorf("dump elements of set %s: %w", s.Name, err)
	}
	if s.Endpoints != 0 {
		if err := closeRanges(s, ends); err != nil {
			return fmt.Errorf("elements of set %s: %w", s.Name, err)
		}
	}
	return nil
}

// loadHelper opens a second socket on the same namespace for Load, with
// Load's deadline and cancellation.
func (n *Netlink) loadHelper(ctx context.Context, deadline time.Time) (*Netlink, func() bool, error) {
	other, err := NewNetlink(n.opts)
	if err != nil {
		return nil, nil, err
	}
	stop, err := nlsock.Deadline(ctx, other.conn, deadline)
	if err != nil {
		other.Close()
		return nil, nil, err
	}
	return other, stop, nil
}

// loadRules counts the rules of chain c and takes the digest from the
// first, with a dump of its own. A dump of the whole table costs the
// kernel O(rules²): every resumed dump callback walks the table's rules
// from the first to where it stopped (490 ms for 50,000 rules, 32 KiB per
// callback); per chain it is linear (about 25 µs for a chain of 5 rules,
// most of it the kernel serialising their expressions).
func (n *Netlink) loadRules(f nft.Family, c *nft.Chain) error {
	req := func(e *encoder) {
		e.str(unix.NFTA_RULE_TABLE, nft.TableName)
		e.str(unix.NFTA_RULE_CHAIN, c.Name)
	}
	if err := n.dump(unix.NFT_MSG_GETRULE, f, req, func(attrs []byte) error {
		first := c.Loaded.Count == 0
		forEachAttr(attrs, func(typ uint16, data []byte) {
			switch {
			case typ == unix.NFTA_RULE_USERDATA && first:
				c.Loaded.Digest, c.Loaded.HasDigest = ruleDigest(data)
			case typ == unix.NFTA_RULE_EXPRESSIONS:
				if s, ok := exprsSlot(data); ok {
					c.Loaded.Slots = append(c.Loaded.Slots, s)
				}
			}
		})
		c.Loaded.Count++
		return nil
	}); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: chain %s is gone", errLoadRaced, c.Name)
		}
		return fmt.Errorf("chain %s: %w", c.Name, err)
	}
	return nil
}

// exprsSlot finds the endpoints slot of a rule's expressions: a numgen
// random mod EndpointBuckets whose offset starts a slot, then a lookup,
// as lowerDNATMap writes them.
func exprsSlot(exprs []byte) (nft.EndpointsSlot, bool) {
	var s nft.EndpointsSlot
	numgen, found := false, false
	forEachAttr(exprs, func(_ uint16, expr []byte) {
		var name, data []byte
		forEachAttr(expr, func(t uint16, d []byte) {
			switch t {
			case unix.NFTA_EXPR_NAME:
				name = d
			case unix.NFTA_EXPR_DATA:
				data = d
			}
		})
		switch cstr(name) {
		case "numgen":
			mod, offset := uint32(0), uint32(0)
			forEachAttr(data, func(t uint16, d []byte) {
				switch t {
				case unix.NFTA_NG_MODULUS:
					mod = be32(d)
				case unix.NFTA_NG_OFFSET:
					offset = be32(d)
				}
			})
			numgen = mod == nft.EndpointBuckets && offset%nft.EndpointBuckets == 0 && offset/nft.EndpointBuckets < nft.EndpointsSlots
			s.Slot = uint16(offset / nft.EndpointBuckets)
		case "lookup":
			if numgen && !found {
				forEachAttr(data, func(t uint16, d []byte) {
					if t == unix.NFTA_LOOKUP_SET {
						s.Map, found = cstr(d), true
					}
				})
			}
		}
	})
	return s, found
}

// decodeChain decodes a NEWCHAIN of a chain dump; nil if the chain is not
// in our table.
func decodeChain(attrs []byte) *nft.Chain {
	var table, name, typ []byte
	var hook []byte
	policy, flags := uint32(nfAccept), uint32(0)
	forEachAttr(attrs, func(t uint16, data []byte) {
		switch t {
		case unix.NFTA_CHAIN_TABLE:
			table = data
		case unix.NFTA_CHAIN_NAME:
			name = data
		case unix.NFTA_CHAIN_TYPE:
			typ = data
		case unix.NFTA_CHAIN_HOOK:
			hook = data
		case unix.NFTA_CHAIN_POLICY:
			policy = be32(data)
		case nftaChainFlags:
			flags = be32(data)
		}
	})
	if cstr(table) != nft.TableName {
		return nil
	}
	c := &nft.Chain{Name: cstr(name), Loaded: &nft.LoadedRules{}}
	if flags&^nftChainBase != 0 {
		c.Loaded.Foreign = true
	}
	if hook == nil {
		return c
	}
	c.Base = &nft.BaseChain{Type: nft.ChainType(cstr(typ))}
	var num uint32
	var dev bool
	forEachAttr(hook, func(t uint16, data []byte) {
		switch t {
		case unix.NFTA_HOOK_HOOKNUM:
			num = be32(data)
		case unix.NFTA_HOOK_PRIORITY:
			c.Base.Priority = int32(be32(data))
		case unix.NFTA_HOOK_DEV, nftaHookDevs:
			dev = true
		}
	})
	c.Base.Hook = hookName(num)
	if policy != nfAccept || dev || c.Base.Hook == "" {
		c.Loaded.Foreign = true
	}
	return c
}

func hookName(num uint32) nft.Hook {
	for h, n := range hookNum {
		if n == num {
			return h
		}
	}
	return ""
}

// decodeSet decodes a NEWSET of a set dump. A set nftproxy could not have
// written (flags, types or attributes it never uses) comes back with a nil
// Key: it equals no set nftproxy wants.
func decodeSet(f nft.Family, attrs []byte) *nft.Set {
	var table, name, ud []byte
	var flags, keyType, keyLen, dataType, dataLen uint32
	var desc []byte
	foreign := false
	s := &nft.Set{}
	forEachAttr(attrs, func(t uint16, data []byte) {
		switch t {
		case unix.NFTA_SET_TABLE:
			table = data
		case unix.NFTA_SET_NAME:
			name = data
		case unix.NFTA_SET_FLAGS:
			flags = be32(data)
		case unix.NFTA_SET_KEY_TYPE:
			keyType = be32(data)
		case unix.NFTA_SET_KEY_LEN:
			keyLen = be32(data)
		case unix.NFTA_SET_DATA_TYPE:
			dataType = be32(data)
		case unix.NFTA_SET_DATA_LEN:
			dataLen = be32(data)
		case unix.NFTA_SET_TIMEOUT:
			if len(data) == 8 {
				s.Timeout = time.Duration(binary.BigEndian.Uint64(data)) * time.Millisecond
			}
		case unix.NFTA_SET_DESC:
			desc = data
		case unix.NFTA_SET_USERDATA:
			ud = data
		case unix.NFTA_SET_OBJ_TYPE, nftaSetExpr, nftaSetExpressions:
			foreign = true
		}
	})
	if cstr(table) != nft.TableName || flags&unix.NFT_SET_ANONYMOUS != 0 {
		// An anonymous set belongs to the (foreign) rule that uses it and
		// goes with it when its chain is rewritten.
		return nil
	}
	s.Name = cstr(name)
	s.Dynamic = flags&unix.NFT_SET_EVAL != 0
	forEachAttr(desc, func(t uint16, data []byte) {
		if t == unix.NFTA_SET_DESC_SIZE {
			s.Size = be32(data)
		}
	})
	s.Comment = setComment(ud)
	if foreign {
		return s
	}
	if flags&(unix.NFT_SET_INTERVAL|nftSetConcat) != 0 {
		// Only an endpoints map has either; the kernel reports no
		// NFT_SET_CONCAT for nft's own concatenated interval sets, but
		// NFTA_SET_DESC_CONCAT, which decodeEndpointsMap refuses.
		decodeEndpointsMap(f, s, flags, keyType, keyLen, dataType, dataLen, desc, ud)
		return s
	}
	if flags&^setFlagsKnown != 0 {
		return s
	}
	key, ok := decodeTypes(keyType, keyLen)
	if !ok {
		return s
	}
	if flags&unix.NFT_SET_MAP != 0 {
		switch data, ok := decodeTypes(dataType, dataLen); {
		case dataType == unix.NFT_DATA_VERDICT:
			s.Data = []nft.DataType{nft.TypeVerdict}
		case ok:
			s.Data = data
		default:
			return s
		}
	}
	s.Key = key
	return s
}

// decodeEndpointsMap makes s the endpoints map the attributes describe, if
// they are exactly what newSet writes for one; else s keeps a nil Key.
func decodeEndpointsMap(f nft.Family, s *nft.Set, flags, keyType, keyLen, dataType, dataLen uint32, desc, ud []byte) {
	if flags != unix.NFT_SET_MAP|unix.NFT_SET_INTERVAL {
		return
	}
	concat := false
	forEachAttr(desc, func(t uint16, _ []byte) {
		if t == nftaSetDescConcat {
			concat = true
		}
	})
	if concat {
		return
	}
	// The userdata without its comment names the protocol.
	var rest []byte
	for b := ud; len(b) >= 2 && 2+int(b[1]) <= len(b); b = b[2+int(b[1]):] {
		if b[0] != udataSetComment {
			rest = append(rest, b[:2+int(b[1])]...)
		}
	}
	for _, proto := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
		if !bytes.Equal(rest, endpointsUserdata(f, proto)) {
			continue
		}
		want := nft.NewEndpointsMap(f, s.Name, proto)
		if keyType == typeMagic(want.Key) && keyLen == uint32(tupleLen(want.Key)) &&
			dataType == typeMagic(want.Data) && dataLen == uint32(tupleLen(want.Data)) {
			s.Key, s.Data, s.Endpoints = want.Key, want.Data, proto
		}
		return
	}
}

// setComment returns the comment of a set's userdata (see setUserdata).
func setComment(ud []byte) string {
	for len(ud) >= 2 && 2+int(ud[1]) <= len(ud) {
		if n := int(ud[1]); ud[0] == udataSetComment && n > 0 {
			return cstr(ud[2 : 2+n])
		}
		ud = ud[2+int(ud[1]):]
	}
	return ""
}

// knownTypes are the data types a set key or data field may have.
var knownTypes = []nft.DataType{nft.TypeInteger, nft.TypeIPv4Addr, nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeMark}

// decodeTypes inverts typeMagic: one type, or a concatenation of types
// concatTypeBits apiece; ok only if the length matches.
func decodeTypes(magic, length uint32) ([]nft.DataType, bool) {
	var fields []uint32
	for m := magic; m != 0; m >>= concatTypeBits {
		fields = append([]uint32{m & (1<<concatTypeBits - 1)}, fields...)
	}
	if len(fields) == 0 {
		return nil, false
	}
	ts := make([]nft.DataType, len(fields))
	for i, m := range fields {
		found := false
		for _, t := range knownTypes {
			if t.Magic == m {
				ts[i], found = t, true
			}
		}
		if !found {
			return nil, false
		}
	}
	return ts, tupleLen(ts) == int(length)
}

// decodeElements adds the elements of a NEWSETELEM of an element dump to s;
// in an endpoints map, the keys of the elements that end ranges go to ends
// instead, and the range starts are added with the end openRange, which
// closeRanges replaces.
func decodeElements(f nft.Family, s *nft.Set, attrs []byte, ends *[]uint32, sc *elementScratch) error {
	var err error
	forEachAttr(attrs, func(t uint16, list []byte) {
		if t != unix.NFTA_SET_ELEM_LIST_ELEMENTS || err != nil {
			return
		}
		forEachAttr(list, func(_ uint16, elem []byte) {
			if err != nil {
				return
			}
			var e nft.Element
			var end bool
			if e, end, err = decodeElement(f, s, elem, sc); err == nil {
				if end {
					*ends = append(*ends, e.Key[0].Int)
					return
				}
				if s.Endpoints != 0 {
					e.End = openRange
				}
				s.Elements.Put(e)
			}
		})
	})
	return err
}

// openRange is the end a range start of an endpoints map has while Load
// reads the map: a placeholder, so that its packed value has room for the
// end closeRanges writes in place.
const openRange = ^uint32(0)

// closeRanges gives each range start of an endpoints map its end: the
// smallest end key above it, less one. Every end must close a range. The
// ends are written into the values in place: a million ranges at 100,000
// Services, which a packed copy of each would leave as garbage in the
// slab and in the heap.
func closeRanges(s *nft.Set, ends []uint32) error {
	slices.Sort(ends)
	used := 0
	err := s.Elements.SetEnds(func(e *nft.Element) (uint32, error) {
		i, _ := slices.BinarySearch(ends, e.Key[0].Int+1)
		if i == len(ends) {
			return 0, fmt.Errorf("range %s has no end", s.KeyString(e.Key))
		}
		e.End = ends[i] - 1
		used++
		return e.End, nft.CheckRange(s, *e)
	})
	if err != nil {
		return err
	}
	if used != len(ends) {
		return fmt.Errorf("%d range starts, %d ends", used, len(ends))
	}
	return nil
}

// elementScratch is the space decodeElements decodes each element in,
// before the set packs and copies it (Elements.Put): reading a table back
// allocates nothing per element but the set's own growth.
type elementScratch struct {
	key, data [8]nft.Datum
	verdict   nft.Verdict
}

// decodeElement decodes one element into sc, where it stays until the next
// (its comment is a view of attrs); end reports an endpoints map's element
// that ends a range (its Key alone is set).
func decodeElement(f nft.Family, s *nft.Set, attrs []byte, sc *elementScratch) (e nft.Element, end bool, err error) {
	var key, data, ud []byte
	var flags uint32
	forEachAttr(attrs, func(t uint16, d []byte) {
		switch t {
		case unix.NFTA_SET_ELEM_KEY:
			key = d
		case unix.NFTA_SET_ELEM_FLAGS:
			flags = be32(d)
		case unix.NFTA_SET_ELEM_DATA:
			data = d
		case unix.NFTA_SET_ELEM_USERDATA:
			ud = d
		}
	})
	ints := s.Endpoints != 0 // in network byte order, see encodeKey
	if e.Key, err = decodeTupleOrder(sc.key[:0], f, s.Key, dataValue(key), ints); err != nil {
		return e, false, fmt.Errorf("element key: %w", err)
	}
	if s.Endpoints != 0 && flags&unix.NFT_SET_ELEM_INTERVAL_END != 0 {
		return e, true, nil
	}
	switch {
	case s.IsVerdictMap():
		forEachAttr(data, func(t uint16, d []byte) {
			if t == unix.NFTA_DATA_VERDICT {
				sc.verdict = decodeVerdict(d)
				e.Verdict = &sc.verdict
			}
		})
		if e.Verdict == nil {
			return e, false, fmt.Errorf("element %s: no verdict", s.KeyString(e.Key))
		}
	case s.IsMap():
		if e.Data, err = decodeTupleOrder(sc.data[:0], f, s.Data, dataValue(data), false); err != nil {
			return e, false, fmt.Errorf("element %s: data: %w", s.KeyString(e.Key), err)
		}
	}
	for len(ud) >= 2 && 2+int(ud[1]) <= len(ud) {
		if n := int(ud[1]); ud[0] == udataElemComment && n > 0 {
			e.Comment = view(trimNUL(ud[2 : 2+n]))
		}
		ud = ud[2+int(ud[1]):]
	}
	return e, false, nil
}

// dataValue returns NFTA_DATA_VALUE from a struct nft_data nest.
func dataValue(nest []byte) []byte {
	var v []byte
	forEachAttr(nest, func(t uint16, d []byte) {
		if t == unix.NFTA_DATA_VALUE {
			v = d
		}
	})
	return v
}

// decodeVerdict decodes NFTA_DATA_VERDICT. A code nftproxy never writes
// comes back as a kind that equals no verdict of ours.
func decodeVerdict(attrs []byte) nft.Verdict {
	var v nft.Verdict
	code := int32(-1000)
	forEachAttr(attrs, func(t uint16, d []byte) {
		switch t {
		case unix.NFTA_VERDICT_CODE:
			code = int32(be32(d))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = cstr(d)
		}
	})
	for _, k := range []nft.VerdictKind{nft.VerdictAccept, nft.VerdictDrop, nft.VerdictReturn, nft.VerdictJump, nft.VerdictGoto} {
		if int32(verdictCode(k)) == code {
			v.Kind = k
			return v
		}
	}
	v.Kind = nft.VerdictKind(fmt.Sprintf("verdict(%d)", code))
	return v
}

// decodeTupleOrder inverts encodeTupleOrder, into the space of ds.
func decodeTupleOrder(ds []nft.Datum, f nft.Family, ts []nft.DataType, b []byte, intsBigEndian bool) ([]nft.Datum, error) {
	if len(b) != tupleLen(ts) {
		return nil, fmt.Errorf("%d bytes for a %d-byte value", len(b), tupleLen(ts))
	}
	ds = slices.Grow(ds[:0], len(ts))[:len(ts)]
	clear(ds)
	for i, t := range ts {
		v := b[:t.Len]
		switch t {
		case nft.TypeIPv4Addr:
			ds[i].Addr = netip.AddrFrom4([4]byte(v))
		case nft.TypeIPv6Addr:
			ds[i].Addr = netip.AddrFrom16([16]byte(v))
		case nft.TypeInetProto:
			ds[i].Int = uint32(v[0])
		case nft.TypeInetService:
			ds[i].Int = uint32(binary.BigEndian.Uint16(v))
		case nft.TypeInteger:
			if intsBigEndian {
				ds[i].Int = binary.BigEndian.Uint32(v)
			} else {
				ds[i].Int = binary.NativeEndian.Uint32(v)
			}
		case nft.TypeMark:
			ds[i].Int = binary.NativeEndian.Uint32(v)
		default:
			return nil, fmt.Errorf("cannot decode type %s", t.Name)
		}
		if len(ts) > 1 {
			b = b[pad4(t.Len):]
		} else {
			b = b[t.Len:]
		}
	}
	return ds, nil
}

// dump sends an nf_tables dump request (attrs writes its attributes, may be
// nil) and calls each with the attributes of every reply message, until
// the kernel's NLMSG_DONE. each must not keep the bytes it is given.
func (n *Netlink) dump(msgType uint16, f nft.Family, attrs func(*encoder), each func(attrs []byte) error) error {
	seq := n.nextSeqs(1)
	e := encoder{b: make([]byte, 0, 128)}
	m := e.beginMsg(unix.NFNL_SUBSYS_NFTABLES<<8|msgType, flagRequest|unix.NLM_F_DUMP, seq, uint8(f), 0)
	if attrs != nil {
		attrs(&e)
	}
	e.endMsg(m)
	if _, err := n.send(e.b); err != nil {
		return fmt.Errorf("send dump request: %w", err)
	}
	var first error
	for {
		msgs, err := n.receive(true)
		if errors.Is(err, unix.ENOBUFS) {
			continue // replies to an earlier batch were lost; a dump's are not
		}
		if err != nil {
			return fmt.Errorf("read dump: %w", err)
		}
		for _, r := range msgs {
			if r.seq != seq {
				continue // a late reply to an earlier request
			}
			if r.flags&unix.NLM_F_DUMP_INTR != 0 && first == nil {
				first = errLoadRaced
			}
			switch r.typ {
			case unix.NLMSG_ERROR:
				if r.errno != 0 {
					return r.errno
				}
			case unix.NLMSG_DONE:
				if len(r.data) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(r.data)); code < 0 {
						return unix.Errno(-code)
					}
				}
				return first
			default:
				if len(r.data) < 4 {
					return errors.New("short nf_tables message")
				}
				if err := each(r.data[4:]); err != nil && first == nil {
					first = err // keep reading up to NLMSG_DONE
				}
			}
		}
	}
}

// generation reads the ruleset's generation ID (NFT_MSG_GETGEN).
func (n *Netlink) generation() (uint32, error) {
	seq, err := n.sendSentinel()
	if err != nil {
		return 0, fmt.Errorf("request generation: %w", err)
	}
	for {
		msgs, err := n.receive(true)
		if errors.Is(err, unix.ENOBUFS) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read generation: %w", err)
		}
		for _, m := range msgs {
			switch {
			case m.seq != seq:
			case m.typ == genReplyType:
				return parseGenID(m.data), nil
			case m.errno != 0:
				return 0, fmt.Errorf("read generation: %w", m.errno)
			}
		}
	}
}

// forEachAttr calls fn with the type (without the NESTED and BYTEORDER
// flags) and data of every attribute in b.
func forEachAttr(b []byte, fn func(typ uint16, data []byte)) {
	for len(b) >= nlaHeaderLen {
		l := int(binary.NativeEndian.Uint16(b))
		if l < nlaHeaderLen || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:])&^(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[nlaHeaderLen:l])
		b = b[min(pad4(l), len(b)):]
	}
}

func be32(b []byte) uint32 {
	if len(b) < 4 {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

// cstr returns a NUL-terminated string attribute as a string.
func cstr(b []byte) string { return string(trimNUL(b)) }

// trimNUL returns a string attribute without its NUL terminator; compare
// it as string(trimNUL(b)) == s, which does not allocate.
func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// view is a string sharing b's memory: the element's comment while the set
// copies it in (Elements.Put), without a copy of its own.
func view(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
