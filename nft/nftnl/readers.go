package nftnl

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
)

// Every commit moves the network namespace's ruleset generation, and a
// dump that spans one is interrupted (NLM_F_DUMP_INTR): nft, libnftables
// and our own Load then read everything again. The kernel does not say who
// is reading, but it does say, of every netlink socket, whether a dump is
// running on it: sock_diag's NDIAG_FLAG_CB_RUNNING (Linux 4.6, the
// netlink_diag module) and the Dump column of /proc/net/netlink (older
// than that, and always there). Sockets lists the NETLINK_NETFILTER
// sockets of other processes with that flag, so that the runner can wait
// for their reads (proxier/readers).

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
)

// listDeadline bounds one listing: the kernel answers from memory, so a
// listing that takes this long will not end, and the runner, which lists
// on its own goroutine, must not hang on it.
const listDeadline = time.Second

// procNetlink lists the netlink sockets of the reading thread's network
// namespace.
const procNetlink = "/proc/thread-self/net/netlink"

// Listing sources, for SocketLister.Source.
const (
	SourceSockDiag = "sock_diag"
	SourceProcFS   = "procfs"
)

// SocketLister lists the netfilter netlink sockets of other processes
// (Sockets), from sock_diag, or from /proc/net/netlink when sock_diag
// cannot be used (a kernel without netlink_diag, a sandbox that refuses
// the socket) and the lister is for the current network namespace. It is
// safe for concurrent use.
type SocketLister struct {
	mu sync.Mutex
	// dial opens the sock_diag socket; conn is nil until it worked, and
	// again after a listing failed: a socket with a reply left half read
	// is never read from again.
	dial func() (*netlink.Conn, error)
	conn *netlink.Conn
	seqs nlcodec.Seqs
	buf  []byte
	// proc is the fallback's path; empty for another namespace's lister.
	proc string
	// source is what the last listing that worked used.
	source string
	// own are the inodes of this process's sockets, and foreign those
	// known to be another's: a socket is looked up in /proc/self/fd once.
	own, foreign map[uint32]bool
	ownFds       func() (map[uint32]bool, error)
}

// NewSocketLister returns a lister of the network namespace open as
// netnsFd (0: the current one). It fails only when it has no way to list:
// sock_diag cannot be opened in another namespace.
func NewSocketLister(netnsFd int) (*SocketLister, error) {
	l := &SocketLister{buf: make([]byte, 64<<10), own: map[uint32]bool{}, foreign: map[uint32]bool{}, ownFds: socketInodes,
		dial: func() (*netlink.Conn, error) {
			c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, &netlink.Config{NetNS: netnsFd})
			if err != nil {
				return nil, fmt.Errorf("open sock_diag socket: %w", err)
			}
			return c, nil
		}}
	if netnsFd == 0 {
		l.proc = procNetlink
	}
	c, err := l.dial()
	if err != nil && l.proc == "" {
		return nil, err
	}
	l.conn = c
	return l, nil
}

// Close closes the lister's socket.
func (l *SocketLister) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return nil
	}
	err := l.conn.Close()
	l.conn = nil
	l.dial = func() (*netlink.Conn, error) { return nil, errors.New("sock_diag lister closed") }
	return err
}

// Source names what the last listing that worked read: SourceSockDiag or
// SourceProcFS; empty before one worked.
func (l *SocketLister) Source() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.source
}

// Sockets returns the NETLINK_NETFILTER sockets of this network namespace
// that belong to other processes.
func (l *SocketLister) Sockets() ([]Socket, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	all, source, err := l.list()
	if err != nil {
		return nil, fmt.Errorf("list netfilter netlink sockets: %w", err)
	}
	l.source = source
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
	// A socket that joined multicast groups is listed twice by some
	// kernels (from the table of bound sockets and from the groups').
	seen := make(map[uint32]bool, len(all))
	for _, s := range all {
		if seen[s.Inode] {
			continue
		}
		seen[s.Inode] = true
		if l.foreign[s.Inode] && s.PortID != 0 { // port 0: the kernel's own
			out = append(out, s)
		}
	}
	forgetMissing(l.own, seen)
	forgetMissing(l.foreign, seen)
	return out, nil
}

// list lists every NETLINK_NETFILTER socket of the namespace, from
// sock_diag if it works, from procfs otherwise.
func (l *SocketLister) list() ([]Socket, string, error) {
	var diagErr error
	if l.conn == nil {
		l.conn, diagErr = l.dial()
	}
	if l.conn != nil {
		all, err := l.dump()
		if err == nil {
			return all, SourceSockDiag, nil
		}
		diagErr = fmt.Errorf("sock_diag: %w", err)
		l.conn.Close()
		l.conn = nil
	}
	if l.proc == "" {
		return nil, "", diagErr
	}
	all, err := readProcNetlink(l.proc)
	if err != nil {
		return nil, "", errors.Join(diagErr, err)
	}
	return all, SourceProcFS, nil
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
// Each request has a sequence number of its own, and only replies that
// carry it are read: a reply to an earlier request still queued is
// skipped, not taken for this one's (a failed listing also closes the
// socket: a reply left half read is never read from again).
func (l *SocketLister) dump() ([]Socket, error) {
	seq, err := l.request()
	if err != nil {
		return nil, err
	}
	var out []Socket
	for {
		n, err := nlcodec.Receive(l.conn, l.buf, true)
		if err != nil {
			return nil, err
		}
		done, err := nlcodec.DumpMessages(l.buf[:n], seq, func(h nlcodec.Header, payload []byte) error {
			s, err := decodeDiagMsg(payload)
			if err != nil {
				return err
			}
			out = append(out, s)
			return nil
		})
		if err != nil {
			return nil, err
		}
		if done {
			return out, nil
		}
	}
}

// request sends a listing request, with a deadline for its answer, and
// returns its sequence number.
func (l *SocketLister) request() (uint32, error) {
	seq := l.seqs.Next(1)
	req := make([]byte, nlcodec.HeaderLen+diagReqLen)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], seq)
	body := req[nlcodec.HeaderLen:]
	body[0] = unix.AF_NETLINK
	body[1] = unix.NETLINK_NETFILTER
	binary.NativeEndian.PutUint32(body[8:], diagShowFlags)
	if err := l.conn.SetDeadline(time.Now().Add(listDeadline)); err != nil {
		return 0, err
	}
	return seq, nlcodec.Send(l.conn, req)
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

// readProcNetlink reads the NETLINK_NETFILTER sockets from a
// /proc/net/netlink listing.
func readProcNetlink(path string) ([]Socket, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseProcNetlink(b)
}

// parseProcNetlink parses /proc/net/netlink (net/netlink/af_netlink.c,
// netlink_seq_show): a header line, then per socket its address, protocol
// (Eth), port (Pid), groups, Rmem, Wmem, Dump (a dump runs on it), Locks,
// Drops and Inode.
func parseProcNetlink(b []byte) ([]Socket, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	col := map[string]int{}
	if sc.Scan() {
		for i, name := range strings.Fields(sc.Text()) {
			col[name] = i
		}
	}
	for _, name := range []string{"Eth", "Pid", "Dump", "Inode"} {
		if _, ok := col[name]; !ok {
			return nil, fmt.Errorf("%w: /proc/net/netlink has no %s column", nlcodec.ErrMalformed, name)
		}
	}
	var out []Socket
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != len(col) {
			return nil, fmt.Errorf("%w: /proc/net/netlink line %q", nlcodec.ErrMalformed, sc.Text())
		}
		var v [4]uint64
		for i, name := range []string{"Eth", "Pid", "Dump", "Inode"} {
			n, err := strconv.ParseUint(f[col[name]], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("%w: /proc/net/netlink %s %q", nlcodec.ErrMalformed, name, f[col[name]])
			}
			v[i] = n
		}
		if v[0] != unix.NETLINK_NETFILTER {
			continue
		}
		out = append(out, Socket{PortID: uint32(v[1]), Dumping: v[2] != 0, Inode: uint32(v[3])})
	}
	return out, sc.Err()
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
