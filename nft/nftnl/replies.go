package nftnl

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file reads the kernel's replies: to a batch (errors, and the ACK of
// BATCH_END), to a dump, and to GETGEN.

// msgError is the kernel's error for message index of a batch.
type msgError struct {
	index int
	nlcodec.Ack
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
				if r.genID, err = parseGenID(m.data); err != nil {
					return r, fmt.Errorf("batch sent; read generation: %w", err)
				}
			case m.seq == sentinel && m.ack.Errno != 0:
				return r, fmt.Errorf("batch sent; request generation: %w", m.ack.Err())
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
		if m.ack.Errno == 0 {
			r.confirmed = r.confirmed || idx == len(b.owners)-1
		} else {
			r.errs = append(r.errs, msgError{idx, m.ack})
		}
	}
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
	if first.Errno == unix.EPERM {
		// With CAP_NET_ADMIN, the only refusal is a table owned by
		// another socket (NFT_TABLE_F_OWNER).
		what += " (the table is owned by another running process)"
	}
	err := fmt.Errorf("%s: %w", what, first.Err())
	if len(errs) > 1 {
		err = fmt.Errorf("%w (and %d more errors)", err, len(errs)-1)
	}
	return err
}

// reply is one netlink message read back: an error or ACK (NLMSG_ERROR,
// errno 0 for an ACK) or another (a NEWGEN, a dump's message, NLMSG_DONE).
type reply struct {
	typ   uint16
	flags uint16
	seq   uint32
	ack   nlcodec.Ack // of an NLMSG_ERROR
	data  []byte      // payload of a message other than NLMSG_ERROR
}

// receive reads one datagram and parses its messages; without block it
// returns EAGAIN when none is queued. It parses errors itself because
// mdlayher/netlink v1.11.2 cannot parse a capped extended ACK
// (NETLINK_CAP_ACK with NETLINK_EXT_ACK).
func (n *Netlink) receive(block bool) ([]reply, error) {
	if n.rbuf == nil {
		n.rbuf = make([]byte, 1<<16)
	}
	nr, err := nlcodec.Receive(n.conn, n.rbuf, block)
	if err != nil {
		return nil, err
	}
	return parseReplies(n.rbuf[:nr])
}

// parseReplies splits a datagram into messages.
func parseReplies(b []byte) ([]reply, error) {
	var out []reply
	err := nlcodec.Messages(b, func(h nlcodec.Header, payload []byte) error {
		m := reply{typ: h.Type, flags: h.Flags, seq: h.Seq}
		if h.Type == unix.NLMSG_ERROR {
			m.ack = nlcodec.ParseAck(h.Flags, payload)
		} else {
			m.data = payload
		}
		out = append(out, m)
		return nil
	})
	return out, err
}

// dump sends an nf_tables dump request (attrs writes its attributes, may be
// nil) and calls each with the attributes of every reply message, until
// the kernel's NLMSG_DONE. each must not keep the bytes it is given.
func (n *Netlink) dump(msgType uint16, f nft.Family, attrs func(*encoder), each func(attrs []byte) error) error {
	seq := n.seq.Next(1)
	e := encoder{nlcodec.Encoder{Buf: make([]byte, 0, 128)}}
	m := e.BeginMsg(unix.NFNL_SUBSYS_NFTABLES<<8|msgType, flagRequest|unix.NLM_F_DUMP, seq, uint8(f), 0)
	if attrs != nil {
		attrs(&e)
	}
	e.EndMsg(m)
	if _, err := n.send(e.Buf); err != nil {
		return fmt.Errorf("send dump request: %w", err)
	}
	var first error
	for {
		msgs, err := n.receive(true)
		if errors.Is(err, unix.ENOBUFS) {
			continue // replies to an earlier batch were lost; a dump's are not
		}
		if err != nil {
			return fmt.Errorf("read dump: %w", err)
		}
		for _, r := range msgs {
			if r.seq != seq {
				continue // a late reply to an earlier request
			}
			if r.flags&unix.NLM_F_DUMP_INTR != 0 && first == nil {
				first = errLoadRaced
			}
			switch r.typ {
			case unix.NLMSG_ERROR:
				if err := r.ack.Err(); err != nil {
					return err
				}
			case unix.NLMSG_DONE:
				if err := nlcodec.DoneErr(r.data); err != nil {
					return err
				}
				return first
			default:
				if len(r.data) < nlcodec.GenHeaderLen {
					return fmt.Errorf("%w: nf_tables message of %d bytes", nlcodec.ErrMalformed, len(r.data))
				}
				if err := each(r.data[nlcodec.GenHeaderLen:]); err != nil && first == nil {
					first = err // keep reading up to NLMSG_DONE
				}
			}
		}
	}
}

const genReplyType = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWGEN

// sendSentinel sends NFT_MSG_GETGEN and returns its sequence number.
func (n *Netlink) sendSentinel() (uint32, error) {
	seq := n.seq.Next(1)
	var e nlcodec.Encoder
	e.EndMsg(e.BeginMsg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN, flagRequest, seq, unix.AF_UNSPEC, 0))
	return seq, nlcodec.Send(n.conn, e.Buf)
}

// generation reads the ruleset's generation ID (NFT_MSG_GETGEN).
func (n *Netlink) generation() (uint32, error) {
	seq, err := n.sendSentinel()
	if err != nil {
		return 0, fmt.Errorf("request generation: %w", err)
	}
	for {
		msgs, err := n.receive(true)
		if errors.Is(err, unix.ENOBUFS) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read generation: %w", err)
		}
		for _, m := range msgs {
			switch {
			case m.seq != seq:
			case m.typ == genReplyType:
				return parseGenID(m.data)
			case m.ack.Errno != 0:
				return 0, fmt.Errorf("read generation: %w", m.ack.Err())
			}
		}
	}
}

// parseGenID reads NFTA_GEN_ID from a NEWGEN message.
func parseGenID(data []byte) (uint32, error) {
	if len(data) < nlcodec.GenHeaderLen {
		return 0, fmt.Errorf("%w: NEWGEN of %d bytes", nlcodec.ErrMalformed, len(data))
	}
	var d nlcodec.Decoder
	var gen uint32
	d.Attrs(data[nlcodec.GenHeaderLen:], func(typ uint16, data []byte) {
		if typ == unix.NFTA_GEN_ID {
			gen = d.BE32(data)
		}
	})
	return gen, d.Err()
}
