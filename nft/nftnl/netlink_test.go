package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
)

// checkListing checks a kernel listing against the ruleset: equal to Dump
// once both are in Canonical form (blocks sorted by name, elements sorted
// one per line), free of raw bytecode, accepted by `nft -c -f` in place of
// the table, with every random DNAT cascade fair (checkCascades).
func checkListing(t *testing.T, ns *testNS, rs *nft.Ruleset, listing string) {
	t.Helper()
	if got, want := nft.Canonical(listing), ns.dumped(t, rs); got != want {
		t.Errorf("nft list differs from Dump\n--- nft list (canonical):\n%s\n--- Dump (as this nft lists it):\n%s", got, want)
	}
	// Signs of bytecode nft could not decompile: raw registers and
	// expressions, numbers for types.
	for _, bad := range []string{"reg ", "[ ", "type 0 ", "unknown", "invalid type"} {
		if strings.Contains(listing, bad) {
			t.Errorf("listing contains %q:\n%s", bad, listing)
		}
	}
	checkCascades(t, listing)
	// In place of the table: nft declares a pick map with the key type
	// integer where we write mark (setKeyMagic), and the kernel refuses
	// to redeclare an existing set with another key type (EEXIST).
	reload := fmt.Sprintf("delete table %s %s\n%s", rs.Family, nft.TableName, listing)
	ns.nftReads(t, reload, func(t *testing.T) {
		if _, err := ns.nft(reload, "-c", "-f", "-"); err != nil {
			t.Errorf("nft -c -f rejects the listing: %v", err)
		}
	})
}

// checkCascades fails unless every chain of a listing (or of a Dump) that
// DNATs picks among its backends uniformly; see cascadeErrors.
func checkCascades(t *testing.T, listing string) {
	t.Helper()
	for _, e := range cascadeErrors(listing) {
		t.Error(e)
	}
}

var (
	chainStartRE = regexp.MustCompile(`^\tchain (\S+) \{$`)
	cascadeRE    = regexp.MustCompile(`numgen random mod (\d+) 0 dnat to `)
	// (nft 0.9.8 lists `dnat ip addr . port to` where later ones list
	// `dnat ip to`: nfttest.NftDNATToConcatMap.)
	dnatMapRE  = regexp.MustCompile(`^\t\tmeta l4proto (tcp|udp|sctp) dnat ip6? (?:addr \. port )?to numgen random mod 65536( offset \d+)? map @\S+$`)
	dnatPickRE = regexp.MustCompile(`^\t\tdnat ip6? (?:addr \. port )?to ip6? daddr \. (tcp|udp|sctp) dport \. numgen random mod (\d+) map @\S+-n(\d+)$`)
)

// cascadeErrors checks the random DNAT cascades of a listing: in each
// chain, the n rules that DNAT must be guarded by `numgen random mod n 0`,
// `mod n-1 0`, …, `mod 2 0`, and the last one by nothing (with n = 1: one
// unguarded rule); no other rule may draw a random number. Then rule i is
// taken with probability 1/(n-i) once the rules before it were not, so each
// backend gets 1/n. Canonical(listing) == Dump() shows that the kernel holds
// what we wrote; this shows that what we wrote is fair, which that
// comparison cannot: a guarded last rule lets connections through without
// DNAT, an off-by-one skews the odds, a byte-swapped modulus (mod 50331648)
// starves every backend but the last.
func cascadeErrors(listing string) []string {
	var errs []string
	chain := ""
	var mods []int // per DNAT rule of the chain: its modulus, 0 if unguarded
	for _, l := range strings.Split(listing, "\n") {
		if m := chainStartRE.FindStringSubmatch(l); m != nil {
			chain, mods = m[1], nil
			continue
		}
		if chain == "" {
			continue
		}
		if l == "\t}" {
			for i, k := range mods {
				want := len(mods) - i
				if i == len(mods)-1 {
					want = 0
				}
				if k != want {
					errs = append(errs, fmt.Sprintf("chain %s: DNAT rule %d of %d has numgen modulus %d, want %d (0: none)",
						chain, i+1, len(mods), k, want))
				}
			}
			chain = ""
			continue
		}
		m := cascadeRE.FindStringSubmatch(l)
		pick := dnatPickRE.FindStringSubmatch(l)
		switch {
		case dnatMapRE.MatchString(l):
			// A DNAT through an endpoints map, whose ranges
			// EndpointsElements makes fair (TestEndpointsElements).
		case pick != nil:
			// A DNAT through a pick map, one element per number drawn:
			// fair if the draw covers the map's N (its name's).
			if pick[2] != pick[3] {
				errs = append(errs, fmt.Sprintf("chain %s: numgen modulus %s on a map of %s endpoints: %s", chain, pick[2], pick[3], strings.TrimSpace(l)))
			}
		case m != nil:
			k, _ := strconv.Atoi(m[1])
			if k < 2 {
				errs = append(errs, fmt.Sprintf("chain %s: numgen modulus %d < 2: %s", chain, k, strings.TrimSpace(l)))
			}
			mods = append(mods, k)
		case strings.Contains(l, "numgen"):
			errs = append(errs, fmt.Sprintf("chain %s: random draw outside a DNAT cascade: %s", chain, strings.TrimSpace(l)))
		case strings.Contains(l, "dnat"):
			mods = append(mods, 0)
		}
	}
	return errs
}

// TestTemplatesListBack applies a ruleset with every phrase kind in an ip
// and an ip6 table; `nft list` must print exactly what Dump prints, with
// fair DNAT cascades, and reload into the same listing.
func TestTemplatesListBack(t *testing.T) {
	checkEveryPhraseKind(t, nfttest.EveryPhraseRuleset(nft.IPv4))
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newTestNS(t)
			n := ns.netlink(t)
			rs := nfttest.EveryPhraseRuleset(f)
			apply(t, n, nft.Diff(nil, rs))
			listing := ns.list(t, f)
			checkListing(t, ns, rs, listing)

			// Reload: what an operator does with `nft list ruleset > backup`.
			ns.nftReads(t, listing, func(t *testing.T) {
				ns.mustNft(t, "", "delete", "table", f.String(), nft.TableName)
				ns.mustNft(t, listing, "-f", "-")
				if again := ns.list(t, f); nft.Canonical(again) != nft.Canonical(listing) {
					t.Errorf("listing changed after reload\n--- before:\n%s\n--- after:\n%s", listing, again)
				}
			})
		})
	}
}

// checkEveryPhraseKind fails if the ruleset misses one of rule.go's phrase
// kinds (update the list and everyPhraseRuleset when adding one).
func checkEveryPhraseKind(t *testing.T, rs *nft.Ruleset) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			for _, p := range r.Phrases {
				seen[fmt.Sprintf("%T", p)] = true
			}
		}
	}
	for _, k := range []nft.Phrase{nft.MatchPrefix{}, nft.MatchSet{}, nft.MatchL4Proto{}, nft.MatchCtStateNew{}, nft.MatchCtStatusDNAT{},
		nft.MatchMarkBits{}, nft.SetMarkBits{}, nft.ToggleMarkBits{}, nft.Masquerade{}, nft.Reject{}, nft.VerdictPhrase{}, nft.VmapLookup{},
		nft.MatchRandom{}, nft.DNAT{}, nft.RejectTCPReset{}, nft.MatchFibLocal{}, nft.MatchIifname{}, nft.UpdateSet{}, nft.DNATMap{}} {
		if !seen[fmt.Sprintf("%T", k)] {
			t.Errorf("everyPhraseRuleset has no %T", k)
		}
	}
}

// TestCascadeCheck: cascadeErrors accepts the cascades we write and
// catches the mistakes it is there for.
func TestCascadeCheck(t *testing.T) {
	f := nft.IPv4
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		rs := nfttest.EveryPhraseRuleset(f)
		rs.AddChain(&nft.Chain{Name: "big", Rules: nfttest.DNATCascade(nft.ProtoTCP, nfttest.Backends(f, 4, 16, 80))})
		if errs := cascadeErrors(rs.Dump()); len(errs) > 0 {
			t.Errorf("%s: good cascades rejected: %q", f, errs)
		}
	}
	be := nfttest.Backends(f, 1, 3, 8080)
	good := nfttest.DNATCascade(nft.ProtoTCP, be)
	guard := func(mod uint32, i int) nft.Rule {
		return nft.Rule{Phrases: []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.MatchRandom{Mod: mod}, nft.DNAT{To: be[i]}}}
	}
	for name, rules := range map[string][]nft.Rule{
		"last rule guarded":   {good[0], good[1], guard(2, 2)},
		"off by one":          {guard(2, 0), guard(1, 1), good[2]},
		"byte-swapped":        {guard(3<<24, 0), good[1], good[2]},
		"rules missing":       {good[0], good[2]},
		"single rule guarded": {guard(2, 0)},
		"draw without dnat":   {{Phrases: []nft.Phrase{nft.MatchRandom{Mod: 2}, nft.Drop()}}, good[0], good[1], good[2]},
	} {
		rs := nft.NewRuleset(f)
		rs.AddChain(&nft.Chain{Name: "svc", Rules: rules})
		if errs := cascadeErrors(rs.Dump()); len(errs) == 0 {
			t.Errorf("%s: not caught:\n%s", name, rs.Dump())
		} else {
			t.Logf("%s: %q", name, errs)
		}
	}
}

func TestNetlinkFailedTransactionIsAtomic(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	rs := nfttest.EveryPhraseRuleset(nft.IPv4)
	apply(t, n, nft.Diff(nil, rs))
	before := ns.list(t, nft.IPv4)

	want := rs.Clone()
	want.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Jump("no-such-chain")}})
	want.AddElement("cluster-ips", nft.Element{Key: []nft.Datum{nft.Addr(nfttest.Addr(nft.IPv4, "10.96.0.99", ""))}})
	tx := nft.Diff(rs, want)
	err := n.Apply(context.Background(), tx)
	if err == nil {
		t.Fatal("Apply of a rule jumping to a missing chain succeeded")
	}
	if !errors.Is(err, unix.ENOENT) {
		t.Errorf("error %v is not ENOENT", err)
	}
	for _, s := range []string{"add-rule", `"services"`, "jump no-such-chain"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}
	t.Logf("error: %v", err)
	if after := ns.list(t, nft.IPv4); after != before {
		t.Errorf("failed transaction changed the table\n--- before:\n%s\n--- after:\n%s", before, after)
	}
	// The socket is still usable.
	apply(t, n, nft.Diff(rs, nfttest.EveryPhraseRuleset(nft.IPv4)))
}

func TestNetlinkRealisticRuleset(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newTestNS(t)
			n := ns.netlink(t)
			rs := nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 60, 3))
			apply(t, n, nft.Diff(nil, rs))
			checkListing(t, ns, rs, ns.list(t, f))
		})
	}
}

// TestNetlinkIncremental applies a state of 1,000 Services, then small
// changes: each batch must grow with the change, not with the table.
func TestNetlinkIncremental(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	f := nft.IPv4
	svcs := nfttest.MakeServices(f, 1000, 3)
	committed := nfttest.RealisticRuleset(f, svcs)
	apply(t, n, nft.Diff(nil, committed))
	full := n.LastBatch()
	t.Logf("1,000 services: %+v", full)
	// The kernel works on the batch in sendmsg, on the sending thread:
	// that thread's CPU time is some, and at most all, of the wall time
	// (give or take a scheduler tick: the kernel splits a thread's exact
	// run time into user and system time by tick samples).
	if full.KernelCPU <= 0 || full.KernelCPU > full.Kernel+10*time.Millisecond {
		t.Errorf("kernel CPU %v of a %v batch", full.KernelCPU, full.Kernel)
	}

	for _, changes := range []int{1, 10, 100} {
		// changes Services lose an endpoint, changes new ones appear and
		// changes disappear.
		next := slices.Clone(svcs)
		for i := 0; i < changes; i++ {
			s := &next[len(next)-1-i*7]
			if len(s.Backends) > 1 {
				s.Backends = s.Backends[1:]
			}
			next = append(next, nfttest.MakeService(f, 2000+changes*10+i, 3))
		}
		next = next[changes:]
		desired := nfttest.RealisticRuleset(f, next)
		tx := nft.Diff(committed, desired)
		apply(t, n, tx)
		st := n.LastBatch()
		t.Logf("%d×3 changes: %d ops, %d messages, %d bytes, %d elements, kernel %v",
			changes, st.Ops, st.Messages, st.Bytes, st.Elements, st.Kernel)
		// Per change at most: a Service losing an endpoint flushes its
		// chain and writes 2 rules; a new one adds its chain, 3 rules
		// and, with a NodePort, its external chain and 2 rules; a gone
		// one flushes and deletes its chains. Element messages are shared
		// per set.
		if limit := 20 + 14*changes; st.Messages > limit {
			t.Errorf("%d changes took %d messages, want ≤ %d", changes, st.Messages, limit)
		}
		if limit := 4096 + 3*changes*1024; st.Bytes > limit {
			t.Errorf("%d changes took %d bytes, want ≤ %d", changes, st.Bytes, limit)
		}
		if got, want := ns.listed(t, f), ns.dumped(t, desired); got != want {
			t.Fatalf("after %d changes the kernel differs from the desired ruleset", changes)
		}
		committed, svcs = desired, next
	}
	// No change, no batch.
	apply(t, n, nft.Diff(committed, nfttest.RealisticRuleset(f, svcs)))
}

// TestNetlinkColdStart10k writes 10,000 Services with 5 endpoints each in
// one batch, as nftproxy's first sync does, in an ip and an ip6 table. Each
// Service's endpoints are a DNAT cascade of plain rules: the kernel's time
// grows linearly with the batch. (One anonymous numgen map per Service, as
// upstream kube-proxy writes, made it quadratic: 21 s in the kernel.)
func TestNetlinkColdStart10k(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 services: not in -short")
	}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			rs := nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 10000, 5))
			tx := nft.Diff(nil, rs)
			ns := newTestNS(t)
			n := ns.netlink(t)
			start := time.Now()
			apply(t, n, tx)
			took := time.Since(start)
			st := n.LastBatch()
			t.Logf("%s: Apply %v (encode %v, kernel %v): %d ops, %d messages, %.1f MiB, %d elements, %d replies",
				f, took.Round(time.Millisecond), st.Encode.Round(time.Millisecond), st.Kernel.Round(time.Millisecond),
				st.Ops, st.Messages, float64(st.Bytes)/(1<<20), st.Elements, st.Replies)
			start = time.Now()
			listing := ns.list(t, f)
			t.Logf("nft list table: %v, %d bytes", time.Since(start).Round(time.Millisecond), len(listing))
			if got, want := nft.Canonical(listing), ns.dumped(t, rs); got != want {
				i := 0
				for i < len(got) && i < len(want) && got[i] == want[i] {
					i++
				}
				t.Errorf("10k listing differs from Dump (%d vs %d bytes), at byte %d:\n got %q\nwant %q",
					len(got), len(want), i, got[max(0, i-200):min(len(got), i+200)], want[max(0, i-200):min(len(want), i+200)])
			}
			checkCascades(t, listing)
		})
	}
}

// TestNetlinkAckStrategies compares our batch (one ACK, for BATCH_END, and
// a GETGEN sentinel) with asking for an ACK on every message, as
// google/nftables v0.3.0 does, on a batch of 20,000 cheap messages (10,000
// chains with one rule each) where the replies' cost shows. Netlink's
// comment relies on ours being the faster: the medians of three must say
// so (the margin measured is about two, docs/code-figures.md).
func TestNetlinkAckStrategies(t *testing.T) {
	if testing.Short() {
		t.Skip("timing comparison: not in -short")
	}
	tx := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{{Kind: nft.OpResetTable}}}
	for i := range 10000 {
		name := fmt.Sprintf("chain-%d", i)
		tx.Ops = append(tx.Ops, nft.Op{Kind: nft.OpAddChain, Chain: &nft.Chain{Name: name}},
			nft.Op{Kind: nft.OpAddRule, ChainName: name, Rule: nft.Rule{Phrases: []nft.Phrase{nft.Drop()}}})
	}
	k := newTestNS(t).kernelFeatures(t)
	times := map[bool][]time.Duration{}
	for round := range 3 {
		for _, ackEvery := range []bool{false, true} {
			ns := newTestNS(t)
			n := ns.netlink(t)
			if ackEvery {
				n.ackEvery = true
				// One ACK skb per message: 20k ACKs overflow 8 MiB.
				if err := nlcodec.SetBuffer(n.conn, unix.SO_RCVBUFFORCE, 256<<20); err != nil {
					t.Fatal(err)
				}
			}
			apply(t, n, tx)
			st := n.LastBatch()
			times[ackEvery] = append(times[ackEvery], st.Kernel)
			if round > 0 {
				continue
			}
			t.Logf("ackEvery=%v: %d messages, %d replies", ackEvery, st.Messages, st.Replies)
			// BATCH_BEGIN is never ACKed; BATCH_END is where the kernel
			// ACKs it (6.10); the sentinel's reply comes last.
			acks := 0
			if k.BatchEndACK {
				acks = 1
			}
			if want := 1 + acks; !ackEvery && st.Replies != want {
				t.Errorf("%d replies to a successful batch, want %d (BATCH_END's ACKs: %d, and the sentinel)", st.Replies, want, acks)
			}
			if want := st.Messages - 1 + acks; ackEvery && st.Replies != want {
				t.Errorf("%d replies in ACK-every mode, want %d", st.Replies, want)
			}
			if st.Confirmed != k.BatchEndACK {
				t.Errorf("BATCH_END ACKed: %v, the kernel ACKs it: %v", st.Confirmed, k.BatchEndACK)
			}
		}
	}
	for _, ackEvery := range []bool{false, true} {
		slices.Sort(times[ackEvery])
		t.Logf("ackEvery=%v: sendmsg to last reply, median of 3: %v (all: %v)",
			ackEvery, times[ackEvery][1].Round(time.Millisecond), times[ackEvery])
	}
	if ours, every := times[false][1], times[true][1]; ours >= every {
		t.Errorf("one ACK per batch took %v (median), an ACK per message %v: want ours faster", ours, every)
	}
}

// TestNetlinkLargeElementLists adds 5,000 verdict map elements and 3,000
// set elements in one batch: both element lists are split across messages
// of the batch, each list attribute below the u16 nla_len limit. The map's
// elements jump to a chain with a 3,000-rule DNAT cascade.
func TestNetlinkLargeElementLists(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	f := nft.IPv4
	rs := nfttest.RealisticRuleset(f, nil)
	var bes []netip.AddrPort
	for i := range 3000 {
		be := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}), 8080)
		bes = append(bes, be)
		rs.AddElement("hairpin-connections", nft.Element{Key: []nft.Datum{nft.Addr(be.Addr()), nft.Addr(be.Addr()), nfttest.TCP, nft.Int(8080)}})
	}
	rs.AddChain(&nft.Chain{Name: "big", Rules: nfttest.DNATCascade(nft.ProtoTCP, bes)})
	for i := range 5000 {
		k := i + 10
		ip := netip.AddrFrom4([4]byte{10, byte(96 + k>>16), byte(k >> 8), byte(k)})
		rs.AddElement("service-ips", nft.Element{Key: []nft.Datum{nft.Addr(ip), nfttest.TCP, nft.Int(80)},
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "big"}, Comment: fmt.Sprintf("ns-%d/svc-%d:http", i%100, i)})
	}
	tx := nft.Diff(nil, rs)
	b, err := encodeTransaction(tx, batchOptions{firstSeq: 1})
	if err != nil {
		t.Fatal(err)
	}
	elemMsgs := map[string]int{}
	for _, m := range splitMessages(b.enc.Buf) {
		if binary.NativeEndian.Uint16(m[4:])&0xff == unix.NFT_MSG_NEWSETELEM {
			set := (&nla{kids: parseNLAs(m[20:])}).child(unix.NFTA_SET_ELEM_LIST_SET)
			elemMsgs[strings.TrimRight(string(set.data), "\x00")]++
			if len(m) > maxElemListLen+512 {
				t.Errorf("element message of %d bytes", len(m))
			}
		}
	}
	// Lower bounds: a map element takes more than 60 bytes, a set
	// element (key only) 28.
	if got, want := elemMsgs["service-ips"], 5000*60/maxElemListLen+1; got < want {
		t.Errorf("%d element messages for 5,000 map elements, want ≥ %d", got, want)
	}
	if got, want := elemMsgs["hairpin-connections"], 3000*28/maxElemListLen+1; got < want {
		t.Errorf("%d element messages for 3,000 set elements, want ≥ %d", got, want)
	}
	apply(t, n, tx)
	st := n.LastBatch()
	t.Logf("%d messages (with elements: %v), %d bytes, %d elements, kernel %v",
		st.Messages, elemMsgs, st.Bytes, st.Elements, st.Kernel)
	checkListing(t, ns, rs, ns.list(t, f))
}

func TestNetlinkTableOps(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	f := nft.IPv6
	del := &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}
	apply(t, n, del) // no table: still fine
	rs := nfttest.EveryPhraseRuleset(f)
	apply(t, n, nft.Diff(nil, rs))
	apply(t, n, nft.Diff(nil, rs)) // reset over an existing table
	checkListing(t, ns, rs, ns.list(t, f))
	// The other family's table is untouched by all of this.
	if out := ns.mustNft(t, "", "list", "tables"); out != "table ip6 nftproxy\n" {
		t.Errorf("tables: %q", out)
	}
	apply(t, n, del)
	if out := ns.mustNft(t, "", "list", "tables"); out != "" {
		t.Errorf("after delete-table: %q", out)
	}
}

func TestNetlinkCanceledContext(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := n.Apply(ctx, nft.Diff(nil, nfttest.EveryPhraseRuleset(nft.IPv4)))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Apply with a canceled context: %v", err)
	}
	if out := ns.mustNft(t, "", "list", "tables"); out != "" {
		t.Errorf("a canceled Apply wrote %q", out)
	}
	if n.LastBatch().Messages != 0 {
		t.Errorf("a canceled Apply sent a batch: %+v", n.LastBatch())
	}
}

// TestNetlinkRemovals exercises flush chain, delete chain, delete set and
// delete elements: a ruleset loses Services and a set.
func TestNetlinkRemovals(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		svcs := nfttest.MakeServices(f, 40, 2)
		before := nfttest.RealisticRuleset(f, svcs)
		before.AddSet(&nft.Set{Name: "doomed", Key: []nft.DataType{f.AddrType()}})
		apply(t, n, nft.Diff(nil, before))
		after := nfttest.RealisticRuleset(f, svcs[:15])
		tx := nft.Diff(before, after)
		kinds := map[nft.OpKind]int{}
		for _, op := range tx.Ops {
			kinds[op.Kind]++
		}
		for _, k := range []nft.OpKind{nft.OpFlushChain, nft.OpDeleteChain, nft.OpDeleteSet, nft.OpDeleteElements} {
			if kinds[k] == 0 {
				t.Errorf("%s: transaction has no %s", f, k)
			}
		}
		apply(t, n, tx)
		checkListing(t, ns, after, ns.list(t, f))
	}
}

// TestNetlinkErrorFlood: thousands of failing messages overflow a small
// receive buffer. Apply must still end, report the batch as failed, leave
// the table as it was, and the next Apply must work.
func TestNetlinkErrorFlood(t *testing.T) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	rs := nfttest.EveryPhraseRuleset(nft.IPv4)
	apply(t, n, nft.Diff(nil, rs))
	before := ns.list(t, nft.IPv4)
	if err := nlcodec.SetBuffer(n.conn, unix.SO_RCVBUFFORCE, 32<<10); err != nil {
		t.Fatal(err)
	}
	tx := &nft.Transaction{Family: nft.IPv4}
	for range 5000 {
		tx.Ops = append(tx.Ops, nft.Op{Kind: nft.OpAddRule, ChainName: "missing", Rule: nft.Rule{Phrases: []nft.Phrase{nft.Drop()}}})
	}
	err := n.Apply(context.Background(), tx)
	t.Logf("error: %v; %+v", err, n.LastBatch())
	if err == nil {
		t.Fatal("5,000 rules in a missing chain: no error")
	}
	if !strings.Contains(err.Error(), "failed") && !errors.Is(err, unix.ENOENT) {
		t.Errorf("error %q does not say the batch failed", err)
	}
	if after := ns.list(t, nft.IPv4); after != before {
		t.Error("failed batch changed the table")
	}
	if err := nlcodec.SetBuffer(n.conn, unix.SO_RCVBUFFORCE, rcvbuf); err != nil {
		t.Fatal(err)
	}
	next := nfttest.RealisticRuleset(nft.IPv4, nfttest.MakeServices(nft.IPv4, 5, 2))
	apply(t, n, nft.Diff(nil, next))
	checkListing(t, ns, next, ns.list(t, nft.IPv4))
}
