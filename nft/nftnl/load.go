package nftnl

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file reads table nftproxy back from the kernel (Netlink.Load) with
// nf_tables dump requests on the Apply socket: the table, its chains, its
// rules (only to count them and take the digest of the first, see
// digest.go), its sets and their elements. Each object's decoder is in its
// own file.

var _ nft.Loader = (*Netlink)(nil)

// errLoadRaced: the ruleset changed while it was being read.
var errLoadRaced = errors.New("the ruleset changed while it was read")

// releaseAfterLoad is the number of elements from which Load returns the
// heap's free memory to the kernel once it has read the table: the dumps'
// messages are garbage by then, and the caller builds the whole desired
// state on top of what was read (what a restart of a large cluster reads:
// docs/code-figures.md).
const releaseAfterLoad = 500_000

func releaseAfterLargeLoad(rs *nft.Ruleset) {
	if rs == nil {
		return
	}
	n := 0
	for _, s := range rs.Sets {
		n += s.Elements.Len()
	}
	if n >= releaseAfterLoad {
		debug.FreeOSMemory()
	}
}

// Load implements Loader. It reads the kernel's state of table nftproxy in
// family f; most of its time is the kernel serialising rules only for us
// to count them and read the first one's digest (see loadRules;
// TestNetlinkRestart10k, docs/code-figures.md). The reads
// are several dumps; they are repeated if the ruleset generation moved in
// between, so the result is one consistent state. A reading that commits
// keep interrupting is repeated until ctx's deadline (at most
// replyTimeout): the nftproxy that commits waits for readers (the runner's
// Readers), so a reading of `nftproxy diff` or of a restart finishes once
// it is seen; the error then says how often it was interrupted.
func (n *Netlink) Load(ctx context.Context, f nft.Family) (*nft.Ruleset, error) {
	wrap := func(err error) error { return fmt.Errorf("load table %s %s: %w", f, nft.TableName, err) }
	if err := ctx.Err(); err != nil {
		return nil, wrap(err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conn == nil {
		return nil, wrap(errors.New("netlink socket closed"))
	}
	deadline := nlcodec.Until(ctx, replyTimeout)
	stop, err := nlcodec.Deadline(ctx, n.conn, deadline)
	if err != nil {
		return nil, wrap(err)
	}
	defer stop()
	var rs *nft.Ruleset
	err = readUntilConsistent(ctx, deadline, func() error {
		var err error
		rs, err = n.loadOnce(ctx, deadline, f)
		return err
	})
	if errors.Is(err, unix.EPERM) {
		err = fmt.Errorf("%w: %w", err, n.ownedError(f))
	}
	if err != nil {
		return nil, wrap(err)
	}
	releaseAfterLargeLoad(rs)
	return rs, nil
}

// readUntilConsistent runs read again while commits interrupt it
// (errLoadRaced), until deadline; the error then says how often.
func readUntilConsistent(ctx context.Context, deadline time.Time, read func() error) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := read()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%w: %w", err, ctx.Err())
		case !errors.Is(err, errLoadRaced):
			return err
		case time.Now().Before(deadline):
			continue
		}
		return fmt.Errorf("%w: %d readings in %v were interrupted by commits (another process commits more often than the ruleset can be read)",
			err, attempt, time.Since(start).Round(time.Millisecond))
	}
}

// buildsOn reports whether a table with flags can be changed in place: a
// dormant table (or one with flags we never set) is not what incremental
// transactions expect, and a table to be owned must be persistent to be
// claimed (the kernel never adds the flag to a table that exists). Other
// tables are rewritten. A read-only socket reads any table.
func (n *Netlink) buildsOn(flags uint32) bool {
	if n.opts.ReadOnly {
		return true
	}
	if n.owning {
		return flags&tablePersist != 0 && flags&^ownedFlags == 0
	}
	return flags == 0
}

// loadOnce claims the table if it is to be owned, then reads it once,
// between two generation reads. (Another family's claim, or anyone's
// commit, may interrupt a dump of the claim too: it is retried like the
// reading.)
func (n *Netlink) loadOnce(ctx context.Context, deadline time.Time, f nft.Family) (*nft.Ruleset, error) {
	if err := n.claimExisting(ctx, f); err != nil {
		return nil, err
	}
	gen, err := n.generation()
	if err != nil {
		return nil, err
	}
	rs, err := n.loadDumps(ctx, deadline, f)
	if err != nil {
		return nil, err
	}
	if after, err := n.generation(); err != nil {
		return nil, err
	} else if after != gen {
		return nil, errLoadRaced
	}
	if rs != nil {
		rs.Generation = gen
	}
	return rs, nil
}

var _ nft.GenerationReader = (*Netlink)(nil)

// Generation implements GenerationReader.
func (n *Netlink) Generation(ctx context.Context) (uint32, error) {
	var gen uint32
	err := n.locked(ctx, func(err error) error { return fmt.Errorf("read the ruleset generation: %w", err) }, func() error {
		var err error
		gen, err = n.generation()
		return err
	})
	return gen, err
}

// Claim claims table nftproxy of family f for this socket now, if it is
// to be owned and exists (see claimExisting; Load claims it otherwise). A
// claim is a commit: it moves the ruleset generation, which makes a
// reading of any family made before it stale, so a caller reading several
// families' tables ahead of time claims them all first.
func (n *Netlink) Claim(ctx context.Context, f nft.Family) error {
	return n.locked(ctx, func(err error) error { return fmt.Errorf("claim table %s %s: %w", f, nft.TableName, err) },
		func() error { return n.claimExisting(ctx, f) })
}

// claimExisting claims the table for this socket before it is read back,
// when it is to be owned and can be claimed: then nobody can change it
// between the reading and the transaction diffed against it. A table owned
// by a running process is refused (EPERM).
func (n *Netlink) claimExisting(ctx context.Context, f nft.Family) error {
	n.decideOwnership()
	if !n.owning || n.claimed {
		return nil
	}
	found, flags, err := n.tableFlags(f)
	if err != nil || !found || !n.buildsOn(flags) {
		return err
	}
	return n.apply(ctx, &nft.Transaction{Family: f})
}

func (n *Netlink) loadDumps(ctx context.Context, deadline time.Time, f nft.Family) (*nft.Ruleset, error) {
	found, flags, err := n.tableFlags(f)
	if err != nil {
		return nil, err
	}
	if !found || !n.buildsOn(flags) {
		return nil, nil
	}
	rs := nft.NewRuleset(f)
	if err := n.dump(unix.NFT_MSG_GETCHAIN, f, nil, func(attrs []byte) error {
		var d nlcodec.Decoder
		if c, _ := decodeChain(&d, attrs); c != nil {
			rs.Chains[c.Name] = c
		}
		return d.Err()
	}); err != nil {
		return nil, fmt.Errorf("dump chains: %w", err)
	}
	tableAttr := func(typ uint16) func(*encoder) {
		return func(e *encoder) { e.Str(typ, nft.TableName) }
	}
	if err := n.dump(unix.NFT_MSG_GETSET, f, tableAttr(unix.NFTA_SET_TABLE), func(attrs []byte) error {
		var d nlcodec.Decoder
		if s := decodeSet(&d, f, attrs); s != nil {
			rs.Sets[s.Name] = s
		}
		return d.Err()
	}); err != nil {
		return nil, fmt.Errorf("dump sets: %w", err)
	}
	// The rules and the elements are read by two sockets at once: the
	// kernel does a dump's work in the reader's context, so the second
	// socket puts it on the other core. Each job touches its own objects
	// (a chain's Loaded, a set's elements). The largest sets go first.
	jobs := loadJobs(rs)
	queue := make(chan func(*Netlink) error, len(jobs))
	for _, j := range jobs {
		queue <- j
	}
	close(queue)
	work := func(on *Netlink) error {
		for j := range queue {
			if err := j(on); err != nil {
				for range queue { // drain: the other worker stops too
				}
				return err
			}
		}
		return nil
	}
	helped := make(chan error, 1)
	if other, stop, err := n.loadHelper(ctx, deadline); err == nil {
		go func() {
			defer other.Close()
			defer stop()
			helped <- work(other)
		}()
	} else {
		helped <- nil // no second socket: this one does it all
	}
	err = work(n)
	if herr := <-helped; err == nil {
		err = herr
	}
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// loadJobs are the dumps that fill in rs once its chains and sets are
// known: each set's elements (but the dynamic sets'), the plain sets
// (hash tables, read back in O(n²)) before the endpoints maps (many small
// ones), then each chain's rules (see loadRules). A hash set's elements
// are read twice (checkElements).
func loadJobs(rs *nft.Ruleset) []func(*Netlink) error {
	f := rs.Family
	var jobs []func(*Netlink) error
	for _, maps := range []bool{false, true} {
		for _, name := range rs.SortedSetNames() {
			s := rs.Sets[name]
			if s.Dynamic || s.Key == nil || (s.EndpointsProto != 0) != maps {
				continue // filled by the packet path, not ours to read, or not in this pass
			}
			if s.EndpointsProto != 0 {
				jobs = append(jobs, func(on *Netlink) error { return on.loadElements(f, s, nil) })
				continue
			}
			jobs = append(jobs, func(on *Netlink) error { // a hash set: read twice (checkElements)
				var first elementsDigest
				if err := on.loadElements(f, s, &first); err != nil {
					return err
				}
				return on.checkElements(f, s, first)
			})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(rs.Chains)) {
		c := rs.Chains[name]
		jobs = append(jobs, func(on *Netlink) error {
			if err := on.loadRules(f, c); err != nil {
				return fmt.Errorf("dump rules: %w", err)
			}
			return nil
		})
	}
	return jobs
}

// loadHelper opens a second socket on the same namespace for Load, with
// Load's deadline and cancellation.
func (n *Netlink) loadHelper(ctx context.Context, deadline time.Time) (*Netlink, func() bool, error) {
	other, err := NewNetlink(n.opts)
	if err != nil {
		return nil, nil, err
	}
	stop, err := nlcodec.Deadline(ctx, other.conn, deadline)
	if err != nil {
		other.Close()
		return nil, nil, err
	}
	return other, stop, nil
}
