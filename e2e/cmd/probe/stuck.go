package main

// `probe stuck-reader`: a process that asks the kernel for a dump of an nftables set's
// elements, reads the first datagram of the answer and stops reading, as a frozen or traced
// process does, or `conntrack -L | less` waiting on its pager. The kernel keeps the dump
// open on the socket (sock_diag and /proc/net/netlink report it running) for as long as the
// socket lives. It prints "stuck" once the first datagram is read, then holds the socket
// until SIGTERM or SIGINT.

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

func stuckReaderMain(args []string) error {
	fs := flag.NewFlagSet("stuck-reader", flag.ExitOnError)
	family := fs.String("family", "ip", "ip or ip6")
	table := fs.String("table", "nftproxy", "the set's table")
	set := fs.String("set", "service-ips", "the set (or map) whose elements to dump")
	fs.Parse(args)
	fam := map[string]uint8{"ip": unix.NFPROTO_IPV4, "ip6": unix.NFPROTO_IPV6}[*family]
	if fam == 0 {
		return fmt.Errorf("stuck-reader needs --family ip|ip6")
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, *table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, *set)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	body := append([]byte{fam, unix.NFNETLINK_V0, 0, 0}, attrs...)
	req := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(body))
	binary.NativeEndian.PutUint32(req[0:], uint32(unix.NLMSG_HDRLEN+len(body)))
	binary.NativeEndian.PutUint16(req[4:], unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSETELEM)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], 1)
	req = append(req, body...)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("read the dump's first datagram: %w", err)
	}
	if err := dumpError(buf[:n]); err != nil {
		return fmt.Errorf("dump the elements of %s %s %s: %w", *family, *table, *set, err)
	}
	fmt.Println("stuck")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// dumpError returns the error a datagram of a dump carries, if it is one:
// NLMSG_ERROR (no such set), or NLMSG_DONE (the dump fitted in one
// datagram: nothing is left to hold the socket's dump open).
func dumpError(b []byte) error {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
					return syscall.Errno(-errno)
				}
			}
		case unix.NLMSG_DONE:
			return fmt.Errorf("the whole dump fitted in one datagram")
		}
	}
	return nil
}
