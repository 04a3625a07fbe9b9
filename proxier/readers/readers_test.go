package readers

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nftproxy/nftproxy/internal/testutil"
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
	cfg := Config{Linger: 100 * ms, MaxLinger: time.Second, Remember: time.Minute}
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
				if got := g.Reading(epoch.Add(lk.at)); got != lk.reading {
					t.Fatalf("at %v with %v: Reading = %v, want %v", lk.at, lk.socks, got, lk.reading)
				}
			}
		})
	}
}

func TestHold(t *testing.T) {
	g := New(Config{}, &fakeLister{})
	release := g.Hold()
	if !g.Reading(epoch) {
		t.Fatal("Reading = false while this process holds a read")
	}
	release()
	release() // twice: once counts
	if g.Reading(epoch) {
		t.Fatal("Reading = true after the hold was released")
	}
	release = g.Hold()
	if !g.Reading(epoch) {
		t.Fatal("a second release of the first hold released the second")
	}
	release()
}

func TestListingFails(t *testing.T) {
	l := &fakeLister{err: errors.New("sock_diag: permission denied")}
	g := New(Config{}, l)
	if g.Reading(epoch) {
		t.Fatal("Reading = true though no reader can be seen")
	}
	release := g.Hold()
	if !g.Reading(epoch) {
		t.Fatal("a hold of this process is not seen when the listing fails")
	}
	release()
}

func TestDescribe(t *testing.T) {
	l := &fakeLister{socks: []nftnl.Socket{{Inode: 1, PortID: 0xffff_fff0, Dumping: true}}}
	g := New(Config{Linger: 100 * ms}, l)
	if got := g.Describe(); got != "" {
		t.Errorf("Describe before any read = %q, want nothing", got)
	}
	g.Reading(epoch)
	release := g.Hold()
	g.Reading(epoch)
	if got, want := g.Describe(), "port -16, this process"; got != want {
		t.Errorf("Describe = %q, want %q", got, want)
	}
	release()
	l.socks = nil
	g.Reading(epoch.Add(time.Second)) // no read: the last one found stays
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
