package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"

	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft/nlsock"
)

// Netlink applies transactions to the kernel: each Transaction becomes one
// nfnetlink batch (BATCH_BEGIN … BATCH_END) written with a single sendmsg
// on one long-lived NETLINK_NETFILTER socket, which the kernel commits
// all-or-nothing. nftproxy encodes the messages and their expressions
// itself (netlink_encode.go, netlink_expr.go), laid out as nft 1.0.6 lays
// them out, rather than with google/nftables: v0.3.0 cannot write some of
// what nft writes (NFTA_BITWISE_OP; a set's data byte order and typeof
// userdata), allocates several times per expression, and its Flush asks for
// an ACK per message.
//
// Replies: no message of the batch asks for an ACK but BATCH_END, which the
// kernel ACKs only after a successful commit (Linux ≥ 6.10); every failing
// message is reported with its sequence number, which names the Op (and a
// failed commit with BATCH_BEGIN's). The kernel runs the whole batch inside
// our sendmsg, so when it returns every reply is queued: Apply drains the
// queue, then sends GETGEN and reads up to its reply (see readReplies).
// Asking for an ACK per message, as google/nftables v0.3.0 does, doubled
// the time of a 20,000-message batch and overflowed an 8 MiB receive
// buffer at 10,000 Services (TestNetlinkAckStrategies).
type Netlink struct {
	mu     sync.Mutex
	conn   *netlink.Conn
	seq    uint32
	sndbuf int
	rbuf   []byte // receive buffer, reused; replies are small (capped ACKs)
	last   BatchStats
	// ackEvery asks for an ACK on every message, as google/nftables does;
	// tests set it to compare the two ways.
	ackEvery bool
	opts     NetlinkOptions // what it was opened with (Load opens a second socket)
	// owning: the table is to be owned by this socket (opts.OwnTable, until
	// the kernel turned out not to support it); claimed: it is.
	owning, claimed bool
	// ownErr is why the table is not owned though opts.OwnTable asked.
	ownErr error
	// recreate makes a rewrite delete and recreate the table in its one
	// batch (add; delete; add), as it did before rewrite: tests set it to
	// show what that shape refuses.
	recreate bool
}

var _ nft.Interface = (*Netlink)(nil)

// NetlinkOptions configures NewNetlink.
type NetlinkOptions struct {
	// NetNSFd is an open file descriptor of the network namespace to
	// program; 0 means the current one.
	NetNSFd int
	// OwnTable makes the table owned by this socket and persistent
	// (NFT_TABLE_F_OWNER | NFT_TABLE_F_PERSIST, Linux 6.9): no other
	// process can change or delete it while nftproxy runs (`nft flush
	// ruleset` skips it), and it outlives nftproxy, ownerless, until the
	// next nftproxy claims it. On an older kernel the table is written
	// without flags (Owning reports it).
	OwnTable bool
}

// BatchStats describes the last batch Apply sent, or the batches of the
// last Apply: a rewrite that hands over sends three (see handover).
type BatchStats struct {
	Batches  int
	Ops      int // operations of the transaction
	Messages int // netlink messages, BATCH_BEGIN and BATCH_END included
	Bytes    int // bytes sent in the one sendmsg
	Elements int // set elements added or deleted
	Replies  int // replies to the batch (errors and ACKs) and to GETGEN
	Encode   time.Duration
	Kernel   time.Duration // from sendmsg to the sentinel's reply
	// KernelCPU is the CPU time of the thread that sent the batch, in
	// sendmsg: the kernel processes a batch there, in the sender's
	// context, so this is its work, and Kernel less this is mostly the
	// thread waiting for a CPU.
	KernelCPU time.Duration
	// List is the time a rewrite took to list the table's chains and
	// sets before its batch (see rewrite).
	List  time.Duration
	GenID uint32 // ruleset generation after the batch
	// Confirmed: the kernel ACKed BATCH_END, which it does only after a
	// successful commit (Linux ≥ 6.10, "nfnetlink: handle ACK flags for
	// batch messages"); older kernels ignore the flag and success is
	// inferred from the absence of errors.
	Confirmed bool
}

const (
	// Socket buffers. The send buffer must hold the whole batch (the kernel
	// refuses a sendmsg longer than sk_sndbuf - 32 with EMSGSIZE), so Apply
	// grows it to fit; the receive buffer must hold the replies (without
	// per-message ACKs: only errors).
	initialSndbuf = 4 << 20
	rcvbuf        = 8 << 20
	// replyTimeout bounds the wait for replies when ctx has no deadline.
	replyTimeout = 60 * time.Second
)

// NewNetlink opens the netlink socket.
func NewNetlink(opts NetlinkOptions) (*Netlink, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: opts.NetNSFd})
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink socket: %w", err)
	}
	n := &Netlink{conn: conn, opts: opts, owning: opts.OwnTable}
	if err := nlsock.Acks(conn); err != nil {
		conn.Close()
		return nil, err
	}
	if err := nlsock.SetBuffer(conn, unix.SO_RCVBUFFORCE, rcvbuf); err != nil {
		conn.Close()
		return nil, err
	}
	if err := nlsock.SetBuffer(conn, unix.SO_SNDBUFFORCE, initialSndbuf); err != nil {
		conn.Close()
		return nil, err
	}
	n.sndbuf = initialSndbuf
	return n, nil
}

// Close closes the socket.
func (n *Netlink) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil
	}
	err := n.conn.Close()
	n.conn = nil
	return err
}

// PortID is the netlink port of the socket that sends the batches: the
// kernel's change notifications name it as their sender (Monitor).
func (n *Netlink) PortID() uint32 {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return 0
	}
	return n.conn.PID()
}

// Owning reports whether the table is owned by this socket (or will be
// from the next transaction on), and if NetlinkOptions.OwnTable asked for
// it but the kernel refused, why not.
func (n *Netlink) Owning() (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.owning, n.ownErr
}

// LastBatch returns the statistics of the last batch sent.
func (n *Netlink) LastBatch() BatchStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

// Apply implements Interface.
func (n *Netlink) Apply(ctx context.Context, tx *nft.Transaction) error {
	if tx.Empty() {
		return nil
	}
	wrap := func(err error) error { return fmt.Errorf("apply transaction (%d ops): %w", len(tx.Ops), err) }
	if err := ctx.Err(); err != nil {
		return wrap(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return wrap(errors.New("netlink socket closed"))
	}

	err := n.apply(ctx, tx)
	if err != nil && n.owning && errors.Is(err, errOwnedRefused) {
		// A kernel without NFT_TABLE_F_PERSIST (before 6.9) refuses the
		// flags. An owned table that is not persistent would die with
		// the process, and traffic with it: do without.
		n.owning, n.ownErr = false, fmt.Errorf("the kernel refused an owned persistent table: %w", err)
		err = n.apply(ctx, tx)
	}
	if err != nil {
		return wrap(err)
	}
	return nil
}

// apply encodes tx, sends it and reads the replies. Unless the
// transaction recreates the table (OpResetTable, with the owned flags), a
// table to be owned is claimed by the first batch after the socket opened
// (an empty tx: only that). A rewrite (OpResetTable) goes through rewrite.
func (n *Netlink) apply(ctx context.Context, tx *nft.Transaction) error {
	var msgFlags uint16
	if n.ackEvery {
		msgFlags = flagAck
	}
	opts := batchOptions{msgFlags: msgFlags, endFlags: flagAck}
	reset := len(tx.Ops) > 0 && tx.Ops[0].Kind == nft.OpResetTable
	if n.owning {
		opts.tableFlags = ownedFlags
		opts.claim = !n.claimed && !reset && (len(tx.Ops) == 0 || tx.Ops[0].Kind != nft.OpDeleteTable)
	}
	if reset && !n.recreate {
		return n.rewrite(ctx, tx, opts)
	}
	return n.commit(ctx, tx, opts)
}

// commit encodes tx as one batch with opts, sends it and reads the
// replies.
func (n *Netlink) commit(ctx context.Context, tx *nft.Transaction, opts batchOptions) error {
	start := time.Now()
	first := n.nextSeqs(0)
	opts.firstSeq = first
	buf := &batchBuffer{}
	defer buf.release()
	opts.buffer = buf.get
	b, err := encodeTransaction(tx, opts)
	if err != nil {
		return err
	}
	n.seq = first + uint32(len(b.owners))
	n.last = BatchStats{Batches: 1, Ops: len(tx.Ops), Messages: len(b.owners), Bytes: len(b.enc.b),
		Elements: b.elements, Encode: time.Since(start)}

	// The kernel runs the batch inside sendmsg, which cannot be
	// interrupted; a cancellation stops the wait for the replies.
	stop, err := nlsock.Deadline(ctx, n.conn, nlsock.Until(ctx, replyTimeout))
	if err != nil {
		return err
	}
	defer stop()
	sent := time.Now()
	if n.last.KernelCPU, err = n.send(b.enc.b); err != nil {
		return fmt.Errorf("send batch of %d bytes: %w", len(b.enc.b), err)
	}
	res, err := n.readReplies(b)
	n.last.Kernel = time.Since(sent)
	n.last.Replies = res.replies
	n.last.GenID = res.genID
	n.last.Confirmed = res.confirmed
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		}
		return err
	}
	if len(res.errs) > 0 {
		return batchError(tx, b, res, opts)
	}
	if b.table != nft.TableName {
		return nil
	}
	switch {
	case len(tx.Ops) > 0 && tx.Ops[len(tx.Ops)-1].Kind == nft.OpDeleteTable:
		n.claimed = false
	case n.owning:
		n.claimed = true
	}
	return nil
}

// batchError is the error of a batch the kernel refused: the first
// message it refused, marked errOwnedRefused if that set the flags of an
// owned table, errGenerationMoved if the kernel refused the batch for
// the generation it carried.
func batchError(tx *nft.Transaction, b *batch, res replies, opts batchOptions) error {
	err := describeError(tx, b, res.errs)
	if res.overflow {
		err = fmt.Errorf("%w (more lost: receive buffer overflow)", err)
	}
	switch first := res.errs[0]; {
	case first.errno == unix.EOPNOTSUPP && setsTableFlags(tx, b.owners[first.index]) && opts.tableFlags != 0:
		err = fmt.Errorf("%w: %w", errOwnedRefused, err)
	case first.errno == unix.ERESTART && first.index == 0 && opts.genID != 0:
		err = fmt.Errorf("%w: %w", errGenerationMoved, err)
	}
	return err
}

// errOwnedRefused: the kernel refused the flags of an owned table.
var errOwnedRefused = errors.New("owned table refused")

// setsTableFlags reports whether the message of owner (an index into
// tx.Ops, or opClaim) is one that sets the table's flags.
func setsTableFlags(tx *nft.Transaction, owner int) bool {
	return owner == opClaim || (owner >= 0 && tx.Ops[owner].Kind == nft.OpResetTable)
}

// offHeapBatch is the size from which a batch is encoded into memory of
// its own (batchBuffer) instead of the Go heap.
const offHeapBatch = 1 << 20

// releaseBeforeBatch is the size from which the heap's free memory is
// returned to the kernel before the batch is mapped: a full sync of a
// large cluster maps its batch when the heap is fullest, and the peak RSS
// of the process is that heap, freed garbage included, plus the batch.
// At 100,000 Services of 10 endpoints (a 115 MiB batch) that garbage is
// ~100 MB; releasing it costs one garbage collection (~0.5 s there, 3 % of
// that sync). A full sync of 10,000 Services of 5 endpoints (9 MiB) stays
// below the threshold and pays nothing.
const releaseBeforeBatch = 32 << 20

// batchBuffer holds a large batch outside the Go heap, in an anonymous
// mapping unmapped as soon as Apply is done with it. In the heap, the
// batch of a full sync (10 MiB at 10,000 Services of 5 endpoints, 140 MiB
// at 100,000 of 10) counted twice toward the peak: as live memory while
// the sync's other data is live too, and in the heap goal the collector
// then grows to (GOGC). Nothing may keep a slice of it after Apply: the
// batch's bytes are only sent.
type batchBuffer struct{ region []byte }

func (bb *batchBuffer) get(n int) []byte {
	if n < offHeapBatch {
		return make([]byte, 0, n)
	}
	if n >= releaseBeforeBatch {
		// The batch comes on top of whatever the heap holds, the
		// garbage of building it included: return that to the kernel
		// first.
		debug.FreeOSMemory()
	}
	r, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return make([]byte, 0, n) // the heap will do
	}
	bb.region = r
	return r[:0]
}

// release unmaps the region. A batch that outgrew it was moved to the
// heap by append; the region is unmapped all the same.
func (bb *batchBuffer) release() {
	if bb.region != nil {
		_ = unix.Munmap(bb.region)
		bb.region = nil
	}
}

// nextSeqs reserves count sequence numbers and returns the first. Numbers
// restart at 1 long before uint32 would wrap (a batch has far fewer than
// 2³¹ messages); 0 is never used, replies with sequence 0 are not ours.
func (n *Netlink) nextSeqs(count int) uint32 {
	if n.seq == 0 || n.seq >= 1<<31 {
		n.seq = 1
	}
	first := n.seq
	n.seq += uint32(count)
	return first
}

// send writes buf with one sendmsg, growing the send buffer first if it
// would not fit; cpu is the CPU time the sending thread spent in sendmsg.
func (n *Netlink) send(buf []byte) (cpu time.Duration, err error) {
	if need := len(buf) + 64<<10; need > n.sndbuf {
		if err := nlsock.SetBuffer(n.conn, unix.SO_SNDBUFFORCE, need); err != nil {
			return 0, err
		}
		n.sndbuf = need
	}
	rc, err := n.conn.SyscallConn()
	if err != nil {
		return 0, err
	}
	var serr error
	runtime.LockOSThread() // the thread whose CPU time is read stays this one
	defer runtime.UnlockOSThread()
	werr := rc.Write(func(fd uintptr) bool {
		before := threadCPU()
		serr = unix.Sendmsg(int(fd), buf, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		cpu += threadCPU() - before
		return serr != unix.EAGAIN
	})
	if werr != nil {
		return cpu, werr
	}
	return cpu, serr
}

// threadCPU is the CPU time (user and system) of the calling thread; 0 if
// it cannot be read.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// msgError is the kernel's error for message index of a batch.
type msgError struct {
	index int
	errno unix.Errno
	msg   string // extended ACK message, if any
}

type replies struct {
	errs      []msgError
	replies   int
	genID     uint32
	confirmed bool
	overflow  bool // the receive queue overflowed: replies were lost
}

// readReplies collects the batch's replies. The kernel ran the whole batch
// inside our sendmsg, so they are all queued already (or were dropped if
// the receive queue overflowed): drain the queue without blocking. Then
// send a GETGEN request, whose reply comes after anything the batch
// produced and carries the generation the batch made; with the queue empty
// that reply cannot be dropped.
//
// An overflow (ENOBUFS) means lost replies. A batch asks for one ACK only
// (BATCH_END's), so a batch whose replies overflowed had errors: it failed.
func (n *Netlink) readReplies(b *batch) (replies, error) {
	var r replies
	for {
		msgs, err := n.receive(false)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if errors.Is(err, unix.ENOBUFS) {
			r.overflow = true
			continue
		}
		if err != nil {
			return r, fmt.Errorf("batch sent, outcome unknown: read replies: %w", err)
		}
		r.add(b, msgs)
	}
	sentinel, err := n.sendSentinel()
	if err != nil {
		return r, fmt.Errorf("batch sent; request generation: %w", err)
	}
	for r.genID == 0 {
		msgs, err := n.receive(true)
		if err != nil {
			return r, fmt.Errorf("batch sent; read generation: %w", err)
		}
		for _, m := range msgs {
			switch {
			case m.seq == sentinel && m.typ == genReplyType:
				r.replies++
				r.genID = parseGenID(m.data)
			case m.seq == sentinel && m.errno != 0:
				return r, fmt.Errorf("batch sent; request generation: %w", m.errno)
			default:
				r.add(b, []reply{m})
			}
		}
	}
	switch {
	case !r.overflow || len(r.errs) > 0:
		return r, nil
	case n.ackEvery && !r.confirmed:
		return r, errors.New("batch sent, outcome unknown: its ACKs overflowed the receive buffer")
	case n.ackEvery:
		return r, nil
	}
	return r, errors.New("batch failed: its error replies overflowed the receive buffer")
}

// add records the replies that belong to the batch: errors, and the ACK
// of BATCH_END. Others are late replies to an earlier batch.
func (r *replies) add(b *batch, msgs []reply) {
	for _, m := range msgs {
		if m.typ != unix.NLMSG_ERROR {
			continue
		}
		idx := int(m.seq - b.firstSeq)
		if idx < 0 || idx >= len(b.owners) {
			continue
		}
		r.replies++
		if m.errno == 0 {
			r.confirmed = r.confirmed || idx == len(b.owners)-1
		} else {
			r.errs = append(r.errs, msgError{idx, m.errno, m.extMsg})
		}
	}
}

// reply is one netlink message read back: an error or ACK (NLMSG_ERROR,
// errno 0 for an ACK) or a NEWGEN.
type reply struct {
	typ    uint16
	flags  uint16
	seq    uint32
	errno  unix.Errno
	extMsg string
	data   []byte // payload of a message other than NLMSG_ERROR
}

// receive reads one datagram and parses its messages; without block it
// returns EAGAIN when none is queued. It parses errors itself because
// mdlayher/netlink v1.11.2 cannot parse a capped extended ACK
// (NETLINK_CAP_ACK with NETLINK_EXT_ACK).
func (n *Netlink) receive(block bool) ([]reply, error) {
	rc, err := n.conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	if n.rbuf == nil {
		n.rbuf = make([]byte, 1<<16)
	}
	var nr int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		nr, _, rerr = unix.Recvfrom(int(fd), n.rbuf, unix.MSG_DONTWAIT)
		return !block || rerr != unix.EAGAIN
	}); err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	return parseReplies(n.rbuf[:nr])
}

// parseReplies splits a datagram into messages (include/uapi/linux/netlink.h:
// an NLMSG_ERROR carries the errno, the request's header, the request's
// payload unless NLM_F_CAPPED, and NLMSGERR_ATTR_* TLVs if NLM_F_ACK_TLVS).
func parseReplies(b []byte) ([]reply, error) {
	var out []reply
	for len(b) >= nlmsgHeaderLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < nlmsgHeaderLen || l > len(b) {
			return out, fmt.Errorf("malformed netlink message of %d bytes", l)
		}
		flags := binary.NativeEndian.Uint16(b[6:])
		m := reply{typ: binary.NativeEndian.Uint16(b[4:]), flags: flags, seq: binary.NativeEndian.Uint32(b[8:])}
		payload := b[nlmsgHeaderLen:l]
		if m.typ == unix.NLMSG_ERROR {
			if len(payload) < 4+nlmsgHeaderLen {
				return out, errors.New("short netlink error message")
			}
			m.errno = unix.Errno(-int32(binary.NativeEndian.Uint32(payload)))
			rest := payload[4+nlmsgHeaderLen:]
			if flags&unix.NLM_F_CAPPED == 0 {
				reqLen := int(binary.NativeEndian.Uint32(payload[4:])) - nlmsgHeaderLen
				rest = rest[min(max(reqLen, 0), len(rest)):]
			}
			if flags&unix.NLM_F_ACK_TLVS != 0 {
				m.extMsg = extAckMessage(rest)
			}
		} else {
			m.data = payload
		}
		out = append(out, m)
		b = b[min(pad4(l), len(b)):]
	}
	return out, nil
}

// extAckMessage returns NLMSGERR_ATTR_MSG from extended ACK TLVs.
func extAckMessage(tlvs []byte) string {
	ad, err := netlink.NewAttributeDecoder(tlvs)
	if err != nil {
		return ""
	}
	for ad.Next() {
		if ad.Type() == unix.NLMSGERR_ATTR_MSG {
			return ad.String()
		}
	}
	return ""
}

const genReplyType = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN

// sendSentinel sends NFT_MSG_GETGEN and returns its sequence number.
func (n *Netlink) sendSentinel() (uint32, error) {
	seq := n.nextSeqs(1)
	_, err := n.conn.Send(netlink.Message{
		Header: netlink.Header{
			Type:     netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags:    netlink.Request,
			Sequence: seq,
		},
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	return seq, err
}

// parseGenID reads NFTA_GEN_ID from a NEWGEN message.
func parseGenID(data []byte) uint32 {
	if len(data) < 4 {
		return 0
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return 0
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32()
		}
	}
	return 0
}

// describeError names the operation behind the first kernel error, e.g.
// `op 3 add-rule "svc-a" (rule "jump nowhere"): no such file or directory`.
func describeError(tx *nft.Transaction, b *batch, errs []msgError) error {
	first := errs[0]
	var what string
	switch op := b.owners[first.index]; {
	case op == opClaim:
		what = "claim table " + nft.TableName
	case op < 0 && first.index == 0:
		what = "commit"
	case op < 0:
		what = "batch end"
	default:
		o := tx.Ops[op]
		what = fmt.Sprintf("op %d %s %q", op, o.Kind, o.Target())
		if o.Kind == nft.OpAddRule {
			what += fmt.Sprintf(" (rule %q)", o.Rule.Text(tx.Family))
		}
	}
	if first.errno == unix.EPERM {
		// With CAP_NET_ADMIN, the only refusal is a table owned by
		// another socket (NFT_TABLE_F_OWNER).
		what += " (the table is owned by another running process)"
	}
	err := fmt.Errorf("%s: %w", what, first.errno)
	if first.msg != "" {
		err = fmt.Errorf("%w (kernel: %s)", err, first.msg)
	}
	if len(errs) > 1 {
		err = fmt.Errorf("%w (and %d more errors)", err, len(errs)-1)
	}
	return err
}
