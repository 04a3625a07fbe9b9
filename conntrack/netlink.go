package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft/nlsock"
)

// Netlink reconciles the kernel's conntrack table over ctnetlink.
//
// It is our own ctnetlink code on mdlayher/netlink (the stack nft/ already
// uses), not github.com/vishvananda/netlink v1.3.1 (upstream kube-proxy's).
// Measured on this machine (kernel 6.18, 2 CPUs) on one namespace's table
// of 101,000 flows, 91,000 of them UDP, with a throw-away program that ran
// both libraries on the same table (2026-11-22):
//
//   - vishvananda's ConntrackTableList: 725–790 ms, 66.7 allocations per
//     flow (a *ConntrackFlow with net.IP slices). Our Dump: 280–330 ms,
//     0.03 allocations per flow (flows are decoded in place);
//   - vishvananda's ConntrackDeleteFilters, which upstream uses to delete,
//     dumps the whole table again and sends one delete per request,
//     waiting for each ACK: 1,000 deletions took 756–1,307 ms. Our delete
//     sends 512 per sendmsg and reads the ACKs back: 3.8–5 ms for 1,000.
//     Upstream's reconcile (a dump to decide, then that) costs two dumps;
//     ours one;
//   - vishvananda cannot ask the kernel to filter a dump (CTA_FILTER).
//     With it, flows of other protocols are walked but never serialized
//     or copied: a dump matching none of 99,000 flows takes 30–55 ms
//     instead of 250–300 ms (TestReconcile100k), so a node's TCP flows
//     cost little. The kernel walks its whole hash table (all namespaces,
//     262,144 buckets here) for every dump: ~8 ms on an empty table.
//
// TestReconcile100k, 100,000 flows (90,100 UDP), 1,000 stale: dump
// 211–265 ms, decide 15–18 ms, delete 3–5 ms. A CPU profile puts most of
// the dump in recvfrom (the kernel serializing flows), not in decoding.
//
// Every Reconcile opens its own socket (0.2 ms when opened in another
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
	seq            uint32
	rbuf           []byte
	enc            encoder
	noKernelFilter bool
}

func (n *Netlink) open() (*session, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.opts.NetNSFd})
	if err != nil {
		return nil, fmt.Errorf("open conntrack netlink socket: %w", err)
	}
	// A dump datagram is at most 32 KiB (netlink_dump caps its skb), an
	// ACK datagram one ACK: 64 KiB never truncates.
	s := &session{conn: conn, rbuf: make([]byte, 64<<10), noKernelFilter: n.opts.noKernelFilter}
	if err := nlsock.Acks(conn); err != nil {
		s.close()
		return nil, err
	}
	for _, o := range []struct{ opt, size int }{{unix.SO_RCVBUFFORCE, rcvbuf}, {unix.SO_SNDBUFFORCE, sndbuf}} {
		if err := nlsock.SetBuffer(conn, o.opt, o.size); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

func (s *session) close() { _ = s.conn.Close() }

// nextSeqs reserves count sequence numbers and returns the first (never 0).
func (s *session) nextSeqs(count int) uint32 {
	first := s.seq + 1
	s.seq += uint32(count)
	return first
}

// withDeadline applies ctx (or replyTimeout) to the socket's reads and
// writes; the returned function undoes the cancellation hook.
func (s *session) withDeadline(ctx context.Context) (func() bool, error) {
	return nlsock.Deadline(ctx, s.conn, nlsock.Until(ctx, replyTimeout))
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
	seq := s.nextSeqs(1)
	s.enc.b = s.enc.b[:0]
	filter := proto
	if s.noKernelFilter {
		filter = 0
	}
	s.enc.appendDump(seq, uint8(family), filter, filter == ProtoTCP)
	if err := s.send(s.enc.b); err != nil {
		return flows, wrap(err)
	}
	var parseErrs int
	var firstParseErr error
	for {
		buf, err := s.receive()
		if err != nil {
			return flows, wrap(err)
		}
		done := false
		err = messages(buf, func(typ, flags uint16, mseq uint32, payload []byte) error {
			if mseq != seq {
				return nil // a late reply to an earlier request
			}
			switch typ {
			case unix.NLMSG_DONE:
				done = true
				if len(payload) >= 4 {
					if code := int32(binary.NativeEndian.Uint32(payload)); code < 0 {
						return unix.Errno(-code)
					}
				}
			case unix.NLMSG_ERROR:
				done = true
				if errno, _ := parseAck(flags, payload); errno != 0 {
					return errno
				}
			case ctType(ctMsgNew):
				fl, err := parseFlow(payload)
				if err != nil {
					parseErrs++
					if firstParseErr == nil {
						firstParseErr = err
					}
					return nil
				}
				flows = append(flows, fl)
			}
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
	first := s.nextSeqs(len(flows))
	s.enc.b = s.enc.b[:0]
	for i, fl := range flows {
		s.enc.appendDelete(first+uint32(i), fl)
	}
	deleted, failed := 0, 0
	var firstErr error
	err := s.exchange(ctx, first, len(flows), func(i int, errno unix.Errno, msg string) {
		switch errno {
		case 0:
			deleted++
		case unix.ENOENT:
		default:
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("delete %s: %w", flows[i], errno)
				if msg != "" {
					firstErr = fmt.Errorf("%w (kernel: %s)", firstErr, msg)
				}
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
func (s *session) exchange(ctx context.Context, first uint32, count int, onAck func(i int, errno unix.Errno, msg string)) error {
	stop, err := s.withDeadline(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if err := s.send(s.enc.b); err != nil {
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
		_ = messages(buf, func(typ, flags uint16, seq uint32, payload []byte) error {
			i := int(seq - first)
			if typ != unix.NLMSG_ERROR || seq < first || i >= count {
				return nil // a late reply to an earlier request
			}
			acked++
			errno, msg := parseAck(flags, payload)
			onAck(i, errno, msg)
			return nil
		})
	}
	return nil
}

// send writes buf (one or more messages) with one sendmsg.
func (s *session) send(buf []byte) error {
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	werr := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), buf, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return serr != unix.EAGAIN
	})
	if werr != nil {
		return werr
	}
	return serr
}

// receive reads one datagram, waiting for it until the deadline.
func (s *session) receive() ([]byte, error) {
	rc, err := s.conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), s.rbuf, unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	}); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, fmt.Errorf("no reply: %w", err)
		}
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	return s.rbuf[:n], nil
}

// messages calls fn for each netlink message of a datagram and stops at
// the first error fn returns.
func messages(b []byte, fn func(typ, flags uint16, seq uint32, payload []byte) error) error {
	for len(b) >= nlmsgHeaderLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < nlmsgHeaderLen || l > len(b) {
			return fmt.Errorf("malformed netlink message of %d bytes in %d", l, len(b))
		}
		typ := binary.NativeEndian.Uint16(b[4:])
		flags := binary.NativeEndian.Uint16(b[6:])
		seq := binary.NativeEndian.Uint32(b[8:])
		if err := fn(typ, flags, seq, b[nlmsgHeaderLen:l]); err != nil {
			return err
		}
		b = b[min(align4(l), len(b)):]
	}
	return nil
}

// parseAck reads the errno of an NLMSG_ERROR (0 for an ACK) and its
// extended ACK message, if any (include/uapi/linux/netlink.h: the errno,
// the request's header, the request's payload unless NLM_F_CAPPED, then
// NLMSGERR_ATTR_* TLVs if NLM_F_ACK_TLVS).
func parseAck(flags uint16, payload []byte) (unix.Errno, string) {
	if len(payload) < 4+nlmsgHeaderLen {
		return unix.EBADMSG, "short netlink error message"
	}
	errno := unix.Errno(-int32(binary.NativeEndian.Uint32(payload)))
	if flags&unix.NLM_F_ACK_TLVS == 0 {
		return errno, ""
	}
	rest := payload[4+nlmsgHeaderLen:]
	if flags&unix.NLM_F_CAPPED == 0 {
		reqLen := int(binary.NativeEndian.Uint32(payload[4:])) - nlmsgHeaderLen
		rest = rest[min(max(align4(reqLen), 0), len(rest)):]
	}
	var msg string
	_ = attrs(rest, func(typ uint16, data []byte) {
		if typ == unix.NLMSGERR_ATTR_MSG {
			msg = string(trimNul(data))
		}
	})
	return errno, msg
}

func trimNul(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	return b
}
