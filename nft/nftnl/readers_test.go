package nftnl

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
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
