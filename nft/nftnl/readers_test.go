package nftnl

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

func TestDecodeDiagMsg(t *testing.T) {
	msg := make([]byte, diagMsgLen)
	msg[4], msg[16] = 0x2a, 0x07 // port 42, inode 7 (little-endian machines)
	flags := func(v byte) []byte { return []byte{8, 0, diagAttrFlags, 0, v, 0, 0, 0} }
	tests := []struct {
		name string
		b    []byte
		want Socket
		bad  bool
	}{
		{"no attributes", msg, Socket{Inode: 7, PortID: 42}, false},
		{"dumping", slices.Concat(msg, flags(diagFlagDumping)), Socket{Inode: 7, PortID: 42, Dumping: true}, false},
		{"other flags", slices.Concat(msg, flags(0x20)), Socket{Inode: 7, PortID: 42}, false},
		{"short message", msg[:20], Socket{}, true},
		{"short flags", slices.Concat(msg, []byte{6, 0, diagAttrFlags, 0, 1, 0, 0, 0}), Socket{}, true},
		{"attribute past the end", slices.Concat(msg, []byte{12, 0, diagAttrFlags, 0, 1, 0, 0, 0}), Socket{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeDiagMsg(tt.b)
			if tt.bad {
				if err == nil {
					t.Fatalf("decodeDiagMsg = %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("decodeDiagMsg = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// TestSocketLister: another process's netfilter sockets are listed, with
// their port and whether a dump runs on them; this process's are not.
func TestSocketLister(t *testing.T) {
	ns := newTestNS(t)
	l, err := NewSocketLister(ns.Fd)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ns.netlink(t) // ours: never listed
	if socks, err := l.Sockets(); err != nil || len(socks) != 0 {
		t.Fatalf("Sockets with only this process's socket = %v, %v; want none", socks, err)
	}

	// A reader with something to read for a while: a set of 300,000
	// elements, listed over and over.
	var set strings.Builder
	set.WriteString("table ip t { set s { type ipv4_addr; elements = { ")
	for i := range 300_000 {
		fmt.Fprintf(&set, "10.%d.%d.%d, ", i>>16, (i>>8)&255, i&255)
	}
	set.WriteString("10.255.255.255 }; }; }")
	ns.mustNft(t, set.String(), "-f", "-")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reader := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, "sh", "-c",
		"while :; do nft list ruleset >/dev/null; done")
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	defer reader.Wait()
	defer cancel()

	deadline := time.Now().Add(time.Minute)
	var seen, dumping bool
	for time.Now().Before(deadline) && !dumping {
		socks, err := l.Sockets()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range socks {
			seen = true
			if s.PortID == 0 || s.Inode == 0 {
				t.Fatalf("socket %+v: want a port and an inode", s)
			}
			dumping = dumping || s.Dumping
		}
		time.Sleep(time.Millisecond)
	}
	if !seen || !dumping {
		t.Fatalf("in a minute of `nft list ruleset` in a loop: a socket seen %v, a dump seen %v", seen, dumping)
	}
}

func TestParseProcNetlink(t *testing.T) {
	const header = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n"
	tests := []struct {
		name string
		in   string
		want []Socket
		bad  bool
	}{
		{"only the header", header, nil, false},
		{"netfilter sockets, others skipped", header +
			"000000003360a3df 0   0          00000000 0        0        0     2        0        4       \n" +
			"00000000b1c9b2cd 12  4242       00000000 21888    0        1     2        0        90125   \n" +
			"0000000011aa22bb 12  4294963200 00000000 0        0        0     2        0        90126   \n",
			[]Socket{{Inode: 90125, PortID: 4242, Dumping: true}, {Inode: 90126, PortID: 0xfffff000}}, false},
		{"a column missing", "sk Eth Pid Groups Rmem Wmem Locks Drops Inode\n", nil, true},
		{"a short line", header + "00000000b1c9b2cd 12 4242\n", nil, true},
		{"not a number", header + "00000000b1c9b2cd 12  x          00000000 0        0        1     2        0        9       \n", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseProcNetlink([]byte(tt.in))
			if tt.bad {
				if err == nil {
					t.Fatalf("parseProcNetlink = %+v, want an error", got)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("parseProcNetlink = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// startMonitor starts `nft monitor` in ns (a process that keeps a
// netfilter socket open and never dumps) and returns its socket, as seen
// by a lister of its own.
func startMonitor(t *testing.T, ns *testNS) Socket {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mon := exec.CommandContext(ctx, "ip", "netns", "exec", ns.Name, "nft", "monitor")
	if err := mon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); mon.Wait() })
	l, err := NewSocketLister(ns.Fd)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		socks, err := l.Sockets()
		if err != nil {
			t.Fatal(err)
		}
		if len(socks) == 1 {
			return socks[0]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("nft monitor's socket not seen in 30 s")
	return Socket{}
}

// sameSockets says whether socks is the one socket want, whatever either
// says of a dump: nft monitor reads the ruleset when it starts, a dump
// a listing may or may not catch (under emulation, it did).
func sameSockets(socks []Socket, want Socket) bool {
	return len(socks) == 1 && socks[0].Inode == want.Inode && socks[0].PortID == want.PortID
}

// TestSocketListerSkipsStaleReplies: a reply to an earlier request left in
// the socket is not taken for the answer to the next one.
func TestSocketListerSkipsStaleReplies(t *testing.T) {
	ns := newTestNS(t)
	l, err := NewSocketLister(ns.Fd)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A request whose reply (no socket but ours) is never read, as after
	// a listing that gave up half way.
	l.mu.Lock()
	if _, err := l.request(); err != nil {
		t.Fatal(err)
	}
	l.mu.Unlock()
	want := startMonitor(t, ns)
	socks, err := l.Sockets()
	if errors.Is(err, unix.EBUSY) {
		// A kernel that keeps a dump running until its reply is read
		// (Debian's 6.1 and 5.10 do, for one that fits a datagram;
		// 6.12 ends it at once) refuses a second dump on the socket:
		// the listing fails, and the next one opens a new socket.
		t.Logf("the kernel refused a second dump on the socket: %v", err)
		socks, err = l.Sockets()
	}
	if err != nil || !sameSockets(socks, want) {
		t.Fatalf("Sockets after a stale reply = %v, %v; want %v", socks, err, []Socket{want})
	}
}

// TestSocketListerReopens: after a listing failed, the next one opens a
// new socket instead of reading what the old one left.
func TestSocketListerReopens(t *testing.T) {
	ns := newTestNS(t)
	want := startMonitor(t, ns)
	l, err := NewSocketLister(ns.Fd)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.mu.Lock()
	l.conn.Close() // the listing fails
	l.mu.Unlock()
	if socks, err := l.Sockets(); err == nil {
		t.Fatalf("Sockets on a closed socket = %v, want an error", socks)
	}
	if socks, err := l.Sockets(); err != nil || !sameSockets(socks, want) || l.Source() != SourceSockDiag {
		t.Fatalf("Sockets after a failure = %v, %v (from %s); want %v from a new sock_diag socket", socks, err, l.Source(), want)
	}
}

// TestSocketListerProcFallback: a lister of the current namespace whose
// sock_diag socket cannot be opened reads /proc/net/netlink, and sees the
// same sockets.
func TestSocketListerProcFallback(t *testing.T) {
	ns := newTestNS(t)
	want := startMonitor(t, ns)
	ns.Do(t, func() {
		l, err := NewSocketLister(0)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		l.mu.Lock()
		l.conn.Close()
		l.conn = nil
		l.dial = func() (*netlink.Conn, error) { return nil, errors.New("sock_diag refused") }
		l.mu.Unlock()
		socks, err := l.Sockets()
		if err != nil || !sameSockets(socks, want) || l.Source() != SourceProcFS {
			t.Fatalf("Sockets without sock_diag = %v, %v (from %s); want %v from procfs", socks, err, l.Source(), want)
		}
	})
}
