package nftnl

// Designs issue 16 ("Performance II") evaluates, written as raw batches
// because the model cannot express them: h, one global interval map keyed
// by ClusterIP, protocol, port and a random bucket; s, the same split over
// fixed shards. Their benchmarks time them, TestGlobalAndShardedMapsDNAT
// checks they route connections.

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// costEndpointType is the data type ipv4_addr . inet_service.
var costEndpointType = typeMagic([]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetService})

// costGlobalKeyType is ipv4_addr . inet_proto . inet_service . integer.
var costGlobalKeyType = typeMagic([]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeInteger})

// BenchmarkKernelGlobalMap: design h, for issue 16. No per-Service chains and no verdict
// map gotos: one rule in the services chain,
//
//	dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 65536 map @service-endpoints
//
// looks the Service and a random bucket up in one interval map. The kernel
// picks rbtree for it (16-byte keys, no NFT_SET_CONCAT); with
// NFTPROXY_COST_PIPAPO=1 the same map is also built as nft would
// (concatenation: pipapo).
func BenchmarkKernelGlobalMap(b *testing.B) {
	b.Run("rbtree", func(b *testing.B) { benchBeds(b, globalMapBed(false)) })
	b.Run("pipapo", func(b *testing.B) { benchBeds(b, globalMapBed(true)) })
}

func globalMapBed(pipapo bool) func(b *testing.B, sz benchSize) *costBed {
	return func(b *testing.B, sz benchSize) *costBed { return costGlobalMap(b, sz, pipapo) }
}

func costGlobalMap(tb *testing.B, sz benchSize, pipapo bool) *costBed {
	var fields []uint32
	if pipapo {
		fields = []uint32{4, 1, 2, 4}
	}
	size, nb := sz.services, sz.endpoints
	f := nft.IPv4
	ns := newTestNS(tb)
	n := ns.netlink(tb)
	rs := nfttest.RealisticRuleset(f, nil)
	rs.AddChain(&nft.Chain{Name: "scratch"})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Jump("scratch")}})
	if _, err := costTx(n, nft.Diff(nil, rs)); err != nil {
		tb.Fatal(err)
	}
	svcs := nfttest.MakeServices(f, size, nb)
	cips, hp := rs.Sets["cluster-ips"], rs.Sets["hairpin-connections"]
	const gm = "service-endpoints"
	ranges := func(s nfttest.Service, eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(s.ClusterIP, nft.ProtoTCP, 80), eps, pipapo)
	}
	cold, err := costRaw(n, f, func(b *batch) error {
		b.costIntervalMap(gm, costGlobalKeyType, 16, costEndpointType, 8, fields)
		var all []costRange
		ops := costServiceElements(rs, svcs, nil, func(s nfttest.Service) { all = append(all, ranges(s, s.Backends)...) })
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gm, all, pipapo)
		b.costRule("services", costGlobalRule(gm, b.setIDs[gm]))
		return b.addOps(ops)
	})
	if err != nil {
		tb.Fatal(err)
	}
	bed := &costBed{build: []costPhase{{"cold", cold}}}
	add := func(name string, do, undo func() (time.Duration, error)) {
		bed.changes = append(bed.changes, costChange{name, do, undo})
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
	add("endpoint-change", change(sk, sk.Backends, alt), change(sk, alt, sk.Backends))
	more := append(costAltBackends(k, nb+1)[:1:1], sk.Backends...)
	add(fmt.Sprintf("scale-up-%d", nb+1), change(sk, sk.Backends, more), change(sk, more, sk.Backends))
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
	add("new-service", newSvc(true), newSvc(false))
	// Rule work in this table: validation walks a few base chains only.
	flush := nft.Op{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: "scratch"}}
	add("flush-chain-add-rule",
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{flush, {Kind: nft.OpAddRule, ChainName: "scratch",
				Rule: nft.Rule{Phrases: []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.DNAT{To: sk.Backends[0]}}}}}})
		}, nil)
	return bed
}

// BenchmarkKernelShardedMaps: design s, for issue 16, h split into K fixed shards so that
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
// so no table validation, and 1/K of the ranges to rebuild), K = 256.
func BenchmarkKernelShardedMaps(b *testing.B) { benchBeds(b, costShardedMaps) }

func costShardedMaps(tb *testing.B, sz benchSize) *costBed {
	const shards = 256
	size, nb := sz.services, sz.endpoints
	f := nft.IPv4
	ns := newTestNS(tb)
	n := ns.netlink(tb)
	rs := nfttest.RealisticRuleset(f, nil)
	rs.AddChain(&nft.Chain{Name: "scratch"})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Jump("scratch")}})
	if _, err := costTx(n, nft.Diff(nil, rs)); err != nil {
		tb.Fatal(err)
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
		tb.Fatal(err)
	}
	svcs := nfttest.MakeServices(f, size, nb)
	cips, hp := rs.Sets["cluster-ips"], rs.Sets["hairpin-connections"]
	ranges := func(s nfttest.Service, eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(s.ClusterIP, nft.ProtoTCP, 80), eps, false)
	}
	cold, err := costRaw(n, f, func(b *batch) error {
		perShard := make([][]costRange, shards)
		ops := costServiceElements(rs, svcs, nil, func(s nfttest.Service) {
			i := shardOf(s.ClusterIP)
			perShard[i] = append(perShard[i], ranges(s, s.Backends)...)
		})
		for i, rgs := range perShard {
			if len(rgs) > 0 {
				b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, shardMap(i), rgs, false)
			}
		}
		return b.addOps(ops)
	})
	if err != nil {
		tb.Fatal(err)
	}
	bed := &costBed{build: []costPhase{{"fixed", fixed}, {"cold", cold}}}
	add := func(name string, do, undo func() (time.Duration, error)) {
		bed.changes = append(bed.changes, costChange{name, do, undo})
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
	add("endpoint-change",
		change(sk, sk.Backends, alt, false), change(sk, alt, sk.Backends, false))
	more := append(costAltBackends(k, nb+1)[:1:1], sk.Backends...)
	add(fmt.Sprintf("scale-up-%d", nb+1),
		change(sk, sk.Backends, more, false), change(sk, more, sk.Backends, false))
	ns1 := nfttest.MakeService(f, size+500, nb)
	add("new-service",
		change(ns1, nil, ns1.Backends, true), change(ns1, ns1.Backends, nil, true))
	hpElem := nft.Element{Key: []nft.Datum{nft.Addr(sk.Backends[0].Addr()), nft.Addr(sk.Backends[0].Addr()), nfttest.TCP, nft.Int(9999)}}
	add("hairpin-element",
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpAddElements, Set: hp, Elements: []nft.Element{hpElem}}}})
		},
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteElements, Set: hp, Elements: []nft.Element{hpElem}}}})
		})
	flush := nft.Op{Kind: nft.OpFlushChain, Chain: &nft.Chain{Name: "scratch"}}
	add("flush-chain-add-rule",
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{flush, {Kind: nft.OpAddRule, ChainName: "scratch",
				Rule: nft.Rule{Phrases: []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP}, nft.DNAT{To: sk.Backends[0]}}}}}})
		}, nil)
	return bed
}

// TestGlobalAndShardedMapsDNAT: designs h and s (BenchmarkKernelGlobalMap,
// BenchmarkKernelShardedMaps) DNAT for real, as their benchmarks write
// them. Connections from the namespace to one ClusterIP per design reach
// each of 3 local endpoints; after an element-only endpoint change, only
// the remaining one.
func TestGlobalAndShardedMapsDNAT(t *testing.T) {
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
	svcH := nfttest.Service{Index: 2, ClusterIP: netip.MustParseAddr("10.96.0.10"), Backends: eps}
	// Design s with 4 shards: 10.96.0.12 & 3 = shard 0.
	svcS := nfttest.Service{Index: 3, ClusterIP: netip.MustParseAddr("10.96.0.12"), Backends: eps}
	sRanges := func(eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(svcS.ClusterIP, nft.ProtoTCP, 80), eps, false)
	}
	const gm = "service-endpoints"
	hRanges := func(eps []netip.AddrPort) []costRange {
		return costBucketRanges(costVIPKey(svcH.ClusterIP, nft.ProtoTCP, 80), eps, false)
	}
	if _, err := costRaw(n, f, func(b *batch) error {
		b.costIntervalMap(gm, costGlobalKeyType, 16, costEndpointType, 8, nil)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, gm, hRanges(eps), false)
		b.costRule("services", costGlobalRule(gm, b.setIDs[gm]))
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
			{Kind: nft.OpAddElements, Set: rs.Sets["cluster-ips"], Elements: []nft.Element{
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
	for _, vip := range []netip.Addr{svcH.ClusterIP, svcS.ClusterIP} {
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
		b.costIntervalElems(unix.NFT_MSG_DELSETELEM, "endpoints-s0", costDeleteRanges(sRanges(eps)), false)
		b.costIntervalElems(unix.NFT_MSG_NEWSETELEM, "endpoints-s0", sRanges(last), false)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, vip := range []netip.Addr{svcH.ClusterIP, svcS.ClusterIP} {
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
