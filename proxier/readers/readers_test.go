package readers

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft/nftnl"
)

const ms = time.Millisecond

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeLister answers with what the test set.
type fakeLister struct {
	socks []nftnl.Socket
	err   error
}

func (f *fakeLister) Sockets() ([]nftnl.Socket, error) { return f.socks, f.err }

// look is one listing: at, the sockets seen (inode: dumping), and whether
// the gate must then say a read is under way.
type look struct {
	at      time.Duration
	socks   map[uint32]bool
	reading bool
}

func TestReading(t *testing.T) {
	// No stall within these looks (TestStall).
	cfg := Config{Linger: 100 * ms, MaxLinger: time.Second, Remember: time.Minute, Stall: time.Minute}
	nft := func(dumping bool) map[uint32]bool { return map[uint32]bool{7: dumping} }
	tests := []struct {
		name  string
		looks []look
	}{
		{
			name:  "nobody",
			looks: []look{{0, nil, false}, {time.Second, nil, false}},
		},
		{
			name: "a new socket reads for the linger, dumping or not",
			looks: []look{{0, nft(false), true}, {99 * ms, nft(false), true}, {100 * ms, nft(false), false},
				{5 * time.Second, nft(false), false}},
		},
		{
			name: "a dump seen keeps it reading for the linger after it was last seen",
			looks: []look{{0, nft(true), true}, {500 * ms, nft(true), true}, {550 * ms, nft(false), true},
				// last seen dumping at 500, ended by 550: reading until 650
				{649 * ms, nft(false), true}, {650 * ms, nft(false), false}},
		},
		{
			name: "a pause it made grows its linger",
			looks: []look{{0, nft(true), true}, {10 * ms, nft(false), true},
				// a 300 ms pause (from 10 to 310): the linger becomes 450 ms
				{110 * ms, nft(false), false}, {310 * ms, nft(true), true}, {320 * ms, nft(false), true},
				{769 * ms, nft(false), true}, {770 * ms, nft(false), false}},
		},
		{
			name: "a new socket starts with the linger another grew to",
			looks: []look{{0, nft(true), true}, {10 * ms, nft(false), true},
				{310 * ms, nft(true), true}, {320 * ms, map[uint32]bool{}, false},
				// socket 8, a minute later, starts with 450 ms
				{30 * time.Second, map[uint32]bool{8: true}, true}, {30010 * ms, map[uint32]bool{8: false}, true},
				{30459 * ms, map[uint32]bool{8: false}, true}, {30460 * ms, map[uint32]bool{8: false}, false}},
		},
		{
			name: "what a socket grew to is forgotten after Remember",
			looks: []look{{0, nft(true), true}, {10 * ms, nft(false), true},
				{310 * ms, nft(true), true}, {320 * ms, map[uint32]bool{}, false},
				{2 * time.Minute, map[uint32]bool{8: true}, true}, {120010 * ms, map[uint32]bool{8: false}, true},
				{120110 * ms, map[uint32]bool{8: false}, false}},
		},
		{
			name: "the linger stops at MaxLinger",
			looks: []look{{0, nft(true), true}, {10 * ms, nft(false), true},
				{910 * ms, nft(true), true}, {920 * ms, nft(false), true},
				{1919 * ms, nft(false), true}, {1920 * ms, nft(false), false}},
		},
		{
			name: "a pause longer than MaxLinger is another read: the linger stays",
			looks: []look{{0, nft(true), true}, {10 * ms, nft(false), true},
				{5010 * ms, nft(true), true}, {5020 * ms, nft(false), true},
				{5119 * ms, nft(false), true}, {5120 * ms, nft(false), false}},
		},
		{
			name: "a closed socket is forgotten; its inode again is a new socket",
			looks: []look{{0, nft(true), true}, {time.Second, nil, false}, {1050 * ms, nft(false), true},
				{1150 * ms, nft(false), false}},
		},
		{
			name: "two readers: reading until both are done",
			looks: []look{{0, map[uint32]bool{1: true, 2: true}, true},
				{200 * ms, map[uint32]bool{1: false, 2: true}, true},
				{250 * ms, map[uint32]bool{1: false, 2: false}, true},
				{349 * ms, map[uint32]bool{1: false, 2: false}, true},
				{350 * ms, map[uint32]bool{1: false, 2: false}, false}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &fakeLister{}
			g := New(cfg, l)
			for _, lk := range tt.looks {
				l.socks = nil
				for ino, dumping := range lk.socks {
					l.socks = append(l.socks, nftnl.Socket{Inode: ino, PortID: 1000 + ino, Dumping: dumping})
				}
				now := epoch.Add(lk.at)
				if got := g.Reading(now, now); got != lk.reading {
					t.Fatalf("at %v with %v: Reading = %v, want %v", lk.at, lk.socks, got, lk.reading)
				}
			}
		})
	}
}

func TestHold(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(epoch)
	g := New(Config{Clock: clk}, &fakeLister{})
	release := g.Hold()
	if !g.Reading(epoch, epoch) {
		t.Fatal("Reading = false while this process holds a read")
	}
	release()
	release() // twice: once counts
	if g.Reading(epoch, epoch) {
		t.Fatal("Reading = true after the hold was released")
	}
	release = g.Hold()
	second := g.Hold()
	release()
	if !g.Reading(epoch, epoch) {
		t.Fatal("the release of the first hold released the second")
	}
	second()
	// A hold taken while a sync waits is not waited for.
	clk.SetTime(epoch.Add(time.Second))
	release = g.Hold()
	if g.Reading(epoch, epoch.Add(2*time.Second)) {
		t.Fatal("a wait that began before the hold waits for it")
	}
	if !g.Reading(epoch.Add(time.Second), epoch.Add(2*time.Second)) {
		t.Fatal("a wait that began with the hold does not wait for it")
	}
	release()
}

// TestWithoutListing: when the sockets cannot be listed (or there is no
// lister), this process's holds still count, and the gauge says other
// processes' reads are not seen.
func TestWithoutListing(t *testing.T) {
	for _, tt := range []struct {
		name string
		l    Lister
	}{
		{"no lister", nil},
		{"the listing fails", &fakeLister{err: errors.New("sock_diag: permission denied")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			metrics.ReaderDetectionAvailable.Set(1)
			g := New(Config{Clock: clocktesting.NewFakePassiveClock(epoch)}, tt.l)
			if got := testutil.Value(t, metrics.ReaderDetectionAvailable); got != 0 {
				t.Errorf("%s = %v, want 0", "nftproxy_reader_detection_available", got)
			}
			if g.Reading(epoch, epoch) {
				t.Fatal("Reading = true though no reader can be seen")
			}
			release := g.Hold()
			if !g.Reading(epoch, epoch) {
				t.Fatal("a hold of this process is not seen")
			}
			release()
			if g.WaitGone(context.Background(), clocktesting.NewFakeClock(epoch), 42, time.Second) {
				t.Error("WaitGone = true though no socket can be seen")
			}
		})
	}
	l := &fakeLister{err: errors.New("sock_diag: permission denied")}
	g := New(Config{}, l)
	l.err = nil
	g.Reading(epoch, epoch)
	if got := testutil.Value(t, metrics.ReaderDetectionAvailable); got != 1 {
		t.Errorf("%s = %v after a listing worked, want 1", "nftproxy_reader_detection_available", got)
	}
}

func TestDescribe(t *testing.T) {
	l := &fakeLister{socks: []nftnl.Socket{{Inode: 1, PortID: 0xffff_fff0, Dumping: true}}}
	g := New(Config{Linger: 100 * ms, Clock: clocktesting.NewFakePassiveClock(epoch)}, l)
	if got := g.Describe(); got != "" {
		t.Errorf("Describe before any read = %q, want nothing", got)
	}
	g.Reading(epoch, epoch)
	release := g.Hold()
	g.Reading(epoch, epoch)
	if got, want := g.Describe(), "port -16, this process"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	release()
	l.socks = nil
	g.Reading(epoch.Add(time.Second), epoch.Add(time.Second)) // no read: the last one found stays
	if got, want := g.Describe(), "port -16, this process"; got != want {
		t.Errorf("Describe after the reads ended = %q, want %q", got, want)
	}
}

func TestWaitGone(t *testing.T) {
	l := &fakeLister{socks: []nftnl.Socket{{Inode: 1, PortID: 42}}}
	g := New(Config{}, l)
	clk := clocktesting.NewFakeClock(epoch)
	done := make(chan bool)
	go func() { done <- g.WaitGone(context.Background(), clk, 42, 200*ms) }()
	testutil.Eventually(t, "WaitGone's first look", clk.HasWaiters)
	select {
	case <-done:
		t.Fatal("WaitGone returned while the socket is open")
	default:
	}
	l.socks = nil // not safe to race: the waiter sleeps on the fake clock
	clk.Step(200 * ms)
	if !<-done {
		t.Fatal("WaitGone = false after the socket closed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.socks = []nftnl.Socket{{Inode: 1, PortID: 42}}
	cancel()
	if g.WaitGone(ctx, clk, 42, 200*ms) {
		t.Fatal("WaitGone = true after ctx ended")
	}
}

// step is one look of a wait that began at since.
type step struct {
	at, since time.Duration
	socks     map[uint32]bool // inode: dumping
	reading   bool
}

// polls are the looks of one wait that began at from, every 10 ms until
// to (inclusive), with the sockets socks(t) and the answer want(t).
func polls(from, to time.Duration, socks func(t time.Duration) map[uint32]bool, want func(t time.Duration) bool) []step {
	var out []step
	for at := from; at <= to; at += 10 * ms {
		out = append(out, step{at, from, socks(at), want(at)})
	}
	return out
}

func dumping(v bool) func(time.Duration) map[uint32]bool {
	return func(time.Duration) map[uint32]bool { return map[uint32]bool{7: v} }
}

// bursts: socket 7 dumps for 10 ms out of every 20 (a reader at work).
func bursts(t time.Duration) map[uint32]bool { return map[uint32]bool{7: t%(20*ms) == 0} }

func until(end time.Duration) func(time.Duration) bool {
	return func(t time.Duration) bool { return t < end }
}

func always(v bool) func(time.Duration) bool { return func(time.Duration) bool { return v } }

func runSteps(t *testing.T, cfg Config, steps []step) {
	t.Helper()
	l := &fakeLister{}
	cfg.Clock = clocktesting.NewFakePassiveClock(epoch)
	g := New(cfg, l)
	for _, st := range steps {
		l.socks = nil
		for ino, d := range st.socks {
			l.socks = append(l.socks, nftnl.Socket{Inode: ino, PortID: 1000 + ino, Dumping: d})
		}
		if got := g.Reading(epoch.Add(st.since), epoch.Add(st.at)); got != st.reading {
			t.Fatalf("at %v (wait since %v) with %v: Reading = %v, want %v", st.at, st.since, st.socks, got, st.reading)
		}
	}
}

// TestStall: a socket whose dump is seen running look after look for
// longer than the stall limit holds nothing until a look sees the dump
// end; the limit grows with the dumps seen to end.
func TestStall(t *testing.T) {
	cfg := Config{Linger: 100 * ms, MaxLinger: time.Second, Stall: 250 * ms, MaxStall: 2 * time.Second, StallMargin: 4,
		Remember: time.Minute}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name:  "a dump that does not move stalls",
			steps: polls(0, 2*time.Second, dumping(true), until(250*ms)),
		},
		{
			name:  "short dumps keep it reading",
			steps: polls(0, 5*time.Second, bursts, always(true)),
		},
		{
			name: "a stalled dump that ends holds again, for the linger",
			steps: slices.Concat(polls(0, time.Second, dumping(true), until(250*ms)),
				[]step{{1010 * ms, 0, map[uint32]bool{7: false}, true}, {1100 * ms, 0, map[uint32]bool{7: false}, true},
					{1110 * ms, 0, map[uint32]bool{7: false}, false}}),
		},
		{
			name: "a stalled socket stays stalled between waits",
			steps: slices.Concat(polls(0, 300*ms, dumping(true), until(250*ms)),
				polls(5*time.Second, 5100*ms, dumping(true), always(false))),
		},
		{
			name: "the limit grows to StallMargin times the longest dump seen to end",
			steps: slices.Concat(
				// a 200 ms dump, seen to end: the limit becomes 800 ms
				polls(0, 200*ms, dumping(true), always(true)),
				[]step{{210 * ms, 0, map[uint32]bool{7: false}, true}},
				polls(300*ms, 1500*ms, dumping(true), until(1100*ms))),
		},
		{
			name: "the limit stops at MaxStall",
			steps: slices.Concat(
				polls(0, 1500*ms, dumping(true), until(250*ms)),
				[]step{{1510 * ms, 0, map[uint32]bool{7: false}, true}},
				polls(1600*ms, 4*time.Second, dumping(true), until(3600*ms))),
		},
		{
			name: "a new socket starts with the limit learned; it is forgotten after Remember",
			steps: slices.Concat(
				polls(0, 200*ms, dumping(true), always(true)),
				[]step{{210 * ms, 0, map[uint32]bool{7: false}, true}, {300 * ms, 300 * ms, nil, false}},
				polls(10*time.Second, 11*time.Second, func(time.Duration) map[uint32]bool { return map[uint32]bool{8: true} },
					until(10800*ms)),
				[]step{{11010 * ms, 0, nil, false}},
				polls(2*time.Minute, 2*time.Minute+time.Second, func(time.Duration) map[uint32]bool { return map[uint32]bool{9: true} },
					until(2*time.Minute+250*ms))),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, cfg, tt.steps) })
	}
}

// TestBudget: one read holds commits for at most Budget in all, however
// many waits it spans; a read that ended and a new one get a new budget.
func TestBudget(t *testing.T) {
	cfg := Config{Linger: 100 * ms, MaxLinger: time.Second, Stall: time.Minute, Budget: time.Second, Remember: time.Minute}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name:  "a read that never ends holds one budget",
			steps: slices.Concat(polls(0, 600*ms, bursts, always(true)), polls(700*ms, 2*time.Second, bursts, until(1100*ms))),
		},
		{
			name: "a read that ended gets a new budget",
			steps: slices.Concat(polls(0, 1200*ms, bursts, until(time.Second)),
				// idle for longer than the linger: the read ends
				[]step{{1300 * ms, 1300 * ms, map[uint32]bool{7: false}, false},
					{1450 * ms, 1450 * ms, map[uint32]bool{7: false}, false}},
				polls(1500*ms, 2700*ms, bursts, until(2500*ms))),
		},
		{
			name: "time between waits is not charged",
			steps: slices.Concat(polls(0, 500*ms, bursts, always(true)), polls(5*time.Second, 5400*ms, bursts, always(true)),
				polls(10*time.Second, 10200*ms, bursts, until(10100*ms))),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, cfg, tt.steps) })
	}
	spent := testutil.Value(t, metrics.ReadersIgnoredTotal.WithLabelValues(metrics.ReaderBudgetSpent))
	runSteps(t, cfg, polls(0, 1200*ms, bursts, until(time.Second)))
	if got := testutil.Value(t, metrics.ReadersIgnoredTotal.WithLabelValues(metrics.ReaderBudgetSpent)) - spent; got != 1 {
		t.Errorf("%v reads counted as having spent their budget, want 1", got)
	}
}

// TestWaitIsForReadsUnderWay: a wait waits for the reads under way when it
// began, not for one that starts meanwhile; the next wait does.
func TestWaitIsForReadsUnderWay(t *testing.T) {
	cfg := Config{Linger: 100 * ms, MaxLinger: time.Second, Stall: time.Minute, Remember: time.Minute}
	both := func(a, b bool) map[uint32]bool { return map[uint32]bool{1: a, 2: b} }
	runSteps(t, cfg, []step{
		{0, 0, map[uint32]bool{1: true}, true},
		{50 * ms, 0, both(true, true), true},                 // 2 began during the wait
		{100 * ms, 0, map[uint32]bool{2: true}, false},       // 1 is gone: the sync goes
		{110 * ms, 110 * ms, map[uint32]bool{2: true}, true}, // the next wait waits for 2
		{200 * ms, 110 * ms, map[uint32]bool{2: true}, true},
		{210 * ms, 110 * ms, nil, false},
	})
}
