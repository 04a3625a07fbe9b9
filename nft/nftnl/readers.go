package nftnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
)

// Every commit moves the network namespace's ruleset generation, and a
// dump that spans one is interrupted (NLM_F_DUMP_INTR): nft, libnftables
// and our own Load then read everything again. The kernel does not say who
// is reading, but sock_diag does say, of every netlink socket, whether a
// dump is running on it (NDIAG_FLAG_CB_RUNNING, Linux 4.6). Sockets lists
// the NETLINK_NETFILTER sockets of other processes with that flag, so that
// the runner can wait for their reads (proxier/readers).

// Socket is a netfilter netlink socket of another process in this network
// namespace.
type Socket struct {
	// Inode identifies the socket while it is open.
	Inode uint32
	// PortID is its netlink port: the process id for the first socket a
	// process binds without choosing one.
	PortID uint32
	// Dumping: a dump (of nftables objects, or of conntrack entries) is
	// running on it.
	Dumping bool
}

// sock_diag's netlink request and answer (linux/netlink_diag.h), which
// golang.org/x/sys/unix does not define.
const (
	diagReqLen       = 20 // struct netlink_diag_req
	diagMsgLen       = 28 // struct netlink_diag_msg
	diagShowFlags    = 0x8
	diagAttrFlags    = 4 // NETLINK_DIAG_FLAGS
	diagFlagDumping  = 0x1
	diagMsgInodeOff  = 16
	diagMsgPortIDOff = 4
	// diagSeq is every request's sequence number: the lister's socket
	// has one request at a time under way.
	diagSeq = 1
)

// SocketLister lists the netfilter netlink sockets of other processes
// (Sockets). It is safe for concurrent use.
type SocketLister struct {
	mu   sync.Mutex
	conn *netlink.Conn
	buf  []byte
	// own are the inodes of this process's sockets, and foreign those
	// known to be another's: a socket is looked up in /proc/self/fd once.
	own, foreign map[uint32]bool
	ownFds       func() (map[uint32]bool, error)
}

// NewSocketLister opens a NETLINK_SOCK_DIAG socket in the network
// namespace open as netnsFd (0: the current one).
func NewSocketLister(netnsFd int) (*SocketLister, error) {
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: netnsFd})
	if err != nil {
		return nil, fmt.Errorf("open sock_diag socket: %w", err)
	}
	return &SocketLister{conn: c, buf: make([]byte, 64<<10), own: map[uint32]bool{}, foreign: map[uint32]bool{},
		ownFds: socketInodes}, nil
}

// Close closes the lister's socket.
func (l *SocketLister) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conn.Close()
}

// Sockets returns the NETLINK_NETFILTER sockets of this network namespace
// that belong to other processes.
func (l *SocketLister) Sockets() ([]Socket, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	all, err := l.dump()
	if err != nil {
		return nil, fmt.Errorf("list netfilter netlink sockets (sock_diag): %w", err)
	}
	out := all[:0]
	var fresh bool
	for _, s := range all {
		if !l.own[s.Inode] && !l.foreign[s.Inode] {
			fresh = true
		}
	}
	if fresh {
		if err := l.classify(all); err != nil {
			return nil, err
		}
	}
	seen := make(map[uint32]bool, len(all))
	for _, s := range all {
		seen[s.Inode] = true
		if l.foreign[s.Inode] && s.PortID != 0 { // port 0: the kernel's own
			out = append(out, s)
		}
	}
	forgetMissing(l.own, seen)
	forgetMissing(l.foreign, seen)
	return out, nil
}

// classify sorts the sockets not known yet into this process's and
// others', from the inodes of this process's open sockets.
func (l *SocketLister) classify(all []Socket) error {
	mine, err := l.ownFds()
	if err != nil {
		return fmt.Errorf("list this process's sockets: %w", err)
	}
	for _, s := range all {
		if mine[s.Inode] {
			l.own[s.Inode] = true
		} else if !l.own[s.Inode] {
			l.foreign[s.Inode] = true
		}
	}
	return nil
}

func forgetMissing(m, seen map[uint32]bool) {
	for ino := range m {
		if !seen[ino] {
			delete(m, ino)
		}
	}
}

// dump asks sock_diag for every NETLINK_NETFILTER socket with its flags.
func (l *SocketLister) dump() ([]Socket, error) {
	req := make([]byte, nlcodec.HeaderLen+diagReqLen)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], diagSeq)
	body := req[nlcodec.HeaderLen:]
	body[0] = unix.AF_NETLINK
	body[1] = unix.NETLINK_NETFILTER
	binary.NativeEndian.PutUint32(body[8:], diagShowFlags)
	if err := nlcodec.Send(l.conn, req); err != nil {
		return nil, err
	}
	var out []Socket
	for {
		n, err := nlcodec.Receive(l.conn, l.buf, true)
		if err != nil {
			return nil, err
		}
		done, err := nlcodec.DumpMessages(l.buf[:n], diagSeq, func(h nlcodec.Header, payload []byte) error {
			s, err := decodeDiagMsg(payload)
			if err != nil {
				return err
			}
			out = append(out, s)
			return nil
		})
		if err != nil || done {
			return out, err
		}
	}
}

// decodeDiagMsg decodes a struct netlink_diag_msg and its flags attribute.
func decodeDiagMsg(b []byte) (Socket, error) {
	if len(b) < diagMsgLen {
		return Socket{}, fmt.Errorf("%w: sock_diag message of %d bytes", nlcodec.ErrMalformed, len(b))
	}
	s := Socket{PortID: binary.NativeEndian.Uint32(b[diagMsgPortIDOff:]), Inode: binary.NativeEndian.Uint32(b[diagMsgInodeOff:])}
	var bad error
	err := nlcodec.Attrs(b[diagMsgLen:], func(typ uint16, data []byte) {
		if typ != diagAttrFlags {
			return
		}
		if len(data) < 4 {
			bad = fmt.Errorf("%w: sock_diag flags of %d bytes", nlcodec.ErrMalformed, len(data))
			return
		}
		s.Dumping = binary.NativeEndian.Uint32(data)&diagFlagDumping != 0
	})
	return s, errors.Join(err, bad)
}

// socketInodes returns the inodes of this process's open sockets.
func socketInodes() (map[uint32]bool, error) {
	const dir = "/proc/self/fd"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[uint32]bool{}
	for _, e := range entries {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		ino, ok := strings.CutPrefix(target, "socket:[")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSuffix(ino, "]"), 10, 32); err == nil {
			out[uint32(n)] = true
		}
	}
	return out, nil
}
