package nftnl

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file reads and removes tables that are not nftproxy's: another
// proxy's leftovers (kube-proxy's "kube-proxy" tables, the KUBE-* chains
// iptables-nft keeps in "ip nat", "ip filter", …). Only names are read; no
// rule of another table is decoded, and nothing but DeleteTables writes.

// ChainRef names a chain of some table of a family.
type ChainRef struct {
	Table, Chain string
}

// ListTables returns the names of every table of family f, in the order
// the kernel lists them.
func (n *Netlink) ListTables(ctx context.Context, f nft.Family) ([]string, error) {
	var names []string
	err := n.foreignDump(ctx, fmt.Sprintf("list tables of family %s", f), func() error {
		tables, err := n.tables(f)
		names = names[:0]
		for _, t := range tables {
			names = append(names, t.name)
		}
		return err
	})
	return names, err
}

// ListChains returns every chain of every table of family f (one dump:
// without a table attribute the kernel lists the chains of all of them).
func (n *Netlink) ListChains(ctx context.Context, f nft.Family) ([]ChainRef, error) {
	var chains []ChainRef
	err := n.foreignDump(ctx, fmt.Sprintf("list chains of family %s", f), func() error {
		chains = chains[:0]
		return n.dump(unix.NFT_MSG_GETCHAIN, f, nil, func(attrs []byte) error {
			var c ChainRef
			var d nlcodec.Decoder
			d.Attrs(attrs, func(typ uint16, data []byte) {
				switch typ {
				case unix.NFTA_CHAIN_TABLE:
					c.Table = nlcodec.String(data)
				case unix.NFTA_CHAIN_NAME:
					c.Chain = nlcodec.String(data)
				}
			})
			chains = append(chains, c)
			return d.Err()
		})
	})
	return chains, err
}

// foreignDump runs dumps under the socket's lock and deadline, again if
// the ruleset changed while they ran (NLM_F_DUMP_INTR).
func (n *Netlink) foreignDump(ctx context.Context, what string, dumps func() error) error {
	wrap := func(err error) error { return fmt.Errorf("%s: %w", what, err) }
	return n.locked(ctx, wrap, func() error {
		return readUntilConsistent(ctx, nlcodec.Until(ctx, replyTimeout), dumps)
	})
}

// DeleteTables deletes the named tables of family f, with everything in
// them, in one batch the kernel commits all-or-nothing. A table that does
// not exist is no error: each is added, then deleted, as OpDeleteTable
// does with ours; the add carries no flags, so it changes nothing in a
// table that exists (a dormant one stays dormant until it is gone). A
// table owned by another process's socket (NFT_TABLE_F_OWNER) cannot be
// deleted: EPERM. nftproxy's own table is refused: Apply manages it.
func (n *Netlink) DeleteTables(ctx context.Context, f nft.Family, names []string) error {
	wrap := func(err error) error { return fmt.Errorf("delete tables %s %q: %w", f, names, err) }
	if len(names) == 0 {
		return nil
	}
	for _, name := range names {
		if name == nft.TableName || name == "" {
			return wrap(fmt.Errorf("refusing to delete table %q", name))
		}
	}
	return n.locked(ctx, wrap, func() error {
		b := encodeDeleteTables(f, names, n.seq.Next(0))
		n.seq.Next(len(b.owners))
		if _, err := n.send(b.enc.Buf); err != nil {
			return fmt.Errorf("send batch: %w", err)
		}
		res, err := n.readReplies(b)
		if err != nil {
			return err
		}
		if len(res.errs) > 0 {
			first := res.errs[0]
			what := "commit"
			if op := b.owners[first.index]; op >= 0 {
				what = "table " + names[op]
			}
			return fmt.Errorf("%s: %w", what, first.Err())
		}
		return nil
	})
}

// encodeDeleteTables is the batch of DeleteTables: BATCH_BEGIN, NEWTABLE
// and DELTABLE per name (owned by the name's index), and BATCH_END asking
// for the ACK the kernel sends after a successful commit.
func encodeDeleteTables(f nft.Family, names []string, firstSeq uint32) *batch {
	b := &batch{enc: encoder{nlcodec.Encoder{Buf: make([]byte, 0, 64+96*len(names))}}, family: f, firstSeq: firstSeq,
		owners: make([]int, 0, 2+2*len(names)), setIDs: map[string]uint32{}}
	b.op = -1
	b.control(unix.NFNL_MSG_BATCH_BEGIN, 0, 0)
	for i, name := range names {
		b.op = i
		for _, typ := range []uint16{unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE} {
			flags := uint16(0)
			if typ == unix.NFT_MSG_NEWTABLE {
				flags = flagCreate
			}
			m := b.begin(typ, flags)
			b.enc.Str(unix.NFTA_TABLE_NAME, name)
			b.end(m)
		}
	}
	b.op = -1
	b.control(unix.NFNL_MSG_BATCH_END, flagAck, 0)
	return b
}
