// Package readers tells whether another process is in the middle of
// reading the ruleset, so that a commit can wait for the read to end
// instead of making it start over.
//
// Every nftables commit moves the network namespace's ruleset generation;
// a dump that spans one is interrupted, and nft, libnftables, iptables-nft
// and our own reads then read everything again, with no limit. Under a
// stream of changes, committing at their pace keeps every reader of the
// ruleset from ever finishing (`nft list ruleset` never returns).
//
// The kernel does not say who reads, but sock_diag says of every netlink
// socket whether a dump is running on it (nftnl.SocketLister). A socket of
// another process is taken to be reading from the moment it is first seen,
// and again each time a dump is seen running on it, until none has been
// seen for its linger. The linger covers the pauses a reader makes between
// its dumps (nft decodes what it read, and reads the generation again at
// the end): it grows to 1.5 times the longest pause the socket was seen to
// make, at most Config.MaxLinger. A pause longer than MaxLinger is not a
// pause but a new read (a process that keeps its socket and reads now and
// then). A new socket starts at Config.Linger, or at what another socket
// grew to in the last Config.Remember: the pauses come from the size of
// the ruleset read, which the next reader reads too.
//
// Reads of this process (the traffic counters' scrape) take a Hold.
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
	// Remember is how long a linger a socket grew to is a new socket's
	// first.
	Remember time.Duration
}

// DefaultConfig is what nftproxy runs with (docs/operations.md, "A busy
// node").
var DefaultConfig = Config{Linger: 250 * time.Millisecond, MaxLinger: 2 * time.Second, Remember: 10 * time.Minute}

// pauseMargin is how much longer than the longest pause seen a socket's
// linger is: pauses vary, and the runner sees a socket only when it looks.
const pauseMargin = 1.5

// Gate tracks other processes' reads of the ruleset. It is safe for
// concurrent use.
type Gate struct {
	lister Lister
	cfg    Config

	mu      sync.Mutex
	sockets map[uint32]*reader // by inode
	holds   int                // reads of this process under way
	listErr error              // the last listing's error, logged once
	// learned is the longest linger a socket grew to, at learnedAt.
	learned   time.Duration
	learnedAt time.Time
	// lastReaders are the ports of the sockets that were reading at the
	// last look that found a read, and lastHeld whether this process was.
	lastReaders []uint32
	lastHeld    bool
}

// reader is what the gate knows of one socket.
type reader struct {
	portID   uint32
	lastDump time.Time // or first seen
	dumping  bool      // at the last look
	linger   time.Duration
}

// New returns a gate that lists sockets with l.
func New(cfg Config, l Lister) *Gate {
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultConfig.Linger
	}
	if cfg.MaxLinger < cfg.Linger {
		cfg.MaxLinger = max(DefaultConfig.MaxLinger, cfg.Linger)
	}
	if cfg.Remember <= 0 {
		cfg.Remember = DefaultConfig.Remember
	}
	return &Gate{lister: l, cfg: cfg, sockets: map[uint32]*reader{}}
}

// Reading looks at the sockets and reports whether a read is under way at
// now: a socket of another process was first seen, or seen dumping, less
// than its linger ago, or this process holds a read.
func (g *Gate) Reading(now time.Time) bool {
	socks, err := g.lister.Sockets()
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		if g.listErr == nil {
			klog.ErrorS(err, "Cannot see other processes' reads of the ruleset; commits do not wait for them")
		}
		g.listErr = err
		return g.holds > 0
	}
	if g.listErr != nil {
		klog.InfoS("Other processes' reads of the ruleset are visible again")
		g.listErr = nil
	}
	g.observe(now, socks)
	var ports []uint32
	for _, r := range g.sockets {
		if now.Sub(r.lastDump) < r.linger {
			ports = append(ports, r.portID)
		}
	}
	if len(ports) == 0 && g.holds == 0 {
		return false
	}
	g.lastReaders, g.lastHeld = ports, g.holds > 0
	return true
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
			g.sockets[s.Inode] = &reader{portID: s.PortID, lastDump: now, dumping: s.Dumping, linger: linger}
			continue
		}
		if s.Dumping && !r.dumping {
			// A pause ends: if it is one the linger may have to cover,
			// the linger grows to cover it.
			if pause := now.Sub(r.lastDump); pause <= g.cfg.MaxLinger {
				r.linger = min(max(r.linger, time.Duration(float64(pause)*pauseMargin)), g.cfg.MaxLinger)
				if r.linger >= g.learned || now.Sub(g.learnedAt) >= g.cfg.Remember {
					g.learned, g.learnedAt = r.linger, now
				}
			}
		}
		if s.Dumping || r.dumping {
			r.lastDump = now
		}
		r.dumping = s.Dumping
	}
	for ino := range g.sockets {
		if !seen[ino] {
			delete(g.sockets, ino)
		}
	}
}

// Hold records a read of this process: Reading reports true until the
// returned function is called.
func (g *Gate) Hold() (release func()) {
	g.mu.Lock()
	g.holds++
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.holds--
			g.mu.Unlock()
		})
	}
}

// WaitGone waits until no socket of another process has netlink port
// portID (a process that owned nftproxy's table exited), looking every
// interval on clk. It returns false if ctx ended first, or if the sockets
// cannot be listed.
func (g *Gate) WaitGone(ctx context.Context, clk clock.Clock, portID uint32, interval time.Duration) bool {
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
