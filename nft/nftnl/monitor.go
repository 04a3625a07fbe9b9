package nftnl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// The kernel multicasts every committed nftables transaction, whoever made
// it, on the netlink group NFNLGRP_NFTABLES (what `nft monitor` prints): one
// message per object changed, each carrying the port id of the socket that
// committed it as its sender, then NFT_MSG_NEWGEN with the new generation
// and the committing process's pid and name. Monitor listens to that group
// and reports the commits of other sockets that changed table nftproxy, so
// that a tampered table is repaired at once, without polling.

// ObjectKind names the kind of object a Change changed.
type ObjectKind string

// Object kinds, as the kernel's notifications tell them apart.
const (
	KindTable     ObjectKind = "table"
	KindChain     ObjectKind = "chain"
	KindRule      ObjectKind = "rule"
	KindSet       ObjectKind = "set"
	KindElement   ObjectKind = "element"
	KindObject    ObjectKind = "object"
	KindFlowtable ObjectKind = "flowtable"
)

// ObjectKinds are every ObjectKind a Change may name.
var ObjectKinds = []ObjectKind{KindTable, KindChain, KindRule, KindSet, KindElement, KindObject, KindFlowtable}

// Change is what one commit did to objects of one kind in table nftproxy
// of one family.
type Change struct {
	Family  nft.Family
	Kind    ObjectKind
	Deleted bool
	// Name is the chain (of rules, or the chain itself) or the set (of
	// elements, or the set itself) changed; empty for the table.
	Name  string
	Count int // objects
}

func (c Change) String() string {
	verb := "added"
	if c.Deleted {
		verb = "deleted"
	}
	where := ""
	switch c.Kind {
	case KindRule:
		where = " in chain " + c.Name
	case KindElement:
		where = " of set " + c.Name
	case KindTable:
	default:
		where = " " + c.Name
	}
	return fmt.Sprintf("%s %s: %d %s%s", c.Family, verb, c.Count, c.Kind, where)
}

// Commit is a transaction another process committed that changed table
// nftproxy, or word that such commits may have been missed.
type Commit struct {
	GenID   uint32 // the ruleset generation it made
	PortID  uint32 // the netlink port of the committing socket
	PID     uint32 // the committing process (thread) id
	Process string // its name
	Changes []Change
	// Lost: notifications were lost (the receive buffer overflowed, or
	// another process committed while the monitor was paused), so any
	// table may have been changed. The other fields are empty.
	Lost bool
}

// Families returns the families whose table the commit changed; with Lost,
// none: the caller must check every family.
func (c Commit) Families() []nft.Family {
	var out []nft.Family
	for _, ch := range c.Changes {
		if !containsFamily(out, ch.Family) {
			out = append(out, ch.Family)
		}
	}
	return out
}

func containsFamily(fs []nft.Family, f nft.Family) bool {
	for _, g := range fs {
		if g == f {
			return true
		}
	}
	return false
}

// monitorRcvbuf is the listening socket's receive buffer: notifications of
// a large foreign commit arrive faster than they are read.
const monitorRcvbuf = 16 << 20

// Monitor reports commits of other sockets to table nftproxy.
type Monitor struct {
	listen *netlink.Conn
	gen    *Netlink // asks for the ruleset generation (Pause)
	ours   map[uint32]bool
	rbuf   []byte

	mu       sync.Mutex // pause state
	paused   int
	pauseGen uint32
	pauseErr error
	commits  int

	emitMu sync.Mutex
	report func(Commit)
}

// NewMonitor opens the listening socket, in the network namespace of opts.
// Commits sent by the sockets with port ids ours (Netlink.PortID of the
// backends) are nftproxy's own and are not reported.
func NewMonitor(opts NetlinkOptions, ours ...uint32) (*Monitor, error) {
	conn, err := nlcodec.Dial(nlcodec.SocketOptions{NetNSFd: opts.NetNSFd, RcvBuf: monitorRcvbuf, Groups: []uint32{unix.NFNLGRP_NFTABLES}})
	if err != nil {
		return nil, fmt.Errorf("open the nftables monitor socket: %w", err)
	}
	gen, err := NewNetlink(NetlinkOptions{NetNSFd: opts.NetNSFd})
	if err != nil {
		conn.Close()
		return nil, err
	}
	m := &Monitor{listen: conn, gen: gen, ours: map[uint32]bool{}, rbuf: make([]byte, 1<<16)}
	for _, p := range ours {
		m.ours[p] = true
	}
	return m, nil
}

// Close closes the sockets.
func (m *Monitor) Close() error {
	return errors.Join(m.listen.Close(), m.gen.Close())
}

// Run reads notifications until ctx is done and calls report (never twice
// at once) for each commit of another socket that changed table nftproxy,
// and with a Lost commit when notifications were lost.
func (m *Monitor) Run(ctx context.Context, report func(Commit)) error {
	m.emitMu.Lock()
	m.report = report
	m.emitMu.Unlock()
	stop := context.AfterFunc(ctx, func() { _ = m.listen.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var acc commitAccumulator
	for {
		n, err := nlcodec.Receive(m.listen, m.rbuf, true)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, unix.ENOBUFS) || errors.Is(err, nlcodec.ErrTruncated) {
			acc = commitAccumulator{}
			m.emit(Commit{Lost: true})
			continue
		}
		if err != nil {
			return fmt.Errorf("read nftables notifications: %w", err)
		}
		err = nlcodec.Messages(m.rbuf[:n], func(h nlcodec.Header, data []byte) error {
			if m.ours[h.PortID] {
				return nil
			}
			c, done, err := acc.add(h, data)
			if err != nil {
				// What it changed cannot be told: any table may
				// have been.
				acc = commitAccumulator{}
				c, done = Commit{Lost: true}, true
			}
			if done {
				m.emit(c)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("read nftables notifications: %w", err)
		}
	}
}

func (m *Monitor) emit(c Commit) {
	m.emitMu.Lock()
	defer m.emitMu.Unlock()
	if m.report != nil {
		m.report(c)
	}
}

// Pause stops the notifications until resume is called, for a large commit
// of nftproxy's own: while anyone listens, the kernel builds a notification
// for every object a batch changes, which makes a large commit markedly
// costlier (docs/code-figures.md). Each of
// nftproxy's commits meanwhile must be counted with Committed; when the
// ruleset's generation moved by more than those, another process committed
// while nobody listened, and a Lost commit is reported. Pauses nest (the
// families sync at once): the subscription resumes with the last resume.
func (m *Monitor) Pause() (resume func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.paused == 0 {
		// The generation is read before leaving the group: a commit in
		// between is both reported and counted as missed, never neither.
		m.pauseGen, m.pauseErr = m.gen.generation()
		if err := m.listen.LeaveGroup(unix.NFNLGRP_NFTABLES); err != nil && m.pauseErr == nil {
			m.pauseErr = err
		}
		m.commits = 0
	}
	m.paused++
	var once sync.Once
	return func() { once.Do(m.resume) }
}

// Committed counts a transaction nftproxy committed, for a pause under
// way; gen is the ruleset generation it made (BatchStats.GenID; 0:
// unknown). A commit the pause's first generation already holds (another
// family's, which committed just before the pause began and reported just
// after) is not counted. One counted that it held makes the count too
// high: that reports a Lost commit for nothing, never hides one.
func (m *Monitor) Committed(gen uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.paused > 0 && (gen == 0 || m.pauseErr != nil || int32(gen-m.pauseGen) > 0) {
		m.commits++
	}
}

func (m *Monitor) resume() {
	m.mu.Lock()
	m.paused--
	if m.paused > 0 {
		m.mu.Unlock()
		return
	}
	err := m.listen.JoinGroup(unix.NFNLGRP_NFTABLES)
	now, genErr := m.gen.generation()
	missed := err != nil || genErr != nil || m.pauseErr != nil || now-m.pauseGen != uint32(m.commits)
	m.mu.Unlock()
	if missed {
		m.emit(Commit{Lost: true})
	}
}

// changeKey is one line of a Commit's Changes.
type changeKey struct {
	family  nft.Family
	kind    ObjectKind
	deleted bool
	name    string
}

// commitAccumulator gathers one foreign commit's changes to table nftproxy
// until its NEWGEN.
type commitAccumulator struct {
	counts map[changeKey]int
	order  []changeKey
}

// add takes one notification; at a NEWGEN that ends a commit which
// changed table nftproxy, it returns that commit. A malformed notification
// is an error.
func (a *commitAccumulator) add(h nlcodec.Header, data []byte) (Commit, bool, error) {
	if h.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || len(data) < nlcodec.GenHeaderLen {
		return Commit{}, false, nil
	}
	typ := h.Type & 0xff
	if typ == unix.NFT_MSG_NEWGEN {
		if len(a.order) == 0 {
			return Commit{}, false, nil
		}
		c, err := a.commit(h, data)
		return c, err == nil, err
	}
	kind, deleted, nameAttr, ok := notification(typ)
	f := nft.Family(data[0])
	if !ok || (f != nft.IPv4 && f != nft.IPv6) {
		return Commit{}, false, nil
	}
	var table, name string
	var d nlcodec.Decoder
	d.Attrs(data[nlcodec.GenHeaderLen:], func(t uint16, data []byte) {
		switch t {
		case 1: // NFTA_{TABLE_NAME, CHAIN_TABLE, RULE_TABLE, SET_TABLE, SET_ELEM_LIST_TABLE, OBJ_TABLE, FLOWTABLE_TABLE}
			table = nlcodec.String(data)
		case nameAttr:
			name = nlcodec.String(data)
		}
	})
	if d.Err() != nil || table != nft.TableName {
		return Commit{}, false, d.Err()
	}
	if kind == KindTable {
		name = ""
	}
	k := changeKey{family: f, kind: kind, deleted: deleted, name: name}
	if a.counts == nil {
		a.counts = map[changeKey]int{}
	}
	if a.counts[k] == 0 {
		a.order = append(a.order, k)
	}
	a.counts[k]++
	return Commit{}, false, nil
}

// commit ends the commit at its NEWGEN, whose attributes name the
// generation and the committing process.
func (a *commitAccumulator) commit(h nlcodec.Header, data []byte) (Commit, error) {
	c := Commit{PortID: h.PortID}
	var d nlcodec.Decoder
	d.Attrs(data[nlcodec.GenHeaderLen:], func(t uint16, data []byte) {
		switch t {
		case unix.NFTA_GEN_ID:
			c.GenID = d.BE32(data)
		case unix.NFTA_GEN_PROC_PID:
			c.PID = d.BE32(data)
		case unix.NFTA_GEN_PROC_NAME:
			c.Process = nlcodec.String(data)
		}
	})
	for _, k := range a.order {
		c.Changes = append(c.Changes, Change{Family: k.family, Kind: k.kind, Deleted: k.deleted, Name: k.name,
			Count: a.counts[k]})
	}
	*a = commitAccumulator{}
	return c, d.Err()
}

// Message types and attributes golang.org/x/sys/unix does not name,
// include/uapi/linux/netfilter/nf_tables.h: NFT_MSG_DESTROY* (Linux 6.3).
const (
	nftaFlowtableName = 2

	msgDestroyTable     = 26
	msgDestroyChain     = 27
	msgDestroyRule      = 28
	msgDestroySet       = 29
	msgDestroySetElem   = 30
	msgDestroyObj       = 31
	msgDestroyFlowtable = 32
)

// notification returns what a notification of type typ changed and which
// attribute names the object (or, for rules and elements, their chain or
// set).
func notification(typ uint16) (kind ObjectKind, deleted bool, nameAttr uint16, ok bool) {
	switch typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE, msgDestroyTable:
		return KindTable, typ != unix.NFT_MSG_NEWTABLE, unix.NFTA_TABLE_NAME, true
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN, msgDestroyChain:
		return KindChain, typ != unix.NFT_MSG_NEWCHAIN, unix.NFTA_CHAIN_NAME, true
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE, msgDestroyRule:
		return KindRule, typ != unix.NFT_MSG_NEWRULE, unix.NFTA_RULE_CHAIN, true
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET, msgDestroySet:
		return KindSet, typ != unix.NFT_MSG_NEWSET, unix.NFTA_SET_NAME, true
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM, msgDestroySetElem:
		return KindElement, typ != unix.NFT_MSG_NEWSETELEM, unix.NFTA_SET_ELEM_LIST_SET, true
	case unix.NFT_MSG_NEWOBJ, unix.NFT_MSG_DELOBJ, msgDestroyObj:
		return KindObject, typ != unix.NFT_MSG_NEWOBJ, unix.NFTA_OBJ_NAME, true
	case unix.NFT_MSG_NEWFLOWTABLE, unix.NFT_MSG_DELFLOWTABLE, msgDestroyFlowtable:
		return KindFlowtable, typ != unix.NFT_MSG_NEWFLOWTABLE, nftaFlowtableName, true
	}
	return "", false, 0, false
}
