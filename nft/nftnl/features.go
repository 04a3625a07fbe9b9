package nftnl

import (
	"context"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
)

// KernelFeatures are what nf_tables in the running kernel accepts, of what
// nftproxy uses where the kernel has it. ProbeKernel detects them by
// asking the kernel, never from its version: distributions backport.
type KernelFeatures struct {
	// TableOwner: NEWTABLE accepts NFT_TABLE_F_OWNER (Linux 5.12). Linux
	// 5.10 refuses the flag with EINVAL.
	TableOwner bool
	// TablePersist: NEWTABLE accepts NFT_TABLE_F_PERSIST (Linux 6.9), which
	// lets an owned table outlive its owner; nftproxy owns its table only
	// with it (NetlinkOptions.OwnTable). Linux 6.1 refuses the flag with
	// EOPNOTSUPP.
	TablePersist bool
	// BatchEndACK: the kernel ACKs a BATCH_END that asks for it, once the
	// batch committed (Linux 6.10, "netfilter: nfnetlink: handle ACK flags
	// for batch messages"). Older kernels ignore the flag: a batch's
	// success is then the absence of errors (BatchStats.Confirmed).
	BatchEndACK bool
}

// The features' names, with the Linux release that added each, as
// Missing and the tests' skip messages name them.
const (
	FeatureTableOwner   = "NFT_TABLE_F_OWNER (5.12)"
	FeatureTablePersist = "NFT_TABLE_F_PERSIST (6.9)"
	FeatureBatchEndACK  = "the ACK of NFNL_MSG_BATCH_END (6.10)"
)

// Missing names the features the kernel lacks (FeatureTableOwner, ...).
func (k KernelFeatures) Missing() []string {
	var m []string
	for _, f := range []struct {
		have bool
		name string
	}{
		{k.TableOwner, FeatureTableOwner},
		{k.TablePersist, FeatureTablePersist},
		{k.BatchEndACK, FeatureBatchEndACK},
	} {
		if !f.have {
			m = append(m, f.name)
		}
	}
	return m
}

// String lists the features the kernel has and lacks.
func (k KernelFeatures) String() string {
	if m := k.Missing(); len(m) > 0 {
		return "lacks " + strings.Join(m, ", ")
	}
	return "has every feature probed"
}

// probeTable names the tables a probe asks the kernel to create; it never
// commits them.
const probeTable = "nftproxy-probe"

// ProbeKernel asks the kernel of the socket's namespace which
// KernelFeatures it has, and changes nothing there: the table flags are
// tried in a batch that fails on purpose (it deletes a table that does not
// exist, so the kernel reports every message's error and commits none),
// the ACK with an empty batch (which commits nothing, and moves no
// generation). It works on a socket opened ReadOnly too.
func (n *Netlink) ProbeKernel(ctx context.Context) (KernelFeatures, error) {
	var k KernelFeatures
	wrap := func(err error) error { return fmt.Errorf("probe nf_tables: %w", err) }
	err := n.locked(ctx, wrap, func() error {
		var err error
		k, err = n.probeKernel()
		return err
	})
	return k, err
}

// probeKernel is ProbeKernel on the locked socket, its deadline set.
func (n *Netlink) probeKernel() (KernelFeatures, error) {
	var k KernelFeatures
	err := func() error {
		// BATCH_BEGIN; NEWTABLE owner; NEWTABLE owner|persist; DELTABLE
		// of a table that does not exist; BATCH_END.
		const owner, persist, absent = 1, 2, 3
		res, err := n.probeBatch(func(b *batch) {
			b.table = probeTable + "-owner"
			b.newTable(tableOwner)
			b.table = probeTable + "-persist"
			b.newTable(ownedFlags)
			b.table = probeTable + "-absent"
			b.deleteTable()
		}, 0)
		if err != nil {
			return err
		}
		errno := res.errnos()
		if err := failedOnPurpose(errno, absent); err != nil {
			return err
		}
		for _, m := range []int{owner, persist} {
			switch errno[m] {
			case 0, unix.EINVAL, unix.EOPNOTSUPP:
			default:
				return fmt.Errorf("table flags: %w", errno[m])
			}
		}
		k.TableOwner, k.TablePersist = errno[owner] == 0, errno[persist] == 0
		if res, err = n.probeBatch(func(*batch) {}, flagAck); err != nil {
			return err
		}
		if len(res.errs) > 0 {
			return fmt.Errorf("an empty batch: %w", res.errs[0].Errno)
		}
		k.BatchEndACK = res.confirmed
		return nil
	}()
	return k, err
}

// decideOwnership asks the kernel, once, whether it can keep an owned
// table (NFT_TABLE_F_OWNER and NFT_TABLE_F_PERSIST), before the first
// reading or transaction of a Netlink asked to own its table. Where it
// cannot, the table is not to be owned from the start: a restart then
// reads back the table its predecessor wrote without flags (buildsOn)
// instead of rewriting it whole. A probe that fails decides nothing: the
// kernel's refusal of the flags does it then (Apply). The socket is
// locked, its deadline set.
func (n *Netlink) decideOwnership() {
	if !n.owning || n.probed {
		return
	}
	n.probed = true
	k, err := n.probeKernel()
	if err != nil {
		return
	}
	var missing []string
	if !k.TableOwner {
		missing = append(missing, FeatureTableOwner)
	}
	if !k.TablePersist {
		missing = append(missing, FeatureTablePersist)
	}
	if len(missing) > 0 {
		n.owning, n.ownErr = false, fmt.Errorf("the kernel lacks %s", strings.Join(missing, " and "))
	}
}

// probeBatch sends a batch of the messages fill writes between BATCH_BEGIN
// and BATCH_END (with endFlags), and reads the replies.
func (n *Netlink) probeBatch(fill func(b *batch), endFlags uint16) (replies, error) {
	return n.probeBatchFamily(nft.IPv4, fill, endFlags)
}

// probeBatchFamily is probeBatch for family f's tables.
func (n *Netlink) probeBatchFamily(f nft.Family, fill func(b *batch), endFlags uint16) (replies, error) {
	b := newBatch(&nft.Transaction{Family: f}, batchOptions{firstSeq: n.seq.Next(0)})
	b.control(unix.NFNL_MSG_BATCH_BEGIN, 0, 0)
	b.op = opClaim
	fill(b)
	b.op = opControl
	b.control(unix.NFNL_MSG_BATCH_END, endFlags, 0)
	n.seq.Next(len(b.owners))
	if b.enc.Err() != nil {
		return replies{}, b.enc.Err()
	}
	if _, err := n.send(b.enc.Buf); err != nil {
		return replies{}, fmt.Errorf("send: %w", err)
	}
	return n.readReplies(b)
}

// RuleExpression is an nf_tables expression type nftproxy's rules or sets
// use, with the Linux release that added it.
type RuleExpression struct{ Name, Since string }

// RuleExpressions are the expression types the batches of nftproxy write
// (lower.go, and the counter of a set's declaration: setCounter).
// TestRuleExpressionsCoverTheEncoder keeps the list whole.
var RuleExpressions = []RuleExpression{
	{"payload", "3.13"}, {"cmp", "3.13"}, {"meta", "3.13"}, {"lookup", "3.13"}, {"immediate", "3.13"},
	{"bitwise", "3.13"}, {"byteorder", "3.13"}, {"counter", "3.13"}, {"ct", "3.13"}, {"nat", "3.13"},
	{"reject", "3.13"}, {"masq", "3.18"}, {"dynset", "4.3"}, {"numgen", "4.9"}, {"fib", "4.10"},
}

// MissingExpressions asks the kernel which of RuleExpressions it has no
// type for in family f: one rule per type in a probe table, in a batch
// that fails on purpose, so nothing is committed. A type the kernel knows
// (or loads: it asks modprobe for nft_<name> and replays the batch) refuses
// a rule without the expression's attributes with EINVAL or accepts it;
// one it cannot find is refused with ENOENT (nf_tables_expr_parse). Some
// types are per family (fib, masq, reject, nat: nft_fib_ipv6 for ip6): a
// kernel built without one cannot program that family's rules.
func (n *Netlink) MissingExpressions(ctx context.Context, f nft.Family) ([]string, error) {
	var missing []string
	wrap := func(err error) error { return fmt.Errorf("probe nf_tables expressions for %s: %w", f, err) }
	err := n.locked(ctx, wrap, func() error {
		var res replies
		var first int
		var err error
		res, err = n.probeBatchFamily(f, func(b *batch) {
			b.table = probeTable + "-expressions"
			b.ensureTable()
			m := b.begin(unix.NFT_MSG_NEWCHAIN, flagCreate)
			b.enc.Str(unix.NFTA_CHAIN_TABLE, b.table)
			b.enc.Str(unix.NFTA_CHAIN_NAME, "probe")
			b.end(m)
			first = len(b.owners)
			for _, x := range RuleExpressions {
				m := b.begin(unix.NFT_MSG_NEWRULE, flagCreate|flagAppend)
				b.enc.Str(unix.NFTA_RULE_TABLE, b.table)
				b.enc.Str(unix.NFTA_RULE_CHAIN, "probe")
				list := b.enc.Nest(unix.NFTA_RULE_EXPRESSIONS)
				elem := b.enc.Nest(unix.NFTA_LIST_ELEM)
				b.enc.Str(unix.NFTA_EXPR_NAME, x.Name)
				b.enc.EndNest(elem)
				b.enc.EndNest(list)
				b.end(m)
			}
			b.table = probeTable + "-absent"
			b.deleteTable()
		}, 0)
		if err != nil {
			return err
		}
		missing, err = missingExpressions(res.errnos(), first, len(RuleExpressions))
		return err
	})
	return missing, err
}

// missingExpressions reads the probe's errors, by message index: the rules
// of RuleExpressions start at message first, and the batch's last message
// but BATCH_END, deleting a table that does not exist, must have been
// refused with ENOENT (else the probe may have committed).
func missingExpressions(errno map[int]unix.Errno, first, n int) ([]string, error) {
	if err := failedOnPurpose(errno, first+n); err != nil {
		return nil, err
	}
	var missing []string
	for i, x := range RuleExpressions[:n] {
		switch e := errno[first+i]; e {
		case unix.ENOENT:
			missing = append(missing, fmt.Sprintf("the %s expression (Linux %s)", x.Name, x.Since))
		case 0, unix.EINVAL, unix.EOPNOTSUPP, unix.ERANGE:
		default:
			return nil, fmt.Errorf("a rule of the %s expression: %w", x.Name, e)
		}
	}
	return missing, nil
}

// errnos are the batch's errors by message index.
func (r replies) errnos() map[int]unix.Errno {
	errno := map[int]unix.Errno{}
	for _, e := range r.errs {
		errno[e.index] = e.Errno
	}
	return errno
}

// failedOnPurpose checks that a probe batch's message absent, the
// deletion of a table that does not exist, was refused with ENOENT: the
// batch then committed nothing.
func failedOnPurpose(errno map[int]unix.Errno, absent int) error {
	if errno[absent] != unix.ENOENT {
		return fmt.Errorf("deleting a table that does not exist: errno %d (%v), want ENOENT: the probe may have committed",
			errno[absent], errno[absent])
	}
	return nil
}
