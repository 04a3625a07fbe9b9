package nftnl

// What does one small transaction cost the kernel, as the table grows?
//
// nf_tables_commit() validates a table whole (nf_tables_validate ->
// nft_table_validate: every base chain, and every chain reachable from it
// through jumps, gotos and verdict map elements) whenever the batch set the
// table's validate_state to NEED. nf_tables_newrule sets NEED for a rule
// holding any expression with a .validate op (immediate, meta, lookup, nat,
// masq, reject, fib…), nft_add_set_elem for a verdict map element that
// jumps or goes to a chain. The tests below time single small batches
// against tables of 1k…100k Services in the shape nftproxy writes today and
// in two element-only designs, with NFTPROXY_COST=1:
//
//	NFTPROXY_COST=1 NFTPROXY_COST_SIZES=1000,10000,50000 \
//	  go test ./nft -run 'TestNetlinkCost' -v -timeout 2h
//
// Times are Netlink's own (BatchStats.Kernel): from the batch's sendmsg to
// the reply to the GETGEN sent after it, medians of NFTPROXY_COST_REPS
// (default 7) batches. NFTPROXY_COST_OUT=<file> appends the results as TSV.

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func costRun(t *testing.T, env, def string, run func(t *testing.T, size int)) {
	costGuard(t)
	for _, size := range costSizes(t, env, def) {
		t.Run(strconv.Itoa(size), func(t *testing.T) { run(t, size) })
	}
}

// TestNetlinkCostCurrentShape: the table as nftproxy writes it today
// (realisticRuleset: service-ips vmap with a goto per Service, per-Service
// DNAT cascades of 5 rules, hairpin set, cluster-ips set, no-endpoint vmap),
// plus a data map, and single small batches against it.
func TestNetlinkCostCurrentShape(t *testing.T) {
	costRun(t, "NFTPROXY_COST_SIZES", "1000,10000", costCurrentShape)
}

func costCurrentShape(t *testing.T, size int) {
	const shape = "current"
	f := nft.IPv4
	ns := newTestNS(t)
	n := ns.netlink(t)
	svcs := nfttest.MakeServices(f, size, 5)
	rs := nfttest.RealisticRuleset(f, svcs)
	dm := rs.AddSet(&nft.Set{Name: "cost-data", Key: []nft.DataType{nft.TypeInteger}, Data: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetService}})
	for i, s := range svcs {
		if len(s.Backends) > 0 {
			be := s.Backends[0]
			rs.AddElement(dm.Name, nft.Element{Key: []nft.Datum{nft.Int(uint32(i))}, Data: []nft.Datum{nft.Addr(be.Addr()), nft.Int(uint32(be.Port()))}})
			for _, e := range costHairpin(s.Backends) { // as proxier/ruleset writes them
				rs.AddElement("hairpin-connections", e)
			}
		}
	}
	cold, err := costTx(n, nft.Diff(nil, rs))
	if err != nil {
		t.Fatal(err)
	}
	results := []costResult{{shape, "cold start: whole table in one batch", size, cold, 0}}
	reps := costReps()
	add := func(name string, do, undo func() (time.Duration, error)) {
		fwd, back := costPair(t, reps, do, undo)
		results = append(results, costResult{shape, name, size, fwd, back})
	}
	tx := func(ops ...nft.Op) func() (time.Duration, error) {
		return func() (time.Duration, error) { return costTx(n, &nft.Transaction{Family: f, Ops: ops}) }
	}
	elems := func(kind nft.OpKind, s *nft.Set, es ...nft.Element) nft.Op {
		return nft.Op{Kind: kind, Set: s, Elements: es}
	}
	hp, vm := rs.Sets["hairpin-connections"], rs.Sets["service-ips"]
	newIP := netip.MustParseAddr("10.111.222.1")

	add("empty batch (BEGIN, END)", func() (time.Duration, error) {
		return costRaw(n, f, func(*batch) error { return nil })
	}, nil)
	hpElem := nft.Element{Key: []nft.Datum{nft.Addr(newIP), nft.Addr(newIP), nfttest.TCP, nft.Int(9999)}}
	add("a) add 1 plain set element (hairpin) / delete it",
		tx(elems(nft.OpAddElements, hp, hpElem)), tx(elems(nft.OpDeleteElements, hp, hpElem)))
	dmElem := nft.Element{Key: []nft.Datum{nft.Int(uint32(size + 1000))}, Data: []nft.Datum{nft.Addr(newIP), nft.Int(8080)}}
	add("b) add 1 data map element (integer : ipv4_addr . inet_service) / delete it",
		tx(elems(nft.OpAddElements, dm, dmElem)), tx(elems(nft.OpDeleteElements, dm, dmElem)))
	vmGoto := nft.Element{Key: []nft.Datum{nft.Addr(newIP), nfttest.TCP, nft.Int(80)}, Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: svcs[0].Chain()}}
	add("c) add 1 vmap element `goto` an existing chain / delete it",
		tx(elems(nft.OpAddElements, vm, vmGoto)), tx(elems(nft.OpDeleteElements, vm, vmGoto)))
	vmDrop := nft.Element{Key: []nft.Datum{nft.Addr(newIP), nfttest.TCP, nft.Int(80)}, Verdict: &nft.Verdict{Kind: nft.VerdictDrop}}
	add("c') add 1 vmap element `drop` / delete it",
		tx(elems(nft.OpAddElements, vm, vmDrop)), tx(elems(nft.OpDeleteElements, vm, vmDrop)))

	s1 := svcs[1]
	flush := nft.Op{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: s1.Chain()}}
	rule := func(p ...nft.Phrase) nft.Op {
		return nft.Op{Kind: nft.OpAddRule, ChainName: s1.Chain(), Rule: nft.Rule{Phrases: p}}
	}
	add("d0) flush a 1-rule service chain (DELRULE only) / re-add `numgen random mod 2 0`",
		tx(flush), tx(rule(nft.MatchRandom{Mod: 2})))
	add("d1) flush + add `numgen random mod 2 0` (numgen, cmp)", tx(flush, rule(nft.MatchRandom{Mod: 2})), nil)
	add("d2) flush + add `ip daddr 10.0.0.1` (payload, cmp)",
		tx(flush, rule(nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: netip.MustParsePrefix("10.0.0.1/32")})), nil)
	add("d3) flush + add `meta l4proto tcp` (meta, cmp)", tx(flush, rule(nft.MatchL4Proto{Proto: nft.ProtoTCP})), nil)
	add("d4) flush + add `accept` (immediate)", tx(flush, rule(nft.VerdictPhrase{Verdict: nft.Verdict{Kind: nft.VerdictAccept}})), nil)
	add("e) flush + add 1 dnat rule", tx(flush, rule(nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.DNAT{To: s1.Backends[0]})), nil)

	// A real endpoint change today: the cascade rewritten, hairpin elements swapped.
	change := func(from, to []netip.AddrPort) func() (time.Duration, error) {
		ops := []nft.Op{flush}
		for _, r := range nfttest.DNATCascade(nft.ProtoTCP, to) {
			ops = append(ops, nft.Op{Kind: nft.OpAddRule, ChainName: s1.Chain(), Rule: r})
		}
		ops = append(ops, elems(nft.OpDeleteElements, hp, costHairpin(from)...), elems(nft.OpAddElements, hp, costHairpin(to)...))
		return tx(ops...)
	}
	alt := costAltBackends(1, 5)
	add("e5) endpoint change 5 -> 5 other pods: flush + 5-rule cascade + 5/5 hairpin", change(s1.Backends, alt), change(alt, s1.Backends))

	ns1 := nfttest.MakeService(f, size+500, 5)
	nsKey := []nft.Datum{nft.Addr(ns1.ClusterIP), nfttest.TCP, nft.Int(80)}
	nsGoto := nft.Element{Key: nsKey, Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: ns1.Chain()}}
	add("f) new service: chain + 1 dnat rule + vmap goto element / remove it",
		tx(nft.Op{Kind: nft.OpAddChain, Chain: &nft.Chain{Name: ns1.Chain()}},
			nft.Op{Kind: nft.OpAddRule, ChainName: ns1.Chain(), Rule: nft.Rule{Phrases: []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.DNAT{To: ns1.Backends[0]}}}},
			elems(nft.OpAddElements, vm, nsGoto)),
		tx(elems(nft.OpDeleteElements, vm, nsGoto), nft.Op{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: ns1.Chain()}},
			nft.Op{Kind: nft.OpDeleteChain, Chain: &nft.Chain{Name: ns1.Chain()}}))
	costReport(t, results...)
}

// costPerServiceSet names Service i's endpoint map in design g.
func costPerServiceSet(i int) string { return fmt.Sprintf("endpoints-%d", i) }

// costEndpointType is the data type ipv4_addr . inet_service.
var costEndpointType = typeMagic([]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetService})

// TestNetlinkCostPerServiceMaps: design g. Each Service chain holds one
// fixed rule,
//
//	meta l4proto tcp dnat ip to numgen random mod 65536 map @endpoints-<i>
//
// and its endpoints are the ranges of a per-Service interval map
// (type integer : ipv4_addr . inet_service; flags interval), N ranges
// covering [0, 65536). An endpoint change is element work only.
func TestNetlinkCostPerServiceMaps(t *testing.T) {
	costRun(t, "NFTPROXY_COST_SIZES", "1000,10000", costPerServiceMaps)
}

func costPerServiceMaps(t *testing.T, size int) {
	const shape = "g per-service maps"
	f := nft.IPv4
	ns := newTestNS(t)
	n := ns.netlink(t)
	rs := nfttest.RealisticRuleset(f, nil)
	if _, err := costTx(n, nft.Diff(nil, rs)); err != nil {
		t.Fatal(err)
	}
	svcs := nfttest.MakeServices(f, size, 5)
	cips, hp, vm, noEp := rs.Sets["cluster-ips"], rs.Sets["hairpin-connections"], rs.Sets["service-ips"], rs.Sets["no-endpoint-services"]
	// addService writes Service i (set, its ranges, chain, rule) and returns
	// the elements it needs in the shared sets.
	addService := func(b *batch, i int, s nfttest.Service) []nft.Op {
		key := []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)}
		ops := []nft.Op{{Kind: nft.OpAddElements, Set: cips, Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(s.ClusterIP)}}}}}
		if len(s.Backends) == 0 {
			return append(ops, nft.Op{Kind: nft.OpAddElements, Set: noEp, Elements: []nft.Element{{Key: key,
				Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "reject-chain"}}}})
		}
		set := costPerServiceSet(i)
		b.costIntervalMap(set, nft.TypeInteger.Magic, 4, costEndpointType, 8, nil)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, set, costBucketRanges(nil, s.Backends, false), false)
		b.newChain(&nft.Chain{Name: s.Chain()})
		b.costRule(s.Chain(), costPerServiceRule(set, b.setIDs[set]))
		return append(ops, nft.Op{Kind: nft.OpAddElements, Set: vm, Elements: []nft.Element{{Key: key,
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: s.Chain()}}}},
			nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: costHairpin(s.Backends)})
	}
	// Shared-set elements go last, merged per set, as Diff orders them.
	flushOps := func(b *batch, ops []nft.Op) error {
		merged := map[*nft.Set][]nft.Element{}
		var order []*nft.Set
		for _, op := range ops {
			if _, ok := merged[op.Set]; !ok {
				order = append(order, op.Set)
			}
			merged[op.Set] = append(merged[op.Set], op.Elements...)
		}
		for _, s := range order {
			if err := b.addOp(nft.Op{Kind: nft.OpAddElements, Set: s, Elements: merged[s]}); err != nil {
				return err
			}
		}
		return nil
	}
	cold, err := costRaw(n, f, func(b *batch) error {
		var ops []nft.Op
		for i, s := range svcs {
			ops = append(ops, addService(b, i, s)...)
		}
		return flushOps(b, ops)
	})
	if err != nil {
		t.Fatal(err)
	}
	results := []costResult{{shape, "cold start: all Services in one batch", size, cold, 0}}
	reps := costReps()
	add := func(name string, do, undo func() (time.Duration, error)) {
		fwd, back := costPair(t, reps, do, undo)
		results = append(results, costResult{shape, name, size, fwd, back})
	}

	k := size / 2
	if len(svcs[k].Backends) == 0 {
		k++
	}
	sk := svcs[k]
	set := costPerServiceSet(k)
	change := func(from, to []netip.AddrPort) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			return costRaw(n, f, func(b *batch) error {
				b.costIntervalElems(unix.NFT_MSG_DELSETELEM, set, costDeleteRanges(costBucketRanges(nil, from, false)), false)
				b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, set, costBucketRanges(nil, to, false), false)
				if err := b.addOp(nft.Op{Kind: nft.OpDeleteElements, Set: hp, Elements: costHairpin(from)}); err != nil {
					return err
				}
				return b.addOp(nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: costHairpin(to)})
			})
		}
	}
	alt := costAltBackends(k, 5)
	add("g) endpoint change 5 -> 5 other pods: 5/5 ranges + 5/5 hairpin", change(sk.Backends, alt), change(alt, sk.Backends))
	six := append(costAltBackends(k, 6)[:1:1], sk.Backends...)
	add("g) endpoint change 5 -> 6 (scale up) / back", change(sk.Backends, six), change(six, sk.Backends))

	ns1 := nfttest.MakeService(f, size+500, 5)
	add("g) new service: set + 5 ranges + chain + rule + vmap goto / remove it",
		func() (time.Duration, error) {
			return costRaw(n, f, func(b *batch) error { return flushOps(b, addService(b, size+500, ns1)) })
		},
		func() (time.Duration, error) {
			return costRaw(n, f, func(b *batch) error {
				for _, op := range []nft.Op{
					{Kind: nft.OpDeleteElements, Set: vm, Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(ns1.ClusterIP), nfttest.TCP, nft.Int(80)}}}},
					{Kind: nft.OpDeleteElements, Set: cips, Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(ns1.ClusterIP)}}}},
					{Kind: nft.OpDeleteElements, Set: hp, Elements: costHairpin(ns1.Backends)},
					{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: ns1.Chain()}},
					{Kind: nft.OpDeleteChain, Chain: &nft.Chain{Name: ns1.Chain()}},
					{Kind: nft.OpDeleteSet, Set: &nft.Set{Name: costPerServiceSet(size + 500)}},
				} {
					if err := b.addOp(op); err != nil {
						return err
					}
				}
				return nil
			})
		})
	costReport(t, results...)
}

// TestNetlinkCostNamedSetsColdStart: K named maps created in one batch,
// with and without their elements, against the same number of ranges in
// one map. The kernel finds a set by name with a walk of table->sets
// (nft_set_lookup), once for NEWSET's existence check and once per
// NEWSETELEM, so K sets cost O(K²).
func TestNetlinkCostNamedSetsColdStart(t *testing.T) {
	costRun(t, "NFTPROXY_COST_SET_SIZES", "1000,10000", costNamedSets)
}

func costNamedSets(t *testing.T, size int) {
	const shape = "named sets cold start"
	f := nft.IPv4
	reset := &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpResetTable}}}
	eps := nfttest.Backends(f, 1, 5, 8080)
	run := func(name string, fill func(b *batch) error) costResult {
		ns := newTestNS(t)
		n := ns.netlink(t)
		if _, err := costTx(n, reset); err != nil {
			t.Fatal(err)
		}
		d, err := costRaw(n, f, fill)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return costResult{shape, name, size, d, 0}
	}
	var results []costResult
	results = append(results, run("K named interval maps, no elements", func(b *batch) error {
		for i := range size {
			b.costIntervalMap(costPerServiceSet(i), nft.TypeInteger.Magic, 4, costEndpointType, 8, nil)
		}
		return nil
	}))
	results = append(results, run("K named interval maps + 5 ranges each", func(b *batch) error {
		for i := range size {
			set := costPerServiceSet(i)
			b.costIntervalMap(set, nft.TypeInteger.Magic, 4, costEndpointType, 8, nil)
			b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, set, costBucketRanges(nil, eps, false), false)
		}
		return nil
	}))
	results = append(results, run("1 global interval map with K*5 ranges (rbtree)", func(b *batch) error {
		b.costIntervalMap("service-endpoints", costGlobalKeyType, 16, costEndpointType, 8, nil)
		var rs []costRange
		for i := range size {
			ip := netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)})
			rs = append(rs, costBucketRanges(costVIPKey(ip, nft.ProtoTCP, 80), eps, false)...)
		}
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, "service-endpoints", rs, false)
		return nil
	}))
	costReport(t, results...)
}

// costGlobalKeyType is ipv4_addr . inet_proto . inet_service . integer.
var costGlobalKeyType = typeMagic([]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeInteger})

// TestNetlinkCostGlobalMap: design h. No per-Service chains and no verdict
// map gotos: one rule in the services chain,
//
//	dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 65536 map @service-endpoints
//
// looks the Service and a random bucket up in one interval map. The kernel
// picks rbtree for it (16-byte keys, no NFT_SET_CONCAT); with
// NFTPROXY_COST_PIPAPO=1 the same map is also built as nft would
// (concatenation: pipapo). Endpoints per Service: NFTPROXY_COST_ENDPOINTS (5).
func TestNetlinkCostGlobalMap(t *testing.T) {
	costRun(t, "NFTPROXY_COST_GLOBAL_SIZES", "1000,10000", func(t *testing.T, size int) {
		t.Run("rbtree", func(t *testing.T) { costGlobalMap(t, size, false) })
		if costEnvBool("NFTPROXY_COST_PIPAPO") {
			t.Run("pipapo", func(t *testing.T) { costGlobalMap(t, size, true) })
		}
	})
}

func costEnvBool(name string) bool { v, _ := strconv.ParseBool(os.Getenv(name)); return v }

func costGlobalMap(t *testing.T, size int, pipapo bool) {
	shape := "h global map (rbtree)"
	var fields []uint32
	if pipapo {
		shape = "h global map (pipapo)"
		fields = []uint32{4, 1, 2, 4}
	}
	nb := 5
	if v, err := strconv.Atoi(os.Getenv("NFTPROXY_COST_ENDPOINTS")); err == nil && v > 0 {
		nb = v
	}
	f := nft.IPv4
	ns := newTestNS(t)
	n := ns.netlink(t)
	rs := nfttest.RealisticRuleset(f, nil)
	rs.AddChain(&nft.Chain{Name: "scratch"})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Jump("scratch")}})
	if _, err := costTx(n, nft.Diff(nil, rs)); err != nil {
		t.Fatal(err)
	}
	svcs := nfttest.MakeServices(f, size, nb)
	cips, hp, noEp := rs.Sets["cluster-ips"], rs.Sets["hairpin-connections"], rs.Sets["no-endpoint-services"]
	const gm = "service-endpoints"
	ranges := func(s nfttest.Service, eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(s.ClusterIP, nft.ProtoTCP, 80), eps, pipapo)
	}
	cold, err := costRaw(n, f, func(b *batch) error {
		b.costIntervalMap(gm, costGlobalKeyType, 16, costEndpointType, 8, fields)
		var all []costRange
		var cipEls, hpEls, noEpEls []nft.Element
		for _, s := range svcs {
			cipEls = append(cipEls, nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP)}})
			if len(s.Backends) == 0 {
				noEpEls = append(noEpEls, nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)},
					Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "reject-chain"}})
				continue
			}
			all = append(all, ranges(s, s.Backends)...)
			hpEls = append(hpEls, costHairpin(s.Backends)...)
		}
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gm, all, pipapo)
		b.costRule("services", costGlobalRule(gm, b.setIDs[gm]))
		for _, op := range []nft.Op{
			{Kind: nft.OpAddElements, Set: cips, Elements: cipEls},
			{Kind: nft.OpAddElements, Set: hp, Elements: hpEls},
			{Kind: nft.OpAddElements, Set: noEp, Elements: noEpEls},
		} {
			if err := b.addOp(op); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	results := []costResult{{shape, fmt.Sprintf("cold start: all Services (x%d endpoints) in one batch", nb), size, cold, 0}}
	reps := costReps()
	add := func(name string, do, undo func() (time.Duration, error)) {
		fwd, back := costPair(t, reps, do, undo)
		results = append(results, costResult{shape, name, size, fwd, back})
	}
	k := size / 2
	if len(svcs[k].Backends) == 0 {
		k++
	}
	sk := svcs[k]
	change := func(s nfttest.Service, from, to []netip.AddrPort) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			return costRaw(n, f, func(b *batch) error {
				if len(from) > 0 {
					b.costIntervalElems(unix.NFT_MSG_DELSETELEM, gm, costDeleteRanges(ranges(s, from)), pipapo)
					if err := b.addOp(nft.Op{Kind: nft.OpDeleteElements, Set: hp, Elements: costHairpin(from)}); err != nil {
						return err
					}
				}
				if len(to) > 0 {
					b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gm, ranges(s, to), pipapo)
					if err := b.addOp(nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: costHairpin(to)}); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
	alt := costAltBackends(k, nb)
	add(fmt.Sprintf("h) endpoint change %d -> %d other pods: ranges + hairpin", nb, nb), change(sk, sk.Backends, alt), change(sk, alt, sk.Backends))
	more := append(costAltBackends(k, nb+1)[:1:1], sk.Backends...)
	add(fmt.Sprintf("h) endpoint change %d -> %d (scale up) / back", nb, nb+1), change(sk, sk.Backends, more), change(sk, more, sk.Backends))
	ns1 := nfttest.MakeService(f, size+500, nb)
	newSvc := func(add bool) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			return costRaw(n, f, func(b *batch) error {
				kind, msg, rgs := nft.OpAddElements, uint16(unix.NFT_MSG_NEWSETELEM), ranges(ns1, ns1.Backends)
				if !add {
					kind, msg, rgs = nft.OpDeleteElements, unix.NFT_MSG_DELSETELEM, costDeleteRanges(rgs)
				}
				b.costIntervalElems(msg, gm, rgs, pipapo)
				if err := b.addOp(nft.Op{Kind: kind, Set: hp, Elements: costHairpin(ns1.Backends)}); err != nil {
					return err
				}
				return b.addOp(nft.Op{Kind: kind, Set: cips, Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(ns1.ClusterIP)}}}})
			})
		}
	}
	add("h) new service: cluster-ip + ranges + hairpin / remove it", newSvc(true), newSvc(false))
	// Rule work in this table: validation walks a few base chains only.
	flush := nft.Op{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: "scratch"}}
	add("h) flush a chain + add 1 dnat rule (full validation of this table)",
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{flush, {Kind: nft.OpAddRule, ChainName: "scratch",
				Rule: nft.Rule{Phrases: []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.DNAT{To: sk.Backends[0]}}}}}})
		}, nil)
	costReport(t, results...)
}

// TestNetlinkCostDataPath: designs g, h and s DNAT for real. Connections from
// the namespace to one ClusterIP per design reach each of 3 local
// endpoints; after an element-only endpoint change, only the remaining one.
func TestNetlinkCostDataPath(t *testing.T) {
	costGuard(t)
	f := nft.IPv4
	ns := newTestNS(t)
	n := ns.netlink(t)
	eps := []netip.AddrPort{netip.MustParseAddrPort("10.244.0.1:8080"),
		netip.MustParseAddrPort("10.244.0.2:8080"), netip.MustParseAddrPort("10.244.0.3:8080")}
	setup := [][]string{{"link", "set", "lo", "up"}, {"link", "add", "d0", "type", "veth", "peer", "name", "d1"}, {"link", "set", "d1", "up"},
		{"link", "set", "d0", "up"}, {"addr", "add", "10.10.0.1/24", "dev", "d0"},
		{"route", "add", "10.96.0.0/12", "dev", "d0"}}
	for _, ep := range eps {
		setup = append(setup, []string{"addr", "add", ep.Addr().String() + "/32", "dev", "lo"})
	}
	for _, args := range setup {
		if out, err := exec.Command("ip", append([]string{"-n", ns.Name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	rs := nfttest.RealisticRuleset(f, nil)
	if _, err := costTx(n, nft.Diff(nil, rs)); err != nil {
		t.Fatal(err)
	}
	svcG := nfttest.Service{Index: 1, ClusterIP: netip.MustParseAddr("10.96.0.11"), Backends: eps}
	svcH := nfttest.Service{Index: 2, ClusterIP: netip.MustParseAddr("10.96.0.10"), Backends: eps}
	// Design s with 4 shards: 10.96.0.12 & 3 = shard 0.
	svcS := nfttest.Service{Index: 3, ClusterIP: netip.MustParseAddr("10.96.0.12"), Backends: eps}
	sRanges := func(eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(svcS.ClusterIP, nft.ProtoTCP, 80), eps, false)
	}
	const gm = "service-endpoints"
	gset := costPerServiceSet(svcG.Index)
	hRanges := func(eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(svcH.ClusterIP, nft.ProtoTCP, 80), eps, false)
	}
	if _, err := costRaw(n, f, func(b *batch) error {
		b.costIntervalMap(gm, costGlobalKeyType, 16, costEndpointType, 8, nil)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gm, hRanges(eps), false)
		b.costRule("services", costGlobalRule(gm, b.setIDs[gm]))
		b.costIntervalMap(gset, nft.TypeInteger.Magic, 4, costEndpointType, 8, nil)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gset, costBucketRanges(nil, eps, false), false)
		b.newChain(&nft.Chain{Name: svcG.Chain()})
		b.costRule(svcG.Chain(), costPerServiceRule(gset, b.setIDs[gset]))
		dispatch := &nft.Set{Name: "shard-dispatch", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: []nft.DataType{nft.TypeVerdict}}
		if err := b.addOp(nft.Op{Kind: nft.OpAddSet, Set: dispatch}); err != nil {
			return err
		}
		var els []nft.Element
		for i := range 4 {
			m, c := fmt.Sprintf("endpoints-s%d", i), fmt.Sprintf("shard-%d", i)
			b.costIntervalMap(m, costGlobalKeyType, 16, costEndpointType, 8, nil)
			b.newChain(&nft.Chain{Name: c})
			b.costRule(c, costGlobalRule(m, b.setIDs[m]))
			els = append(els, nft.Element{Key: []nft.Datum{nft.Addr(netip.AddrFrom4([4]byte{0, 0, 0, byte(i)}))}, Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: c}})
		}
		if err := b.addOp(nft.Op{Kind: nft.OpAddElements, Set: dispatch, Elements: els}); err != nil {
			return err
		}
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, "endpoints-s0", sRanges(eps), false)
		b.costRule("services", func(e *encoder) {
			e.payloadLoad(unix.NFT_PAYLOAD_NETWORK_HEADER, 16, 4, reg1)
			e.bitwise(reg1, reg1, []byte{0, 0, 0, 3}, make([]byte, 4), false)
			e.lookup(reg1, dispatch.Name, b.setIDs[dispatch.Name], true, false)
		})
		for _, op := range []nft.Op{
			{Kind: nft.OpAddElements, Set: rs.Sets["service-ips"], Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(svcG.ClusterIP), nfttest.TCP, nft.Int(80)},
				Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: svcG.Chain()}}}},
			{Kind: nft.OpAddElements, Set: rs.Sets["cluster-ips"], Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(svcG.ClusterIP)}},
				{Key: []nft.Datum{nft.Addr(svcH.ClusterIP)}}, {Key: []nft.Datum{nft.Addr(svcS.ClusterIP)}}}},
		} {
			if err := b.addOp(op); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// nft 1.0.6 cannot list these maps (it crashes: they carry no userdata,
	// and the rbtree one has a concatenated key without NFT_SET_CONCAT).

	hits := func(vip netip.Addr, conns int) map[string]int {
		got := map[string]int{}
		err := costInNetNS(ns.Fd, func() error {
			for range conns {
				c, err := net.DialTimeout("tcp", netip.AddrPortFrom(vip, 80).String(), 2*time.Second)
				if err != nil {
					return err
				}
				c.SetDeadline(time.Now().Add(2 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				c.Close()
				if err != nil {
					return err
				}
				got[line[:len(line)-1]]++
			}
			return nil
		})
		if err != nil {
			t.Fatalf("connect to %v: %v", vip, err)
		}
		return got
	}
	if err := costInNetNS(ns.Fd, func() error {
		for _, ep := range eps {
			l, err := net.Listen("tcp", ep.String())
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s\n", c.LocalAddr())
					c.Close()
				}
			}()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []netip.Addr{svcG.ClusterIP, svcH.ClusterIP, svcS.ClusterIP} {
		got := hits(vip, 60)
		t.Logf("%v: %v", vip, got)
		for _, ep := range eps {
			if got[ep.String()] == 0 {
				t.Errorf("%v: endpoint %v never reached in 60 connections: %v", vip, ep, got)
			}
		}
	}
	// Endpoint change, elements only: 3 endpoints -> the last one.
	last := eps[2:]
	if _, err := costRaw(n, f, func(b *batch) error {
		b.costIntervalElems(unix.NFT_MSG_DELSETELEM, gm, costDeleteRanges(hRanges(eps)), false)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gm, hRanges(last), false)
		b.costIntervalElems(unix.NFT_MSG_DELSETELEM, gset, costDeleteRanges(costBucketRanges(nil, eps, false)), false)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gset, costBucketRanges(nil, last, false), false)
		b.costIntervalElems(unix.NFT_MSG_DELSETELEM, "endpoints-s0", costDeleteRanges(sRanges(eps)), false)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, "endpoints-s0", sRanges(last), false)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []netip.Addr{svcG.ClusterIP, svcH.ClusterIP, svcS.ClusterIP} {
		got := hits(vip, 20)
		t.Logf("%v after the change: %v", vip, got)
		if got[last[0].String()] != 20 {
			t.Errorf("%v: after the change, connections went to %v, want all to %v", vip, got, last[0])
		}
	}
}

// costInNetNS runs fn on an OS thread moved into the namespace fd. The
// thread stays locked, so it ends with the goroutine instead of returning
// to the pool in the wrong namespace. Sockets fn opens stay in the namespace.
func costInNetNS(fd int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// TestNetlinkCostShardedMaps: design s, h split into K fixed shards so that
// no set grows with the cluster. On this kernel (6.18.44: nft_set_rbtree
// keeps a binary-search array that nft_rbtree_commit rebuilds from the
// whole tree whenever the set changed) a commit costs O(size of each
// changed interval map), so one global map is O(cluster) again. Here:
//
//	services:  ip daddr & 0.0.0.255 vmap @shard-dispatch   (K fixed elements: goto shard-<i>)
//	shard-<i>: dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 65536 map @endpoints-<i>
//
// The dispatch map and the K chains are written once at start; Services
// and endpoints only ever change elements of one shard map (no verdicts,
// so no table validation, and 1/K of the ranges to rebuild). K:
// NFTPROXY_COST_SHARDS (256, a power of 2 ≤ 65536).
func TestNetlinkCostShardedMaps(t *testing.T) {
	costRun(t, "NFTPROXY_COST_SHARDED_SIZES", "1000,10000", costShardedMaps)
}

func costShardedMaps(t *testing.T, size int) {
	shards := 256
	if v, err := strconv.Atoi(os.Getenv("NFTPROXY_COST_SHARDS")); err == nil && v > 0 {
		shards = v
	}
	nb := 5
	if v, err := strconv.Atoi(os.Getenv("NFTPROXY_COST_ENDPOINTS")); err == nil && v > 0 {
		nb = v
	}
	shape := fmt.Sprintf("s %d shard maps", shards)
	f := nft.IPv4
	ns := newTestNS(t)
	n := ns.netlink(t)
	rs := nfttest.RealisticRuleset(f, nil)
	rs.AddChain(&nft.Chain{Name: "scratch"})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Jump("scratch")}})
	if _, err := costTx(n, nft.Diff(nil, rs)); err != nil {
		t.Fatal(err)
	}
	// Fixed part: dispatch map, K chains, K maps.
	mask := uint32(shards - 1)
	maskBytes := binary.BigEndian.AppendUint32(nil, mask)
	shardOf := func(ip netip.Addr) int {
		a := ip.As4()
		return int(binary.BigEndian.Uint32(a[:]) & mask)
	}
	shardMap := func(i int) string { return fmt.Sprintf("endpoints-%d", i) }
	shardChain := func(i int) string { return fmt.Sprintf("shard-%d", i) }
	fixed, err := costRaw(n, f, func(b *batch) error {
		dispatch := &nft.Set{Name: "shard-dispatch", Key: []nft.DataType{nft.TypeIPv4Addr}, Data: []nft.DataType{nft.TypeVerdict}}
		if err := b.addOp(nft.Op{Kind: nft.OpAddSet, Set: dispatch}); err != nil {
			return err
		}
		var els []nft.Element
		for i := range shards {
			b.costIntervalMap(shardMap(i), costGlobalKeyType, 16, costEndpointType, 8, nil)
			b.newChain(&nft.Chain{Name: shardChain(i)})
			b.costRule(shardChain(i), costGlobalRule(shardMap(i), b.setIDs[shardMap(i)]))
			var k [4]byte
			binary.BigEndian.PutUint32(k[:], uint32(i))
			els = append(els, nft.Element{Key: []nft.Datum{nft.Addr(netip.AddrFrom4(k))}, Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: shardChain(i)}})
		}
		if err := b.addOp(nft.Op{Kind: nft.OpAddElements, Set: dispatch, Elements: els}); err != nil {
			return err
		}
		// [ payload load 4b @ network header + 16 => reg 1 ] [ bitwise reg 1 = ( reg 1 & mask ) ^ 0 ]
		// [ lookup reg 1 set shard-dispatch dreg 0 ]
		b.costRule("services", func(e *encoder) {
			e.payloadLoad(unix.NFT_PAYLOAD_NETWORK_HEADER, 16, 4, reg1)
			e.bitwise(reg1, reg1, maskBytes, make([]byte, 4), false)
			e.lookup(reg1, dispatch.Name, b.setIDs[dispatch.Name], true, false)
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	svcs := nfttest.MakeServices(f, size, nb)
	cips, hp, noEp := rs.Sets["cluster-ips"], rs.Sets["hairpin-connections"], rs.Sets["no-endpoint-services"]
	ranges := func(s nfttest.Service, eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(s.ClusterIP, nft.ProtoTCP, 80), eps, false)
	}
	cold, err := costRaw(n, f, func(b *batch) error {
		perShard := make([][]costRange, shards)
		var cipEls, hpEls, noEpEls []nft.Element
		for _, s := range svcs {
			cipEls = append(cipEls, nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP)}})
			if len(s.Backends) == 0 {
				noEpEls = append(noEpEls, nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)},
					Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "reject-chain"}})
				continue
			}
			i := shardOf(s.ClusterIP)
			perShard[i] = append(perShard[i], ranges(s, s.Backends)...)
			hpEls = append(hpEls, costHairpin(s.Backends)...)
		}
		for i, rgs := range perShard {
			if len(rgs) > 0 {
				b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, shardMap(i), rgs, false)
			}
		}
		for _, op := range []nft.Op{
			{Kind: nft.OpAddElements, Set: cips, Elements: cipEls},
			{Kind: nft.OpAddElements, Set: hp, Elements: hpEls},
			{Kind: nft.OpAddElements, Set: noEp, Elements: noEpEls},
		} {
			if err := b.addOp(op); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	results := []costResult{
		{shape, fmt.Sprintf("fixed part: %d maps, %d chains, dispatch vmap", shards, shards), size, fixed, 0},
		{shape, fmt.Sprintf("cold start: all Services (x%d endpoints) in one batch", nb), size, cold, 0},
	}
	reps := costReps()
	add := func(name string, do, undo func() (time.Duration, error)) {
		fwd, back := costPair(t, reps, do, undo)
		results = append(results, costResult{shape, name, size, fwd, back})
	}
	k := size / 2
	if len(svcs[k].Backends) == 0 {
		k++
	}
	sk := svcs[k]
	change := func(s nfttest.Service, from, to []netip.AddrPort, cip bool) func() (time.Duration, error) {
		m := shardMap(shardOf(s.ClusterIP))
		cipEl := []nft.Element{{Key: []nft.Datum{nft.Addr(s.ClusterIP)}}}
		return func() (time.Duration, error) {
			return costRaw(n, f, func(b *batch) error {
				if len(from) > 0 {
					b.costIntervalElems(unix.NFT_MSG_DELSETELEM, m, costDeleteRanges(ranges(s, from)), false)
					if err := b.addOp(nft.Op{Kind: nft.OpDeleteElements, Set: hp, Elements: costHairpin(from)}); err != nil {
						return err
					}
					if cip {
						if err := b.addOp(nft.Op{Kind: nft.OpDeleteElements, Set: cips, Elements: cipEl}); err != nil {
							return err
						}
					}
				}
				if len(to) > 0 {
					b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, m, ranges(s, to), false)
					if err := b.addOp(nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: costHairpin(to)}); err != nil {
						return err
					}
					if cip {
						if err := b.addOp(nft.Op{Kind: nft.OpAddElements, Set: cips, Elements: cipEl}); err != nil {
							return err
						}
					}
				}
				return nil
			})
		}
	}
	alt := costAltBackends(k, nb)
	add(fmt.Sprintf("s) endpoint change %d -> %d other pods: ranges + hairpin", nb, nb),
		change(sk, sk.Backends, alt, false), change(sk, alt, sk.Backends, false))
	more := append(costAltBackends(k, nb+1)[:1:1], sk.Backends...)
	add(fmt.Sprintf("s) endpoint change %d -> %d (scale up) / back", nb, nb+1),
		change(sk, sk.Backends, more, false), change(sk, more, sk.Backends, false))
	ns1 := nfttest.MakeService(f, size+500, nb)
	add("s) new service: cluster-ip + ranges + hairpin / remove it",
		change(ns1, nil, ns1.Backends, true), change(ns1, ns1.Backends, nil, true))
	hpElem := nft.Element{Key: []nft.Datum{nft.Addr(sk.Backends[0].Addr()), nft.Addr(sk.Backends[0].Addr()), nfttest.TCP, nft.Int(9999)}}
	add("s) a) add 1 plain set element (hairpin) / delete it",
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpAddElements, Set: hp, Elements: []nft.Element{hpElem}}}})
		},
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteElements, Set: hp, Elements: []nft.Element{hpElem}}}})
		})
	flush := nft.Op{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: "scratch"}}
	add("s) flush a chain + add 1 dnat rule (full validation of this table)",
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{flush, {Kind: nft.OpAddRule, ChainName: "scratch",
				Rule: nft.Rule{Phrases: []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.DNAT{To: sk.Backends[0]}}}}}})
		}, nil)
	costReport(t, results...)
}
