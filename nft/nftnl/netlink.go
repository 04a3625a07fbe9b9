package nftnl

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file holds the Netlink backend and its Apply. Load (load.go) reads
// the table back, rewrite (rewrite.go) replaces it whole; each object's
// encoder and decoder sit together (table.go, chain.go, rule.go, set.go,
// element.go), over internal/nlcodec's wire format.

// Netlink applies transactions to the kernel: each Transaction becomes one
// nfnetlink batch (BATCH_BEGIN … BATCH_END) written with a single sendmsg
// on one long-lived NETLINK_NETFILTER socket, which the kernel commits
// all-or-nothing. nftproxy encodes the messages and their expressions
// itself (batch.go, each object's file, expr.go), laid out as nft 1.0.6
// lays them out, rather than with google/nftables: v0.3.0 cannot write some of
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
// Asking for an ACK per message, as google/nftables v0.3.0 does, makes the
// kernel queue a reply per message: a large batch takes longer
// (TestNetlinkAckStrategies checks it) and its replies can overflow the
// receive buffer (the figures: docs/code-figures.md).
type Netlink struct {
	mu     sync.Mutex
	conn   *netlink.Conn
	seq    nlcodec.Seqs
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
	// ownErr is why the table is not owned though opts.OwnTable asked;
	// probed: decideOwnership asked the kernel.
	ownErr error
	probed bool
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
	// ReadOnly opens the socket for reading only, as `nftproxy diff`
	// does beside a running proxy: Apply refuses every transaction, and
	// Load reads the table whatever its flags (a table another nftproxy
	// owns, or a dormant one), where a proxy reads only a table it can
	// build on.
	ReadOnly bool
	// Rules makes Load decode every rule it reads into Chain.Rules (see
	// raise.go), beside the count and digest a proxy needs, for the
	// tools that show the kernel's rules.
	Rules bool
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

// add adds the figures of another batch of the same Apply.
func (s *BatchStats) add(o BatchStats) {
	s.Batches += o.Batches
	s.Ops += o.Ops
	s.Messages += o.Messages
	s.Bytes += o.Bytes
	s.Elements += o.Elements
	s.Replies += o.Replies
	s.Encode += o.Encode
	s.Kernel += o.Kernel
	s.KernelCPU += o.KernelCPU
	s.List += o.List
	s.GenID = o.GenID
	s.Confirmed = o.Confirmed
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
	conn, err := nlcodec.Dial(nlcodec.SocketOptions{NetNSFd: opts.NetNSFd, Acks: true, RcvBuf: rcvbuf, SndBuf: initialSndbuf})
	if err != nil {
		return nil, fmt.Errorf("open nftables netlink socket: %w", err)
	}
	return &Netlink{conn: conn, opts: opts, owning: opts.OwnTable && !opts.ReadOnly, sndbuf: initialSndbuf}, nil
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
// it but the kernel lacks what it takes (KernelFeatures; known from the
// first Load or Apply on), why not.
func (n *Netlink) Owning() (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.owning, n.ownErr
}

var _ nft.Backend = (*Netlink)(nil)

// LastCommit implements nft.Backend.
func (n *Netlink) LastCommit() nft.CommitStats {
	st := n.LastBatch()
	return nft.CommitStats{Bytes: st.Bytes, Encode: st.Encode, Kernel: st.Kernel, KernelCPU: st.KernelCPU, GenID: st.GenID}
}

// LastBatch returns the statistics of the last batch sent.
func (n *Netlink) LastBatch() BatchStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

// errReadOnly is Apply's answer on a socket opened ReadOnly.
var errReadOnly = errors.New("netlink socket opened read-only")

// locked runs request holding the socket, with ctx's deadline (at most
// replyTimeout) on it: the steps the requests that read or write on their
// own share. wrap names the request in the errors.
func (n *Netlink) locked(ctx context.Context, wrap func(error) error, request func() error) error {
	if err := ctx.Err(); err != nil {
		return wrap(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return wrap(errors.New("netlink socket closed"))
	}
	stop, err := nlcodec.Deadline(ctx, n.conn, nlcodec.Until(ctx, replyTimeout))
	if err != nil {
		return wrap(err)
	}
	defer stop()
	if err := request(); err != nil {
		return wrap(err)
	}
	return nil
}

// Apply implements Interface.
func (n *Netlink) Apply(ctx context.Context, tx *nft.Transaction) error {
	if tx.Empty() {
		return nil
	}
	wrap := func(err error) error { return fmt.Errorf("apply transaction (%d ops): %w", len(tx.Ops), err) }
	if n.opts.ReadOnly {
		return wrap(errReadOnly)
	}
	if err := ctx.Err(); err != nil {
		return wrap(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return wrap(errors.New("netlink socket closed"))
	}
	if n.owning && !n.probed {
		stop, err := nlcodec.Deadline(ctx, n.conn, nlcodec.Until(ctx, replyTimeout))
		if err != nil {
			return wrap(err)
		}
		n.decideOwnership()
		stop()
	}

	err := n.apply(ctx, tx)
	if err != nil && n.owning && errors.Is(err, errOwnedRefused) {
		// A kernel without NFT_TABLE_F_PERSIST (before 6.9), or
		// without NFT_TABLE_F_OWNER (before 5.12), refuses the flags
		// (KernelFeatures). An owned table that is not persistent would
		// die with the process, and traffic with it: do without.
		n.owning, n.ownErr = false, fmt.Errorf("the kernel refused an owned persistent table: %w", err)
		err = n.apply(ctx, tx)
	}
	if err != nil && errors.Is(err, unix.EPERM) {
		err = fmt.Errorf("%w: %w", err, n.ownedError(tx.Family))
	}
	if err != nil {
		return wrap(err)
	}
	return nil
}

// ownedError describes a refusal for a table another socket owns (with
// CAP_NET_ADMIN, the only EPERM nf_tables answers), naming the owner if a
// dump of the tables still shows one.
func (n *Netlink) ownedError(f nft.Family) *nft.TableOwnedError {
	e := &nft.TableOwnedError{Family: f}
	tables, err := n.tables(f)
	if err != nil {
		return e
	}
	for _, t := range tables {
		if t.name == nft.TableName && t.flags&tableOwner != 0 {
			e.Owner = t.owner
		}
	}
	return e
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
	first := n.seq.Next(0)
	opts.firstSeq = first
	buf := &batchBuffer{}
	defer buf.release()
	opts.buffer = buf.get
	b, err := encodeTransaction(tx, opts)
	if err != nil {
		return err
	}
	n.seq.Next(len(b.owners))
	n.last = BatchStats{Batches: 1, Ops: len(tx.Ops), Messages: len(b.owners), Bytes: len(b.enc.Buf),
		Elements: b.elements, Encode: time.Since(start)}

	// The kernel runs the batch inside sendmsg, which cannot be
	// interrupted; a cancellation stops the wait for the replies.
	stop, err := nlcodec.Deadline(ctx, n.conn, nlcodec.Until(ctx, replyTimeout))
	if err != nil {
		return err
	}
	defer stop()
	sent := time.Now()
	if n.last.KernelCPU, err = n.send(b.enc.Buf); err != nil {
		return fmt.Errorf("send batch of %d bytes: %w", len(b.enc.Buf), err)
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
	case refusesTableFlags(first.Errno) && setsTableFlags(tx, b.owners[first.index]) && opts.tableFlags != 0:
		err = fmt.Errorf("%w: %w", errOwnedRefused, err)
	case first.Errno == unix.ERESTART && first.index == 0 && opts.genID != 0:
		err = fmt.Errorf("%w: %w", errGenerationMoved, err)
	}
	return err
}

// errOwnedRefused: the kernel refused the flags of an owned table.
var errOwnedRefused = errors.New("owned table refused")

// refusesTableFlags says whether errno is a kernel's answer to table
// flags it does not know: EOPNOTSUPP from Linux 5.12 on (6.1 refuses
// NFT_TABLE_F_PERSIST so), EINVAL before (5.10 refuses
// NFT_TABLE_F_OWNER so).
func refusesTableFlags(errno unix.Errno) bool {
	return errno == unix.EOPNOTSUPP || errno == unix.EINVAL
}

// setsTableFlags reports whether the message of owner (an index into
// tx.Ops, or opClaim) is one that sets the table's flags.
func setsTableFlags(tx *nft.Transaction, owner int) bool {
	return owner == opClaim || (owner >= 0 && tx.Ops[owner].Kind == nft.OpResetTable)
}

// send writes buf with one sendmsg, growing the send buffer first if it
// would not fit; cpu is the CPU time the sending thread spent in sendmsg.
func (n *Netlink) send(buf []byte) (cpu time.Duration, err error) {
	if need := len(buf) + 64<<10; need > n.sndbuf {
		if err := nlcodec.SetBuffer(n.conn, unix.SO_SNDBUFFORCE, need); err != nil {
			return 0, err
		}
		n.sndbuf = need
	}
	runtime.LockOSThread() // the thread whose CPU time is read stays this one
	defer runtime.UnlockOSThread()
	before := threadCPU()
	err = nlcodec.Send(n.conn, buf)
	return threadCPU() - before, err
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
