package nftnl

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file writes and reads tables: NEWTABLE and DELTABLE, and the
// table dump.

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
	b.enc.Str(unix.NFTA_TABLE_NAME, b.table)
	b.enc.BE32(unix.NFTA_TABLE_FLAGS, flags)
	b.end(m)
}

// ensureTable writes a NEWTABLE without flags: it creates the table if it
// does not exist and leaves the flags of one that does alone, so that it
// is accepted whatever flags an earlier owner left.
func (b *batch) ensureTable() {
	m := b.begin(unix.NFT_MSG_NEWTABLE, flagCreate)
	b.enc.Str(unix.NFTA_TABLE_NAME, b.table)
	b.end(m)
}

func (b *batch) deleteTable() {
	m := b.begin(unix.NFT_MSG_DELTABLE, 0)
	b.enc.Str(unix.NFTA_TABLE_NAME, b.table)
	b.end(m)
	b.setIDs = map[string]uint32{}
}

// deleteTableNamed writes "add table; delete table" for another table of
// the family than the batch's.
func (b *batch) deleteTableNamed(name string) {
	table := b.table
	b.table = name
	b.ensureTable()
	b.deleteTable()
	b.table = table
}

// NFTA_TABLE_OWNER is not in golang.org/x/sys/unix.
const nftaTableOwner = 7 // NFTA_TABLE_OWNER

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
		var d nlcodec.Decoder
		d.Attrs(attrs, func(typ uint16, data []byte) {
			switch typ {
			case unix.NFTA_TABLE_NAME:
				t.name = nlcodec.String(data)
			case unix.NFTA_TABLE_FLAGS:
				t.flags = d.BE32(data)
			case unix.NFTA_TABLE_USE:
				t.use = d.BE32(data)
			case nftaTableOwner:
				t.owner = d.BE32(data)
			}
		})
		out = append(out, t)
		return d.Err()
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
