// Package readers tells whether another process is in the middle of
// reading the ruleset, so that a commit can wait for the read to end
// instead of making it start over — but only while the wait buys the
// reader progress, and never for long.
//
// Every nftables commit moves the network namespace's ruleset generation;
// a dump that spans one is interrupted, and nft, libnftables, iptables-nft
// and our own reads then read everything again, with no limit. Under a
// stream of changes, committing at their pace keeps every reader of the
// ruleset from ever finishing (`nft list ruleset` never returns).
//
// The kernel does not say who reads, but it says of every netlink socket
// whether a dump is running on it (nftnl.SocketLister). A socket of
// another process is taken to be reading from the moment it is first
// seen, and again each time a dump is seen running on it, until none has
// been seen for its linger. The linger covers the pauses a reader makes
// between its dumps (nft asks for tables, chains, sets, elements and rules
// one dump at a time, and decodes each before it asks for the next): it
// grows to 1.5 times the longest pause the socket was seen to make, at
// most Config.MaxLinger. A pause longer than MaxLinger is not a pause but
// a new read (a process that keeps its socket and reads now and then). A
// new socket starts at Config.Linger, or at what another socket grew to in
// the last Config.Remember: the pauses come from the size of the ruleset
// read, which the next reader reads too.
//
// A wait must buy progress, so three bounds keep a reader that does not
// move, or that never ends, from holding changes back:
//
//   - A dump ends. A reader's dumps are short: it reads each as fast as
//     the kernel fills it. A dump seen running at every look for longer
//     than the stall limit has stalled (its process stopped reading: it is
//     stopped, traced, or writes to a pipe nobody reads): the socket holds
//     nothing until a look sees its dump over. The limit is
//     Config.StallMargin times the longest dump seen to end in the last
//     Remember, from Config.Stall to Config.MaxStall.
//   - A read is worth one budget. Commits are held for one read (from its
//     first dump to its last plus the linger) for at most Config.Budget in
//     all, however many syncs that spans; a read that used it up holds
//     nothing until it ends.
//   - A wait is for the reads under way when it began (Reading's since): a
//     read that starts while a sync waits is not waited for (the commit
//     costs it one start over, the next wait protects it), so readers
//     that take turns cannot hold a sync for longer than one of them.
//
// Reads of this process (the traffic counters' scrape) take a Hold, which
// counts without any listing.
package readers

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft/nftnl"
)

// Lister lists the netfilter netlink sockets of other processes
// (nftnl.SocketLister).
type Lister interface {
	Sockets() ([]nftnl.Socket, error)
}

// Config tunes a Gate.
type Config struct {
	// Linger is how long a socket counts as reading after it was first
	// seen or last seen dumping, until its own pauses are known.
	Linger time.Duration
	// MaxLinger bounds what a socket's pauses make its linger; a longer
	// pause is taken for the start of another read.
	MaxLinger time.Duration
	// Stall is how long a dump may be seen running, look after look,
	// before its socket is taken to have stopped reading, until dumps
	// have been seen to end; StallMargin times the longest dump seen to
	// end makes it longer, up to MaxStall.
	Stall, MaxStall time.Duration
	StallMargin     float64
	// Remember is how long what sockets were seen to do (the linger one
	// grew to, the longest dump) is a new socket's start.
	Remember time.Duration
	// Budget is how long, in all, commits wait for one read (0: no
	// bound but the runner's).
	Budget time.Duration
	// Clock times this process's holds; nil means the real clock.
	Clock clock.PassiveClock
}

// DefaultConfig is what nftproxy runs with (docs/operations.md, "A busy
// node"), with Budget set to --max-reader-wait.
var DefaultConfig = Config{Linger: 250 * time.Millisecond, MaxLinger: 2 * time.Second,
	Stall: time.Second, MaxStall: 5 * time.Second, StallMargin: 4, Remember: 10 * time.Minute}

// pauseMargin is how much longer than the longest pause seen a socket's
// linger is: pauses vary, and the runner sees a socket only when it looks.
const pauseMargin = 1.5

// Gate tracks other processes' reads of the ruleset. It is safe for
// concurrent use.
type Gate struct {
	lister Lister // nil: only this process's holds are seen
	cfg    Config

	mu      sync.Mutex
	sockets map[uint32]*reader // by inode
	holds   map[int]time.Time  // reads of this process under way, by when they began
	nextID  int
	// listErr is the last listing's error (logged when it changes);
	// listed whether any listing worked yet.
	listErr error
	listed  bool
	// learned is the longest linger a socket grew to, at learnedAt;
	// longestDump the longest dump seen to end, at dumpAt.
	learned, longestDump time.Duration
	learnedAt, dumpAt    time.Time
	// waitSince and lastLook are the since and now of the last Reading:
	// a look in the same wait charges the reads it waits for.
	waitSince, lastLook time.Time
	// lastReaders are the ports of the sockets that were reading at the
	// last look that found a read, and lastHeld whether this process was.
	lastReaders []uint32
	lastHeld    bool
}

// reader is what the gate knows of one socket.
type reader struct {
	portID uint32
	// readStart is when the read under way began (zero: the socket is
	// idle), and held how long commits have waited for it.
	readStart time.Time
	held      time.Duration
	// lastDump is when the socket was last seen dumping, or first seen.
	lastDump time.Time
	// dumping is what the last look saw; dumpSince the first of the
	// looks in a row that saw the dump under way.
	dumping   bool
	dumpSince time.Time
	linger    time.Duration
	// stalled: the dump under way outlasted the stall limit; spent: the
	// read under way used up the budget. Either way the socket holds
	// nothing, until a look sees the dump end (stalled) or the read end
	// (spent).
	stalled, spent bool
}

// New returns a gate that lists sockets with l (nil: none can be seen,
// and only this process's holds count). It lists once, to report whether
// readers can be seen (metrics.ReaderDetectionAvailable).
func New(cfg Config, l Lister) *Gate {
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultConfig.Linger
	}
	if cfg.MaxLinger < cfg.Linger {
		cfg.MaxLinger = max(DefaultConfig.MaxLinger, cfg.Linger)
	}
	if cfg.Stall <= 0 {
		cfg.Stall = DefaultConfig.Stall
	}
	if cfg.MaxStall < cfg.Stall {
		cfg.MaxStall = max(DefaultConfig.MaxStall, cfg.Stall)
	}
	if cfg.StallMargin < 1 {
		cfg.StallMargin = DefaultConfig.StallMargin
	}
	if cfg.Remember <= 0 {
		cfg.Remember = DefaultConfig.Remember
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	g := &Gate{lister: l, cfg: cfg, sockets: map[uint32]*reader{}, holds: map[int]time.Time{}}
	if l == nil {
		metrics.ReaderDetectionAvailable.Set(0)
		klog.InfoS("Other processes' reads of the ruleset cannot be seen; commits wait only for this process's own")
		return g
	}
	socks, err := l.Sockets()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.noteListing(err)
	if err == nil {
		g.observe(cfg.Clock.Now(), socks)
	}
	return g
}

// Reading looks at the sockets and reports whether a read that was under
// way at since (the start of the wait asking) still is at now, and still
// may hold commits: a socket of another process first seen, or seen
// dumping, less than its linger ago, whose dump has not stalled and whose
// read has not used up its budget; or a hold of this process.
func (g *Gate) Reading(since, now time.Time) bool {
	var socks []nftnl.Socket
	var err error
	if g.lister != nil {
		socks, err = g.lister.Sockets()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var ports []uint32
	if g.lister != nil {
		g.noteListing(err)
		if err == nil {
			g.observe(now, socks)
			ports = g.charge(since, now)
		}
	}
	held := false
	for _, start := range g.holds {
		held = held || !start.After(since)
	}
	if len(ports) == 0 && !held {
		return false
	}
	g.lastReaders, g.lastHeld = ports, held
	return true
}

// noteListing records whether a listing worked, logging and reporting a
// change.
func (g *Gate) noteListing(err error) {
	switch {
	case err != nil && (g.listErr == nil || !g.listed && g.listErr.Error() != err.Error()):
		klog.ErrorS(err, "Cannot see other processes' reads of the ruleset; commits wait only for this process's own")
	case err == nil && (g.listErr != nil || !g.listed):
		source := ""
		if s, ok := g.lister.(interface{ Source() string }); ok {
			source = s.Source()
		}
		klog.InfoS("Other processes' reads of the ruleset are visible", "source", source)
	}
	if err == nil {
		g.listed = true
		metrics.ReaderDetectionAvailable.Set(1)
	} else {
		metrics.ReaderDetectionAvailable.Set(0)
	}
	g.listErr = err
}

// observe updates what the gate knows from one listing at now.
func (g *Gate) observe(now time.Time, socks []nftnl.Socket) {
	seen := make(map[uint32]bool, len(socks))
	for _, s := range socks {
		seen[s.Inode] = true
		r := g.sockets[s.Inode]
		if r == nil {
			linger := g.cfg.Linger
			if now.Sub(g.learnedAt) < g.cfg.Remember {
				linger = max(linger, g.learned)
			}
			r = &reader{portID: s.PortID, readStart: now, lastDump: now, dumping: s.Dumping, linger: linger}
			if s.Dumping {
				r.dumpSince = now
			}
			g.sockets[s.Inode] = r
			continue
		}
		g.observeSocket(r, now, s.Dumping)
	}
	for ino := range g.sockets {
		if !seen[ino] {
			delete(g.sockets, ino)
		}
	}
}

// observeSocket updates what the gate knows of r from a look at now that
// saw it dumping or not.
func (g *Gate) observeSocket(r *reader, now time.Time, dumping bool) {
	switch {
	case dumping && !r.dumping:
		// A pause ends: if it is one the linger may have to cover, the
		// linger grows to cover it.
		if pause := now.Sub(r.lastDump); pause <= g.cfg.MaxLinger {
			r.linger = min(max(r.linger, time.Duration(float64(pause)*pauseMargin)), g.cfg.MaxLinger)
			if r.linger >= g.learned || now.Sub(g.learnedAt) >= g.cfg.Remember {
				g.learned, g.learnedAt = r.linger, now
			}
		}
		r.dumpSince = now
	case !dumping && r.dumping:
		// A dump ended between the last look and this one.
		if d := r.lastDump.Sub(r.dumpSince); d >= g.longestDump || now.Sub(g.dumpAt) >= g.cfg.Remember {
			g.longestDump, g.dumpAt = d, now
		}
		r.stalled = false
	case dumping && r.dumping && !r.stalled:
		if d := now.Sub(r.dumpSince); d >= g.stallLimit(now) {
			r.stalled = true
			metrics.ReadersIgnoredTotal.WithLabelValues(metrics.ReaderStalled).Inc()
			klog.InfoS("Commits no longer wait for a process whose dump of the ruleset has not moved: it stopped reading",
				"reader", describePort(r.portID), "dumping", d.Round(time.Millisecond))
		}
	}
	if dumping || r.dumping {
		r.lastDump = now
	}
	r.dumping = dumping
	switch {
	case dumping && r.readStart.IsZero():
		r.readStart, r.held, r.spent = now, 0, false // a new read
	case !dumping && !r.readStart.IsZero() && now.Sub(r.lastDump) >= r.linger:
		r.readStart, r.held, r.spent = time.Time{}, 0, false // the read ended
	}
}

// stallLimit is how long a dump may be seen running before its socket
// counts as stalled.
func (g *Gate) stallLimit(now time.Time) time.Duration {
	limit := g.cfg.Stall
	if now.Sub(g.dumpAt) < g.cfg.Remember {
		limit = max(limit, time.Duration(float64(g.longestDump)*g.cfg.StallMargin))
	}
	return min(limit, g.cfg.MaxStall)
}

// charge returns the ports of the sockets whose reads the wait that began
// at since waits for at now, and charges each the time since the last
// look of that wait.
func (g *Gate) charge(since, now time.Time) []uint32 {
	var elapsed time.Duration
	if since.Equal(g.waitSince) && now.After(g.lastLook) {
		elapsed = now.Sub(g.lastLook)
	}
	g.waitSince, g.lastLook = since, now
	var ports []uint32
	for _, r := range g.sockets {
		if !g.waitsFor(r, since, now) {
			continue
		}
		r.held += elapsed
		if g.cfg.Budget > 0 && r.held >= g.cfg.Budget {
			r.spent = true
			metrics.ReadersIgnoredTotal.WithLabelValues(metrics.ReaderBudgetSpent).Inc()
			klog.InfoS("Commits no longer wait for a read of the ruleset that held them for its whole budget",
				"reader", describePort(r.portID), "held", r.held.Round(time.Millisecond), "budget", g.cfg.Budget)
			continue
		}
		ports = append(ports, r.portID)
	}
	return ports
}

// waitsFor reports whether a wait that began at since waits for r's read
// at now.
func (g *Gate) waitsFor(r *reader, since, now time.Time) bool {
	switch {
	case r.readStart.IsZero() || r.readStart.After(since):
		return false // no read, or one that began during the wait
	case r.stalled || r.spent:
		return false
	}
	return r.dumping || now.Sub(r.lastDump) < r.linger
}

// Hold records a read of this process: Reading reports true, for waits
// that began after this call, until the returned function is called.
func (g *Gate) Hold() (release func()) {
	g.mu.Lock()
	id := g.nextID
	g.nextID++
	g.holds[id] = g.cfg.Clock.Now()
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		delete(g.holds, id)
		g.mu.Unlock()
	}
}

// WaitGone waits until no socket of another process has netlink port
// portID (a process that owned nftproxy's table exited), looking every
// interval on clk. It returns false if ctx ended first, or if the sockets
// cannot be listed.
func (g *Gate) WaitGone(ctx context.Context, clk clock.Clock, portID uint32, interval time.Duration) bool {
	if g.lister == nil {
		return false
	}
	for {
		socks, err := g.lister.Sockets()
		if err != nil {
			return false
		}
		if !slices.ContainsFunc(socks, func(s nftnl.Socket) bool { return s.PortID == portID }) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-clk.After(interval):
		}
	}
}

// Describe names the readers the last look that found a read saw, for a
// log line: the sockets' ports, with the process's name when this process
// can see it.
func (g *Gate) Describe() string {
	g.mu.Lock()
	ports, held := slices.Clone(g.lastReaders), g.lastHeld
	g.mu.Unlock()
	slices.Sort(ports)
	var parts []string
	for _, p := range ports {
		parts = append(parts, describePort(p))
	}
	if held {
		parts = append(parts, "this process")
	}
	return strings.Join(parts, ", ")
}

// describePort names a netlink port: the first socket a process binds
// without choosing a port gets its process id.
func describePort(port uint32) string {
	if int32(port) > 0 {
		if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", port)); err == nil {
			return fmt.Sprintf("%s (pid %d)", strings.TrimSpace(string(comm)), port)
		}
	}
	return fmt.Sprintf("port %d", int32(port))
}
