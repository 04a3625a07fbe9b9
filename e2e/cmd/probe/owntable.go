package main

// `probe own-table`: another process that takes an nftables table for itself, so that a
// test can make the kernel refuse nftproxy's transactions for real. It claims the table
// with the owner and persist flags (Linux 6.9: an ownerless persistent table, as nftproxy
// leaves its own when it stops, can be claimed by any socket), prints "owned", and holds it
// until SIGTERM or SIGINT; the table then stays, ownerless, for the next owner.

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Table flags, include/uapi/linux/netfilter/nf_tables.h.
const (
	tableOwner   = 0x2 // NFT_TABLE_F_OWNER
	tablePersist = 0x4 // NFT_TABLE_F_PERSIST
)

func ownTableMain(args []string) error {
	fs := flag.NewFlagSet("own-table", flag.ExitOnError)
	family := fs.String("family", "ip", "ip or ip6")
	table := fs.String("table", "", "the table's name (required)")
	fs.Parse(args)
	fam := map[string]uint8{"ip": unix.NFPROTO_IPV4, "ip6": unix.NFPROTO_IPV6}[*family]
	if fam == 0 || *table == "" {
		return fmt.Errorf("own-table needs --family ip|ip6 and --table")
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := claim(c, fam, *table); err != nil {
		return fmt.Errorf("claim %s %s: %w", *family, *table, err)
	}
	fmt.Println("owned")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// claim sends one batch: NEWTABLE name with the owner and persist flags.
func claim(c *netlink.Conn, family uint8, name string) error {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(unix.NFTA_TABLE_NAME, name)
	ae.Uint32(unix.NFTA_TABLE_FLAGS, tableOwner|tablePersist)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	control := func(typ netlink.HeaderType) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: typ, Flags: netlink.Request},
			Data: []byte{unix.AF_UNSPEC, 0, 0, unix.NFNL_SUBSYS_NFTABLES}}
	}
	msgs := []netlink.Message{
		control(unix.NFNL_MSG_BATCH_BEGIN),
		{Header: netlink.Header{Type: unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE,
			Flags: netlink.Request | netlink.Create | netlink.Acknowledge},
			Data: append([]byte{family, unix.NFNETLINK_V0, 0, 0}, attrs...)},
		control(unix.NFNL_MSG_BATCH_END),
	}
	if _, err := c.SendMessages(msgs); err != nil {
		return err
	}
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	// The ACK of the NEWTABLE, or its error.
	_, err = c.Receive()
	return err
}
