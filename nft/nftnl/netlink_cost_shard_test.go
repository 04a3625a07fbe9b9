package nftnl

// The slot shape, written by the encoder itself (endpoints maps, DNATMap):
// what do cold start, an endpoint change and a new Service cost the
// kernel, for endpoints maps of K slots each?
//
//	NFTPROXY_COST=1 NFTPROXY_COST_SLOTS=4096,65535 NFTPROXY_COST_S_SIZES=10000x5,100000x10 \
//	  go test ./nft -run TestNetlinkCostShapeS -v -timeout 3h
//
// The table is realisticRuleset's shared part plus, per Service with
// endpoints, its chain (one DNATMap rule on its slot), its service-ips and
// cluster-ips elements, its endpoints' hairpin elements, and its ranges of
// buckets in its slot's map (a Service without endpoints: a
// no-endpoint-services element instead). Times are the kernel's
// (BatchStats.Kernel), medians of NFTPROXY_COST_REPS batches.
// NFTPROXY_COST_LIST=0 skips the `nft list table` check (Canonical(listing)
// must equal Dump, and Load must read back the same table);
// NFTPROXY_COST_S_PROTOS=tcp makes TCP endpoints maps only.
//
// Results on Linux 6.18.44, 2 shared vCPUs (ms, kernel time; TCP maps
// only at 100k×10, NFTPROXY_COST_LIST=0 where a listing was not checked):
//
//	                 slots/map  cold start  endpoint change  scale up  new Service add / remove  1 hairpin element
//	10k×5            16         548         0.65             0.41      4.5 / 0.49                0.23
//	10k×5            32         428         0.25             0.24      5.5 / 0.35                0.26
//	10k×5            64         438         0.32             0.32      6.6 / 0.39                0.14
//	10k×5            256        666         0.45             0.46      3.2 / 0.27                0.23
//	10k×5            4096       4,313       2.60             2.32      5.5 / 0.91                0.10
//	10k×5            65535      16,897      9.09             8.98      20.3 / 6.0                0.11
//	100k×10 (nfttest.TCP)    64         10,351      6.32             6.53      100.5 / 6.2               6.17
//
// The kernel's cost per element change of an interval map grows with the
// map's size (and a cold start with the square of it): small maps.
//
// Where the 100k×10 cold start goes (K=64, tcp; the table with all
// elements of the other sets dropped, two runs each, kernel ms; a throwaway
// variant of this test, 2026-11-22): whole table 12,271–12,393; without the
// hairpin elements 9,328–9,897; the 980,000 hairpin elements alone
// 2,971–3,032; the 1,960,000 range elements alone (no rule) 2,817–2,972;
// the 100,000 chains with their DNATMap rules and service-ips elements
// alone 5,058–5,802; the 100,000 ClusterIPs alone 238–315. The parts add
// up. The chains' part depends on K: a rule's lookup finds its map by name,
// walking the table's sets (16 slots per map: 20,066–20,403), and binding a
// map walks the rules already bound to it (1,024: 10,417–11,006; 256:
// 4,687–5,401). perf (cpu-clock) over the whole cold batch: element
// inserts 60 % (rhashtable_insert_slow alone 24 %: the hash sets grow
// while the batch fills them), rules 28 % (the lookup by name 21 %),
// commit 5 %. At
// 100k×10 every transaction costs about 6–7 ms, even one hairpin element:
// nf_tables_commit walks every chain of every table to publish the next
// generation's rules (measured in a table of 100,000 one-rule chains and
// nothing else: 7.4 ms per one-element transaction; 100,000 endpoints
// slots without chains: 0.04 ms). Adding a Service (a goto element) makes
// the kernel validate the whole table. `nft list table` equals Dump at
// 10k×5 with 4,096 and 65,535 slots per map (7.5 MB, 2.4 s of nft).
//
// Earlier shapes, same machine (ms, kernel time): the key
// `ip daddr . tcp dport . numgen random mod 65536` needs no slots, but as
// an interval map with a concatenated key it is pipapo (what nft writes),
// which rebuilds its lookup tables on every change: with the Services
// spread over K=1024 maps by ClusterIP bits, 10k×5 cold start 1,415–1,967,
// endpoint change 2.3–3.7; 100k×10 cold 22,541, change 58–84. As an
// rbtree (no NFT_SET_CONCAT) it costs 0.07 per change at 10k×5 and
// 0.12–0.26 at 100k×10, but nft 1.0.6 crashes listing an rbtree map with a
// concatenated key (interval decomposition, __gmpz_sub). The slot shape
// keeps the rbtree and a single integer key, which nft lists.

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNetlinkCostShapeS(t *testing.T) {
	costGuard(t)
	perMaps := costSizes(t, "NFTPROXY_COST_SLOTS", "4096,65535")
	spec := os.Getenv("NFTPROXY_COST_S_SIZES")
	if spec == "" {
		spec = "10000x5"
	}
	for _, sz := range strings.Split(spec, ",") {
		var size, eps int
		if _, err := fmt.Sscanf(strings.TrimSpace(sz), "%dx%d", &size, &eps); err != nil {
			t.Fatalf("NFTPROXY_COST_S_SIZES=%q: %v", spec, err)
		}
		for _, k := range perMaps {
			if k < 1 || k > nft.EndpointsSlots {
				t.Fatalf("%d slots per map: want 1 to %d", k, nft.EndpointsSlots)
			}
			t.Run(fmt.Sprintf("%dx%d/K%d", size, eps, k), func(t *testing.T) { costShapeS(t, size, eps, k) })
		}
	}
}

// shapeSProtos are the protocols with endpoints maps in every shard
// (NFTPROXY_COST_S_PROTOS, default nfttest.TCP,nfttest.UDP,sctp).
func shapeSProtos() []uint8 {
	v := os.Getenv("NFTPROXY_COST_S_PROTOS")
	if v == "" {
		return []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP}
	}
	var out []uint8
	for _, p := range strings.Split(v, ",") {
		for _, proto := range []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP} {
			if nft.ProtoName(proto) == strings.TrimSpace(p) {
				out = append(out, proto)
			}
		}
	}
	return out
}

// shapeSRuleset is the table of TestNetlinkCostShapeS: realisticRuleset's
// shared part, endpoints maps of perMap slots each, and per Service a
// chain with one DNATMap rule on its slot, reached through service-ips.
func shapeSRuleset(f nft.Family, perMap int, svcs []nfttest.Service) *nft.Ruleset {
	rs := nfttest.RealisticRuleset(f, nil)
	for m := range (len(svcs)+perMap-1)/perMap + 1 {
		for _, proto := range shapeSProtos() {
			rs.AddSet(nft.NewEndpointsMap(f, slotMapName(proto, m), proto))
		}
	}
	for _, s := range svcs {
		addShapeSService(rs, perMap, s)
	}
	return rs
}

func slotMapName(proto uint8, i int) string {
	return fmt.Sprintf("endpoints-%s-%d", nft.ProtoName(proto), i)
}

// slotOf is the endpoints map and slot of Service s.
func slotOf(perMap int, s nfttest.Service) (string, uint16) {
	return slotMapName(nft.ProtoTCP, s.Index/perMap), uint16(s.Index % perMap)
}

// addShapeSService adds one Service: its chain, ClusterIP, service-ips
// element, ranges and hairpin elements.
func addShapeSService(rs *nft.Ruleset, perMap int, s nfttest.Service) {
	rs.AddElement("cluster-ips", nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP)}})
	if len(s.Backends) == 0 {
		rs.AddElement("no-endpoint-services", nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)}, Comment: s.Name(),
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "reject-chain"}})
		return
	}
	m, slot := slotOf(perMap, s)
	rs.AddChain(&nft.Chain{Name: s.Chain(), Rules: []nft.Rule{{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoTCP, Map: m, Slot: slot}}}}})
	rs.AddElement("service-ips", nft.Element{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)}, Comment: s.Name(),
		Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: s.Chain()}})
	for _, e := range nft.EndpointsElements(slot, s.Backends) {
		rs.AddElement(m, e)
	}
	for _, e := range costHairpin(s.Backends) {
		rs.AddElement("hairpin-connections", e)
	}
}

func costShapeS(t *testing.T, size, nb, perMap int) {
	shape := fmt.Sprintf("slots rbtree %d/map", perMap)
	f := nft.IPv4
	label := fmt.Sprintf("%dx%d", size, nb)
	var results []costResult
	ns := newTestNS(t)
	n := ns.netlink(t)
	svcs := nfttest.MakeServices(f, size, nb)
	rs := shapeSRuleset(f, perMap, svcs)

	cold, err := costTx(n, nft.Diff(nil, rs))
	if err != nil {
		t.Fatal(err)
	}
	st := n.LastBatch()
	t.Logf("cold start batch: %+v", st)
	results = append(results, costResult{shape, fmt.Sprintf("%s cold start: whole table in one batch (%d msgs, %.1f MiB)",
		label, st.Messages, float64(st.Bytes)/(1<<20)), size, cold, 0})
	reps := costReps()
	add := func(name string, do, undo func() (time.Duration, error)) {
		fwd, back := costPair(t, reps, do, undo)
		results = append(results, costResult{shape, label + " " + name, size, fwd, back})
	}
	tx := func(ops ...nft.Op) func() (time.Duration, error) {
		return func() (time.Duration, error) { return costTx(n, &nft.Transaction{Family: f, Ops: ops}) }
	}
	k := size / 2
	if len(svcs[k].Backends) == 0 {
		k++
	}
	sk := svcs[k]
	mName, slot := slotOf(perMap, sk)
	m := rs.Sets[mName]
	hp := rs.Sets["hairpin-connections"]
	change := func(from, to []netip.AddrPort) func() (time.Duration, error) {
		return tx(nft.Op{Kind: nft.OpDeleteElements, Set: m, Elements: nft.EndpointsElements(slot, from)},
			nft.Op{Kind: nft.OpDeleteElements, Set: hp, Elements: costHairpin(from)},
			nft.Op{Kind: nft.OpAddElements, Set: m, Elements: nft.EndpointsElements(slot, to)},
			nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: costHairpin(to)})
	}
	alt := costAltBackends(k, nb)
	add(fmt.Sprintf("endpoint change %d -> %d other pods: ranges + hairpin", nb, nb),
		change(sk.Backends, alt), change(alt, sk.Backends))
	more := append(costAltBackends(k, nb+1)[:1:1], sk.Backends...)
	add(fmt.Sprintf("endpoint change %d -> %d (scale up) / back", nb, nb+1),
		change(sk.Backends, more), change(more, sk.Backends))
	// A new Service in the last map's next free slot: chain, rule,
	// service-ips and cluster-ips elements, ranges (the vmap element's goto
	// makes the kernel validate the table).
	ns1 := nfttest.MakeService(f, size, nb)
	for len(ns1.Backends) == 0 {
		ns1 = nfttest.MakeService(f, ns1.Index+1, nb)
	}
	withNew := rs.Clone()
	addShapeSService(withNew, perMap, ns1)
	add("new service: chain + elements / remove it", tx(nft.Diff(rs, withNew).Ops...), tx(nft.Diff(withNew, rs).Ops...))
	hpElem := nft.Element{Key: []nft.Datum{nft.Addr(sk.Backends[0].Addr()), nft.Addr(sk.Backends[0].Addr()), nfttest.TCP, nft.Int(9999)}}
	add("1 plain set element (hairpin) / delete it",
		tx(nft.Op{Kind: nft.OpAddElements, Set: hp, Elements: []nft.Element{hpElem}}), tx(nft.Op{Kind: nft.OpDeleteElements, Set: hp, Elements: []nft.Element{hpElem}}))
	t.Logf("endpoints map %s holds %d ranges", m.Name, m.Elements.Len())

	if v, err := strconv.ParseBool(os.Getenv("NFTPROXY_COST_LIST")); err == nil && !v {
		costReport(t, results...)
		return
	}
	start := time.Now()
	listing := ns.list(t, f)
	listed := time.Since(start)
	results = append(results, costResult{shape, label + " `nft list table` (wall time, not kernel)", size, listed, 0})
	costReport(t, results...)
	if got, want := nft.Canonical(listing), rs.Dump(); got != want {
		t.Errorf("nft list differs from Dump (%d and %d bytes); first difference: %s", len(got), len(want), nfttest.FirstDiff(got, want))
	} else {
		t.Logf("nft list table: %d bytes, equal to Dump", len(listing))
	}
	if loaded := load(t, ns, f); nft.Diff(loaded, rs).Changes() != 0 {
		t.Errorf("Load: a restart would change %d objects", nft.Diff(loaded, rs).Changes())
	}
}
