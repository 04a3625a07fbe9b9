package nft

// Shape s, written by the encoder itself (endpoints maps, DNATMap,
// VmapAddrBits): what do cold start, an endpoint change and a new Service
// cost the kernel with nft's own pipapo maps, for K shards?
//
//	NFTPROXY_COST=1 NFTPROXY_COST_SHARDS=256,1024 NFTPROXY_COST_S_SIZES=10000x5,100000x10 \
//	  go test ./nft -run TestNetlinkCostShapeS -v -timeout 3h
//
// The table is realisticRuleset's shared part plus, for K shards:
//
//	services:  ip daddr & 0.0.0.255 vmap @shard-dispatch   (K elements: goto shard-<i>)
//	shard-<i>: dnat ip to ip daddr . tcp dport . numgen random mod 65536 map @endpoints-tcp-<i>
//	           (and udp, sctp: 3 rules, 3 endpoints maps per shard)
//
// and per Service its ClusterIP in cluster-ips, its endpoints' hairpin
// elements, and its ranges of buckets in its shard's TCP map (a Service
// without endpoints: a no-endpoint-services element instead). Times are
// the kernel's (BatchStats.Kernel), medians of NFTPROXY_COST_REPS batches.
// NFTPROXY_COST_LIST=0 skips the `nft list table` check (Canonical(listing)
// must equal Dump, and Load must read back the same table);
// NFTPROXY_COST_S_PROTOS=tcp makes TCP endpoints maps only.
//
// Results on Linux 6.18.44, 2 shared vCPUs (ms, kernel time; ranges from
// two runs where they were repeated):
//
//	                 K     fixed part  cold start  endpoint change  scale 5→6 / 10→11  new Service add / remove  1 range add / delete
//	10k×5    pipapo  256   39          889–1401    9.7–10.4         10.5–11.3          0.3–0.5 / 7–10            0.2 / 1.5–2.1
//	10k×5    pipapo  1024  445         1415–1967   2.3–3.7          2.3–3.8            0.5 / 3.2                 0.2 / 0.5–0.6
//	100k×10  pipapo  256   21          16,085      220–239          221–233            1.3 / 213                 0.8 / 20
//	100k×10  pipapo  1024  —           22,541      58–84            67–90              1.6 / 70                  1.2 / 10.5
//
// With TCP maps only (10k×5): K=256 fixed 5, cold 826, change 6.3;
// K=1024 fixed 57, cold 946, change 1.9; K=4096 fixed 541, cold 1,835,
// change 1.9. Creating K endpoints maps costs O(K²) (each NEWSET walks the
// table's sets). A pipapo delete costs about 5 µs per range already in
// the map (pipapo_drop compacts every field's lookup tables), an add
// 0.2–1.3 ms; a smaller modulus (mod 1024) halves the cold start and
// leaves deletes as slow. For comparison, the rbtree shard maps of
// TestNetlinkCostShardedMaps, same machine and day: 10k×5 K=256 cold 185,
// endpoint change 0.07; 100k×10 cold 3,832 (K=256) and 3,758 (K=1024),
// endpoint change 0.26 and 0.12 — but nft 1.0.6 crashes listing an rbtree
// map with a concatenated key (interval decomposition, __gmpz_sub), typeof
// userdata or not; declared as one 96-bit integer it lists, as decimals.
//
// `nft list table` equals Dump at 1k×5, 10k×5 (K 256 and 1024) and
// 100k×10 (K 256: 115 MB, 64 s of nft), and Load reads the same table back.

import (
	"fmt"
	"math/bits"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestNetlinkCostShapeS(t *testing.T) {
	costGuard(t)
	shardCounts := costSizes(t, "NFTPROXY_COST_SHARDS", "256,1024")
	spec := os.Getenv("NFTPROXY_COST_S_SIZES")
	if spec == "" {
		spec = "10000x5"
	}
	for _, sz := range strings.Split(spec, ",") {
		var size, eps int
		if _, err := fmt.Sscanf(strings.TrimSpace(sz), "%dx%d", &size, &eps); err != nil {
			t.Fatalf("NFTPROXY_COST_S_SIZES=%q: %v", spec, err)
		}
		for _, k := range shardCounts {
			if k < 2 || k > 1<<16 || k&(k-1) != 0 {
				t.Fatalf("%d shards: want a power of 2, 2 to 65536", k)
			}
			t.Run(fmt.Sprintf("%dx%d/K%d", size, eps, k), func(t *testing.T) { costShapeS(t, size, eps, k) })
		}
	}
}

// shapeSProtos are the protocols with endpoints maps in every shard
// (NFTPROXY_COST_S_PROTOS, default tcp,udp,sctp).
func shapeSProtos() []uint8 {
	v := os.Getenv("NFTPROXY_COST_S_PROTOS")
	if v == "" {
		return []uint8{ProtoTCP, ProtoUDP, ProtoSCTP}
	}
	var out []uint8
	for _, p := range strings.Split(v, ",") {
		for _, proto := range []uint8{ProtoTCP, ProtoUDP, ProtoSCTP} {
			if ProtoName(proto) == strings.TrimSpace(p) {
				out = append(out, proto)
			}
		}
	}
	return out
}

// shapeSRuleset is the table of TestNetlinkCostShapeS.
func shapeSRuleset(f Family, shards int, svcs []testService) *Ruleset {
	rs := realisticRuleset(f, nil)
	rs.AddSet(&Set{Name: "shard-dispatch", Key: []DataType{f.AddrType()}, Data: []DataType{TypeVerdict},
		Comment: "shard of a ClusterIP: its low bits"})
	for i := range shards {
		chain := shardChainName(i)
		rs.AddChain(&Chain{Name: chain})
		for _, proto := range shapeSProtos() {
			m := shardMapName(proto, i)
			rs.AddSet(NewEndpointsMap(f, m, proto))
			rs.Append(chain, Rule{Phrases: []Phrase{DNATMap{Proto: proto, Map: m}}})
		}
		rs.AddElement("shard-dispatch", Element{Key: []Datum{Addr(LowBitsAddr(f, uint32(i)))},
			Verdict: &Verdict{Kind: VerdictGoto, Chain: chain}})
	}
	rs.Append("services", Rule{Phrases: []Phrase{VmapAddrBits{Field: FieldDstAddr, Bits: shardBits(shards), Map: "shard-dispatch"}}})
	for _, s := range svcs {
		addShapeSService(rs, shards, s)
	}
	return rs
}

func shardBits(shards int) int    { return bits.TrailingZeros(uint(shards)) }
func shardChainName(i int) string { return fmt.Sprintf("shard-%d", i) }
func shardMapName(proto uint8, i int) string {
	return fmt.Sprintf("endpoints-%s-%d", ProtoName(proto), i)
}
func shardOf(shards int, ip netip.Addr) int { return int(AddrLowBits(ip, shardBits(shards))) }
func shapeSMap(shards int, s testService) string {
	return shardMapName(ProtoTCP, shardOf(shards, s.clusterIP))
}

// addShapeSService adds one Service's elements.
func addShapeSService(rs *Ruleset, shards int, s testService) {
	rs.AddElement("cluster-ips", Element{Key: []Datum{Addr(s.clusterIP)}})
	if len(s.backends) == 0 {
		rs.AddElement("no-endpoint-services", Element{Key: []Datum{Addr(s.clusterIP), tcp, Int(80)}, Comment: s.name(),
			Verdict: &Verdict{Kind: VerdictGoto, Chain: "reject-chain"}})
		return
	}
	m := shapeSMap(shards, s)
	for _, e := range EndpointsElements(s.clusterIP, 80, s.backends) {
		rs.AddElement(m, e)
	}
	for _, e := range costHairpin(s.backends) {
		rs.AddElement("hairpin-connections", e)
	}
}

func costShapeS(t *testing.T, size, nb, shards int) {
	shape := fmt.Sprintf("s pipapo K=%d", shards)
	f := IPv4
	label := fmt.Sprintf("%dx%d", size, nb)
	var results []costResult
	{
		// The fixed part alone, in a namespace of its own.
		ns := newTestNS(t)
		fixed, err := costTx(ns.netlink(t), Diff(nil, shapeSRuleset(f, shards, nil)))
		if err != nil {
			t.Fatal(err)
		}
		results = append(results, costResult{shape, fmt.Sprintf("fixed part alone: %d chains, %d endpoints maps, dispatch",
			shards, shards*len(shapeSProtos())), size, fixed, 0})
	}
	ns := newTestNS(t)
	n := ns.netlink(t)
	svcs := makeServices(f, size, nb)
	rs := shapeSRuleset(f, shards, svcs)

	cold, err := costTx(n, Diff(nil, rs))
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
	tx := func(ops ...Op) func() (time.Duration, error) {
		return func() (time.Duration, error) { return costTx(n, &Transaction{Family: f, Ops: ops}) }
	}
	k := size / 2
	if len(svcs[k].backends) == 0 {
		k++
	}
	sk := svcs[k]
	m := rs.Sets[shapeSMap(shards, sk)]
	hp, cips := rs.Sets["hairpin-connections"], rs.Sets["cluster-ips"]
	change := func(s testService, from, to []netip.AddrPort, cip bool) func() (time.Duration, error) {
		var ops []Op
		if len(from) > 0 {
			ops = append(ops, Op{Kind: OpDeleteElements, Set: m, Elements: EndpointsElements(s.clusterIP, 80, from)},
				Op{Kind: OpDeleteElements, Set: hp, Elements: costHairpin(from)})
			if cip {
				ops = append(ops, Op{Kind: OpDeleteElements, Set: cips, Elements: []Element{{Key: []Datum{Addr(s.clusterIP)}}}})
			}
		}
		if len(to) > 0 {
			ops = append(ops, Op{Kind: OpAddElements, Set: m, Elements: EndpointsElements(s.clusterIP, 80, to)},
				Op{Kind: OpAddElements, Set: hp, Elements: costHairpin(to)})
			if cip {
				ops = append(ops, Op{Kind: OpAddElements, Set: cips, Elements: []Element{{Key: []Datum{Addr(s.clusterIP)}}}})
			}
		}
		return tx(ops...)
	}
	alt := costAltBackends(k, nb)
	add(fmt.Sprintf("endpoint change %d -> %d other pods: ranges + hairpin", nb, nb),
		change(sk, sk.backends, alt, false), change(sk, alt, sk.backends, false))
	more := append(costAltBackends(k, nb+1)[:1:1], sk.backends...)
	add(fmt.Sprintf("endpoint change %d -> %d (scale up) / back", nb, nb+1),
		change(sk, sk.backends, more, false), change(sk, more, sk.backends, false))
	// A Service whose ClusterIP lands in the same shard as sk's.
	j := size
	for shardOf(shards, makeService(f, j, nb).clusterIP) != shardOf(shards, sk.clusterIP) || j%50 == 49 {
		j++
	}
	ns1 := makeService(f, j, nb)
	add("new service: cluster-ip + ranges + hairpin / remove it",
		change(ns1, nil, ns1.backends, true), change(ns1, ns1.backends, nil, true))
	one := Element{Key: []Datum{Addr(ns1.clusterIP), Int(80), Int(0)}, End: EndpointBuckets - 1,
		Data: []Datum{Addr(ns1.backends[0].Addr()), Int(8080)}}
	add("1 range into a shard map / delete it",
		tx(Op{Kind: OpAddElements, Set: m, Elements: []Element{one}}), tx(Op{Kind: OpDeleteElements, Set: m, Elements: []Element{one}}))
	hpElem := Element{Key: []Datum{Addr(sk.backends[0].Addr()), Addr(sk.backends[0].Addr()), tcp, Int(9999)}}
	add("1 plain set element (hairpin) / delete it",
		tx(Op{Kind: OpAddElements, Set: hp, Elements: []Element{hpElem}}), tx(Op{Kind: OpDeleteElements, Set: hp, Elements: []Element{hpElem}}))
	t.Logf("shard map %s holds %d ranges", m.Name, len(m.Elements))

	if v, err := strconv.ParseBool(os.Getenv("NFTPROXY_COST_LIST")); err == nil && !v {
		costReport(t, results...)
		return
	}
	start := time.Now()
	listing := ns.list(t, f)
	listed := time.Since(start)
	results = append(results, costResult{shape, label + " `nft list table` (wall time, not kernel)", size, listed, 0})
	costReport(t, results...)
	if got, want := Canonical(listing), rs.Dump(); got != want {
		t.Errorf("nft list differs from Dump (%d and %d bytes); first difference: %s", len(got), len(want), firstDiff(got, want))
	} else {
		t.Logf("nft list table: %d bytes, equal to Dump", len(listing))
	}
	if loaded := load(t, ns, f); Diff(loaded, rs).Changes() != 0 {
		t.Errorf("Load: a restart would change %d objects", Diff(loaded, rs).Changes())
	}
}

// firstDiff shows where two texts first differ.
func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n  nft:  %q\n  Dump: %q", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines against %d", len(al), len(bl))
}
