package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/metrics"
)

// Netlink reconciles the kernel's conntrack table over ctnetlink.
//
// It is our own ctnetlink code on mdlayher/netlink (the stack nft/ already
// uses), not github.com/vishvananda/netlink v1.3.1 (upstream kube-proxy's),
// which was measured against it on the same table (docs/code-figures.md):
//
//   - its ConntrackTableList allocates a *ConntrackFlow with net.IP slices
//     per flow; our Dump decodes flows in place;
//   - its ConntrackDeleteFilters, which upstream uses to delete, dumps the
//     whole table again and sends one delete per request, waiting for
//     each ACK. Our delete sends a batch per sendmsg and reads the ACKs
//     back; our reconcile costs one dump, upstream's two;
//   - it cannot ask the kernel to filter a dump (CTA_FILTER). With it,
//     flows of other protocols are walked but never serialized or copied,
//     so a node's TCP flows cost little (TestReconcile100k checks that a
//     filtered dump costs less than a full one). The kernel walks its
//     whole hash table (all namespaces) for every dump all the same.
//
// Every Reconcile opens its own socket (cheap, also when opened in another
// namespace, as tests do), so that the IPv4 and IPv6 reconciles may run
// at the same time and a cancelled dump never leaves half a dump queued
// for the next one.
type Netlink struct {
	opts NetlinkOptions
}

var _ Interface = (*Netlink)(nil)

// NetlinkOptions configures NewNetlink.
type NetlinkOptions struct {
	// NetNSFd is an open file descriptor of the network namespace whose
	// table to reconcile; 0 means the current one. It must stay open as
	// long as the Netlink is used.
	NetNSFd int
	// DeleteBatch is the number of deletions sent in one sendmsg;
	// 0 means defaultDeleteBatch.
	DeleteBatch int
	// NoMetrics leaves the Prometheus metrics alone (tests and
	// benchmarks).
	NoMetrics bool

	// noKernelFilter sends dumps without CTA_FILTER, as a kernel older
	// than 5.8 would ignore it (tests).
	noKernelFilter bool
}

const (
	// defaultDeleteBatch deletions per sendmsg: ~60 KiB of IPv6 requests,
	// and 512 capped ACKs, well inside rcvbuf (an ACK costs under 1 KiB
	// of it).
	defaultDeleteBatch = 512
	rcvbuf             = 4 << 20
	sndbuf             = 1 << 20
	// replyTimeout bounds a dump or a batch's ACKs when ctx has no deadline.
	replyTimeout = 60 * time.Second
)

// NewNetlink checks that ctnetlink can be opened (nf_conntrack loaded,
// CAP_NET_ADMIN held) and returns a Netlink.
func NewNetlink(opts NetlinkOptions) (*Netlink, error) {
	if opts.DeleteBatch <= 0 {
		opts.DeleteBatch = defaultDeleteBatch
	}
	n := &Netlink{opts: opts}
	s, err := n.open()
	if err != nil {
		return nil, err
	}
	s.close()
	return n, nil
}

// Reconcile implements Interface and observes
// kubeproxy_conntrack_reconciler_sync_duration_seconds and
// kubeproxy_conntrack_reconciler_deleted_entries_total when it did anything
// (callers must not observe them again).
func (n *Netlink) Reconcile(ctx context.Context, family Family, previous Frontends, current func() Frontends, isNodePortAddr func(netip.Addr) bool) (Result, error) {
	start := time.Now()
	protos := protocols(previous, current())
	if len(protos) == 0 {
		return Result{}, nil
	}
	res, err := n.reconcile(ctx, family, protos, previous, current, isNodePortAddr)
	res.Elapsed = time.Since(start)
	if !n.opts.NoMetrics {
		metrics.ReconcileConntrackFlowsLatency.WithLabelValues(family.String()).Observe(res.Elapsed.Seconds())
		metrics.ReconcileConntrackFlowsDeletedEntriesTotal.WithLabelValues(family.String()).Add(float64(res.Deleted))
	}
	if err != nil {
		return res, fmt.Errorf("reconcile %s conntrack flows: %w", family, err)
	}
	klog.V(4).InfoS("Reconciled conntrack flows", "ipFamily", family, "dumped", res.Dumped,
		"stale", res.Stale, "deleted", res.Deleted, "elapsed", res.Elapsed)
	return res, nil
}

func (n *Netlink) reconcile(ctx context.Context, family Family, protos []uint8, previous Frontends, current func() Frontends, isNodePortAddr func(netip.Addr) bool) (Result, error) {
	var res Result
	s, err := n.open()
	if err != nil {
		return res, err
	}
	defer s.close()
	t := time.Now()
	flows, err := s.dump(ctx, family, protos)
	res.Dump, res.Dumped = time.Since(t), len(flows)
	if err != nil {
		return res, err
	}
	t = time.Now()
	stale := Stale(flows, previous, current(), isNodePortAddr)
	res.Decide, res.Stale = time.Since(t), len(stale)
	t = time.Now()
	res.Deleted, err = s.delete(ctx, stale, n.opts.DeleteBatch)
	res.Delete = time.Since(t)
	return res, err
}

// Dump returns the flows of one family, only those of proto unless proto
// is 0; of TCP, only those never answered nor DNATed, as Reconcile asks
// for them. It is Reconcile's first step, exported for tests and
// debugging.
func (n *Netlink) Dump(ctx context.Context, family Family, proto uint8) ([]Flow, error) {
	s, err := n.open()
	if err != nil {
		return nil, err
	}
	defer s.close()
	if proto == 0 {
		return s.dumpOne(ctx, family, 0, nil)
	}
	return s.dump(ctx, family, []uint8{proto})
}

// Delete deletes flows in batches and returns how many the kernel deleted
// (flows already gone are not an error). It is Reconcile's last step,
// exported for tests and tools.
func (n *Netlink) Delete(ctx context.Context, flows []Flow) (int, error) {
	s, err := n.open()
	if err != nil {
		return 0, err
	}
	defer s.close()
	return s.delete(ctx, flows, n.opts.DeleteBatch)
}

// session is one ctnetlink socket, used by one goroutine.
type session struct {
	conn           *netlink.Conn
	seq            nlcodec.Seqs
	rbuf           []byte
	enc            encoder
	noKernelFilter bool
}

func (n *Netlink) open() (*session, error) {
	conn, err := nlcodec.Dial(nlcodec.SocketOptions{NetNSFd: n.opts.NetNSFd, Acks: true, RcvBuf: rcvbuf, SndBuf: sndbuf})
	if err != nil {
		return nil, fmt.Errorf("open conntrack netlink socket: %w", err)
	}
	// A dump datagram is at most 32 KiB (netlink_dump caps its skb), an
	// ACK datagram one ACK: 64 KiB never truncates.
	return &session{conn: conn, rbuf: make([]byte, 64<<10), noKernelFilter: n.opts.noKernelFilter}, nil
}

func (s *session) close() { _ = s.conn.Close() }

// withDeadline applies ctx (or replyTimeout) to the socket's reads and
// writes; the returned function undoes the cancellation hook.
func (s *session) withDeadline(ctx context.Context) (func() bool, error) {
	return nlcodec.Deadline(ctx, s.conn, nlcodec.Until(ctx, replyTimeout))
}

// dump reads the family's flows of protos, one kernel-filtered dump per
// protocol. A kernel that ignores the filter (older than 5.8) answers
// with the whole table, which is then the only dump used.
func (s *session) dump(ctx context.Context, family Family, protos []uint8) ([]Flow, error) {
	var flows []Flow
	for _, proto := range protos {
		before := len(flows)
		var err error
		if flows, err = s.dumpOne(ctx, family, proto, flows); err != nil {
			return flows, err
		}
		if !allProto(flows[before:], proto) {
			// This dump holds the whole table: it is the only one.
			klog.V(2).InfoS("Kernel ignored the conntrack dump filter (Linux < 5.8?): one unfiltered dump", "ipFamily", family)
			flows = flows[before:]
			break
		}
	}
	// Cheap insurance: whatever a kernel answers, an IPv4 reconcile
	// never sees IPv6 flows (Stale's NodePort match is by port).
	kept := flows[:0]
	for _, fl := range flows {
		if family.contains(fl) {
			kept = append(kept, fl)
		}
	}
	return kept, nil
}

func allProto(flows []Flow, proto uint8) bool {
	for _, fl := range flows {
		if fl.Proto != proto {
			return false
		}
	}
	return true
}

// dumpOne sends one dump request and appends the flows it returns.
func (s *session) dumpOne(ctx context.Context, family Family, proto uint8, flows []Flow) ([]Flow, error) {
	wrap := func(err error) error {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", err, ctx.Err())
		}
		return fmt.Errorf("dump %s conntrack table (protocol %d): %w", family, proto, err)
	}
	stop, err := s.withDeadline(ctx)
	if err != nil {
		return flows, wrap(err)
	}
	defer stop()
	seq := s.seq.Next(1)
	s.enc.Buf = s.enc.Buf[:0]
	filter := proto
	if s.noKernelFilter {
		filter = 0
	}
	s.enc.appendDump(seq, uint8(family), filter, filter == ProtoTCP)
	if err := nlcodec.Send(s.conn, s.enc.Buf); err != nil {
		return flows, wrap(err)
	}
	var parseErrs int
	var firstParseErr error
	for {
		buf, err := s.receive()
		if err != nil {
			return flows, wrap(err)
		}
		done, err := nlcodec.DumpMessages(buf, seq, func(h nlcodec.Header, payload []byte) error {
			if h.Type != ctType(ctMsgNew) {
				return nil
			}
			fl, err := parseFlow(payload)
			if err != nil {
				parseErrs++
				if firstParseErr == nil {
					firstParseErr = err
				}
				return nil
			}
			flows = append(flows, fl)
			return nil
		})
		if err != nil {
			return flows, wrap(err)
		}
		if done {
			break
		}
	}
	if parseErrs > 0 {
		klog.ErrorS(firstParseErr, "Skipped conntrack entries that could not be decoded", "ipFamily", family, "count", parseErrs)
	}
	return flows, nil
}

// delete deletes flows, batch deletions per sendmsg, each with an ACK.
// ENOENT means the flow expired, or was deleted, or was replaced by a new
// flow with the same tuple (its ID differs) since the dump: not an error,
// not counted. It goes on after errors and returns the first.
func (s *session) delete(ctx context.Context, flows []Flow, batch int) (int, error) {
	deleted := 0
	var errs []error
	for len(flows) > 0 {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		chunk := flows[:min(batch, len(flows))]
		flows = flows[len(chunk):]
		n, err := s.deleteBatch(ctx, chunk)
		deleted += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		err := errs[0]
		if len(errs) > 1 {
			err = fmt.Errorf("%w (and %d more failed batches)", err, len(errs)-1)
		}
		return deleted, fmt.Errorf("delete conntrack flows (%d deleted): %w", deleted, err)
	}
	return deleted, nil
}

func (s *session) deleteBatch(ctx context.Context, flows []Flow) (int, error) {
	first := s.seq.Next(len(flows))
	s.enc.Buf = s.enc.Buf[:0]
	for i, fl := range flows {
		s.enc.appendDelete(first+uint32(i), fl)
	}
	deleted, failed := 0, 0
	var firstErr error
	err := s.exchange(ctx, first, len(flows), func(i int, ack nlcodec.Ack) {
		switch ack.Errno {
		case 0:
			deleted++
		case unix.ENOENT:
		default:
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("delete %s: %w", flows[i], ack.Err())
			}
		}
	})
	if err != nil {
		return deleted, fmt.Errorf("%d deletions: %w", len(flows), err)
	}
	if firstErr != nil && failed > 1 {
		firstErr = fmt.Errorf("%w (and %d more)", firstErr, failed-1)
	}
	return deleted, firstErr
}

// exchange sends the count requests encoded in s.enc (sequence numbers
// first, first+1, …, each asking for an ACK) with one sendmsg and calls
// onAck with the index and outcome of each. The kernel runs the requests
// inside sendmsg, so the ACKs are queued when it returns.
func (s *session) exchange(ctx context.Context, first uint32, count int, onAck func(i int, ack nlcodec.Ack)) error {
	stop, err := s.withDeadline(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if err := nlcodec.Send(s.conn, s.enc.Buf); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	acked := 0
	for acked < count {
		buf, err := s.receive()
		if err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("%w: %w", err, ctx.Err())
			}
			return fmt.Errorf("read ACKs (%d of %d read): %w", acked, count, err)
		}
		err = nlcodec.Messages(buf, func(h nlcodec.Header, payload []byte) error {
			i := int(h.Seq - first)
			if h.Type != unix.NLMSG_ERROR || h.Seq < first || i >= count {
				return nil // a late reply to an earlier request
			}
			acked++
			onAck(i, nlcodec.ParseAck(h.Flags, payload))
			return nil
		})
		if err != nil {
			return fmt.Errorf("read ACKs (%d of %d read): %w", acked, count, err)
		}
	}
	return nil
}

// receive reads one datagram, waiting for it until the deadline.
func (s *session) receive() ([]byte, error) {
	n, err := nlcodec.Receive(s.conn, s.rbuf, true)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, fmt.Errorf("no reply: %w", err)
	}
	if err != nil {
		return nil, err
	}
	return s.rbuf[:n], nil
}
