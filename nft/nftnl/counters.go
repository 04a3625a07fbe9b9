package nftnl

import (
	"context"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file reads the counters of the elements of counted sets
// (nft.Set.Counter) for the traffic metrics: one dump of the table's sets,
// then one dump of each counted set's elements. Nothing else of the table
// is read, and nothing is kept between reads.

// NFTA_SET_ELEM_EXPRESSIONS (Linux 5.13) is not in golang.org/x/sys/unix.
const nftaSetElemExpressions = 11

// Counter is an element's counter: what matched the element since it was
// added.
type Counter struct{ Packets, Bytes uint64 }

// Add returns the sum of two counters.
func (c Counter) Add(o Counter) Counter { return Counter{c.Packets + o.Packets, c.Bytes + o.Bytes} }

// CountedElement is called by ReadCounters for each element of a counted
// set. The element (its key, value and comment) is valid only during the
// call. In an endpoints map it is the start of a range (Key[0] is its
// first bucket, End is not read).
type CountedElement func(set *nft.Set, e nft.Element, c Counter)

// ErrInterrupted is ReadCounters' error when a commit interrupted one of
// its dumps (NLM_F_DUMP_INTR): an element may have been missed or seen
// twice, so the caller drops what fn was given and reads again.
var ErrInterrupted = errLoadRaced

// ReadCounters calls fn for every element of every counted set of table
// nftproxy of family f, with its counter. A set declared without
// `counter`, one nftproxy did not write, and the elements that end ranges
// are left out. No table: no call and no error.
func (n *Netlink) ReadCounters(ctx context.Context, f nft.Family, fn CountedElement) error {
	return n.readCounters(ctx, f, nil, fn)
}

// ReadSetCounters is ReadCounters for the counted sets of these names
// only: the elements of the other sets, however many, are not read.
func (n *Netlink) ReadSetCounters(ctx context.Context, f nft.Family, names []string, fn CountedElement) error {
	return n.readCounters(ctx, f, names, fn)
}

// readCounters reads the counted sets named (nil: all).
func (n *Netlink) readCounters(ctx context.Context, f nft.Family, names []string, fn CountedElement) error {
	wrap := func(err error) error { return fmt.Errorf("read counters of table %s %s: %w", f, nft.TableName, err) }
	return n.locked(ctx, wrap, func() error {
		found, _, err := n.tableFlags(f)
		if err != nil || !found {
			return err
		}
		var counted []*nft.Set
		if err := n.dump(unix.NFT_MSG_GETSET, f, func(e *encoder) { e.Str(unix.NFTA_SET_TABLE, nft.TableName) }, func(attrs []byte) error {
			var d nlcodec.Decoder
			if s := decodeSet(&d, f, attrs); s != nil && s.Counter && s.Key != nil && (names == nil || slices.Contains(names, s.Name)) {
				counted = append(counted, s)
			}
			return d.Err()
		}); err != nil {
			return fmt.Errorf("dump sets: %w", err)
		}
		for _, s := range counted {
			if err := n.readSetCounters(f, s, fn); err != nil {
				return err
			}
		}
		return nil
	})
}

// readSetCounters dumps the elements of s with their counters.
func (n *Netlink) readSetCounters(f nft.Family, s *nft.Set, fn CountedElement) error {
	req := func(e *encoder) {
		e.Str(unix.NFTA_SET_ELEM_LIST_TABLE, nft.TableName)
		e.Str(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
	}
	var sc elementScratch
	err := n.dump(unix.NFT_MSG_GETSETELEM, f, req, func(attrs []byte) error {
		return walkElements(attrs, func(d *nlcodec.Decoder, elem []byte) error {
			e, end, err := decodeElement(d, f, s, elem, &sc)
			if err != nil || end {
				return err
			}
			if c, ok := elementCounter(d, elem); ok {
				fn(s, e, c)
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("dump elements of set %s: %w", s.Name, err)
	}
	return nil
}

// elementCounter returns the counter among an element's expressions: the
// kernel dumps one expression as NFTA_SET_ELEM_EXPR, several as a list in
// NFTA_SET_ELEM_EXPRESSIONS (net/netfilter/nf_tables_api.c,
// nft_set_elem_expr_dump).
func elementCounter(d *nlcodec.Decoder, attrs []byte) (Counter, bool) {
	var c Counter
	found := false
	expr := func(x []byte) {
		if exprName(d, x) != exprCounter {
			return
		}
		found = true
		d.Attrs(x, func(t uint16, data []byte) {
			if t != unix.NFTA_EXPR_DATA {
				return
			}
			d.Attrs(data, func(t uint16, v []byte) {
				switch t {
				case unix.NFTA_COUNTER_PACKETS:
					c.Packets = d.BE64(v)
				case unix.NFTA_COUNTER_BYTES:
					c.Bytes = d.BE64(v)
				}
			})
		})
	}
	d.Attrs(attrs, func(t uint16, v []byte) {
		switch t {
		case unix.NFTA_SET_ELEM_EXPR:
			expr(v)
		case nftaSetElemExpressions:
			d.Attrs(v, func(_ uint16, x []byte) { expr(x) })
		}
	})
	return c, found
}
