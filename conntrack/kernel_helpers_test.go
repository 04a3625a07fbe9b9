package conntrack

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
)

// testNS is a fresh network namespace for one kernel test, with its own
// conntrack table (netns.New, nftproxy-ct-<random>, needing root, `ip`
// and `conntrack`; the latter only to build and check tables, never in the
// product). The root namespace is never touched: every socket of a test
// is opened in ns.
type testNS struct{ *netns.NS }

func newTestNS(t testing.TB) *testNS {
	t.Helper()
	return &testNS{netns.New(t, "nftproxy-ct", "conntrack")}
}

// run runs a command inside the namespace and returns its stdout.
func (ns *testNS) run(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := ns.Run(stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// netlink opens a Netlink on the namespace, without metrics.
func (ns *testNS) netlink(t testing.TB) *Netlink {
	t.Helper()
	n, err := NewNetlink(NetlinkOptions{NetNSFd: ns.Fd, NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// load inserts flows with `conntrack -R` (one conntrack process for all,
// about 1 s per 100,000 flows), each with a 600 s timeout. A conntrack
// without -R (bullseye's 1.4.6; bookworm's 1.4.7 has it) inserts them one
// process each, up to maxInsertsOneByOne: a test with more skips.
func (ns *testNS) load(t testing.TB, flows []Flow) {
	t.Helper()
	if !ns.conntrackLoads(t) {
		if len(flows) > maxInsertsOneByOne {
			t.Skipf("%s lacks -R (--load-file): %d flows would take one conntrack -I each", conntrackVersion(t, ns), len(flows))
		}
		for _, fl := range flows {
			ns.run(t, "", append([]string{"conntrack"}, strings.Fields(insertArgs(fl))...)...)
		}
		return
	}
	path := filepath.Join(t.TempDir(), "flows")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for _, fl := range flows {
		fmt.Fprintln(w, insertArgs(fl))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ns.run(t, "", "conntrack", "-R", path)
}

// maxInsertsOneByOne bounds the flows load inserts one conntrack
// process each.
const maxInsertsOneByOne = 1000

// conntrackLoads says whether the conntrack on the PATH reads a file of
// commands (-R, --load-file).
func (ns *testNS) conntrackLoads(t testing.TB) bool {
	t.Helper()
	empty := filepath.Join(t.TempDir(), "none")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ns.Run("", "conntrack", "-R", empty)
	return err == nil
}

// conntrackVersion is e.g. "conntrack v1.4.6".
func conntrackVersion(t testing.TB, ns *testNS) string {
	out, err := ns.Run("", "conntrack", "--version")
	if err != nil {
		return "conntrack"
	}
	f := strings.Fields(out)
	if len(f) >= 2 {
		return f[0] + " " + f[1]
	}
	return strings.TrimSpace(out)
}

// insertArgs is the `conntrack -I` command line of fl.
func insertArgs(fl Flow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-I -p %s -s %s -d %s --sport %d --dport %d --reply-src %s --reply-dst %s --reply-port-src %d --reply-port-dst %d -t 600",
		nft.ProtoName(fl.Proto), fl.Orig.Src.Addr(), fl.Orig.Dst.Addr(), fl.Orig.Src.Port(), fl.Orig.Dst.Port(),
		fl.Reply.Src.Addr(), fl.Reply.Dst.Addr(), fl.Reply.Src.Port(), fl.Reply.Dst.Port())
	switch fl.Proto {
	case ProtoTCP:
		if fl.Unanswered {
			b.WriteString(" --state SYN_SENT")
		} else {
			b.WriteString(" --state ESTABLISHED")
		}
	case ProtoSCTP:
		b.WriteString(" --state ESTABLISHED --orig-vtag 1 --reply-vtag 2")
	}
	if !fl.Unanswered {
		b.WriteString(" --status SEEN_REPLY")
	}
	if fl.Zone != 0 {
		fmt.Fprintf(&b, " --zone %d", fl.Zone)
	}
	return b.String()
}

// list returns the family's flows as `conntrack -L` prints them, with ID 0.
func (ns *testNS) list(t testing.TB, family Family) []Flow {
	t.Helper()
	fam := "ipv4"
	if family == IPv6 {
		fam = "ipv6"
	}
	var flows []Flow
	for _, line := range strings.Split(ns.run(t, "", "conntrack", "-L", "-f", fam), "\n") {
		if line == "" {
			continue
		}
		fl, err := parseListLine(line)
		if err != nil {
			t.Fatalf("conntrack -L line %q: %v", line, err)
		}
		flows = append(flows, fl)
	}
	return flows
}

// parseListLine reads a line of `conntrack -L`, e.g.
// "udp 17 599 src=10.1.0.1 dst=10.96.0.10 sport=1024 dport=53 [UNREPLIED]
// src=10.244.0.2 dst=10.1.0.1 sport=5353 dport=1024 mark=0 zone=7 use=1".
func parseListLine(line string) (Flow, error) {
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return Flow{}, fmt.Errorf("too short")
	}
	p, err := strconv.Atoi(fields[1])
	if err != nil {
		return Flow{}, err
	}
	fl := Flow{Proto: uint8(p)}
	var vals []string // src, dst, sport, dport, src, dst, sport, dport
	for _, f := range fields[2:] {
		k, v, ok := strings.Cut(f, "=")
		switch {
		case f == "[UNREPLIED]":
			fl.Unanswered = true
		case !ok:
		case k == "src" || k == "dst" || k == "sport" || k == "dport":
			vals = append(vals, v)
		case k == "zone":
			z, err := strconv.Atoi(v)
			if err != nil {
				return fl, err
			}
			fl.Zone = uint16(z)
		}
	}
	if len(vals) != 8 {
		return fl, fmt.Errorf("want 8 src/dst/sport/dport fields, got %d", len(vals))
	}
	ap := func(a, p string) (netip.AddrPort, error) {
		addr, err := netip.ParseAddr(a)
		if err != nil {
			return netip.AddrPort{}, err
		}
		port, err := strconv.ParseUint(p, 10, 16)
		return netip.AddrPortFrom(addr, uint16(port)), err
	}
	var errs [4]error
	fl.Orig.Src, errs[0] = ap(vals[0], vals[2])
	fl.Orig.Dst, errs[1] = ap(vals[1], vals[3])
	fl.Reply.Src, errs[2] = ap(vals[4], vals[6])
	fl.Reply.Dst, errs[3] = ap(vals[5], vals[7])
	for _, err := range errs {
		if err != nil {
			return fl, err
		}
	}
	return fl, nil
}

// withoutIDs returns flows with their IDs cleared, to compare with list.
func withoutIDs(flows []Flow) []Flow {
	out := make([]Flow, len(flows))
	for i, fl := range flows {
		fl.ID = 0
		out[i] = fl
	}
	return out
}

// socketInNS opens a socket inside the namespace: the socket stays there
// once the thread returns to its own namespace.
func (ns *testNS) socketInNS(t testing.TB, domain, typ, proto int) int {
	t.Helper()
	var fd int
	var err error
	ns.Do(t, func() { fd, err = unix.Socket(domain, typ, proto) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func reconcileCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "(unknown)"
	}
	return unix.ByteSliceToString(u.Release[:])
}
