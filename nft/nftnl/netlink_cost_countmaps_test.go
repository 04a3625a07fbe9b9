package nftnl

// Design n, for issue 16: no per-Service chain. Services are grouped by
// their number of endpoints N; one chain and one rule per N, and one exact
// (hash) map per N keyed by the Service and a random bucket below N:
//
//	service-ips: 10.96.0.10 . tcp . 80 : goto pick-tcp-5
//	pick-tcp-5:  meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod 5 map @endpoints-tcp-5
//	endpoints-tcp-5: typeof ip daddr . tcp dport . numgen random mod 5 : ip daddr . tcp dport
//
// A Service's endpoints are N exact elements (what kube-proxy's numgen vmap
// holds per Service); an endpoint change replaces elements of a hash map,
// whose cost does not grow with the map; a change of N moves the Service's
// elements to another map and changes its goto, which makes the kernel
// validate a table of a few chains. nft 1.0.6 lists and reloads this shape
// (with the typeof userdata the model would write).

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func BenchmarkKernelCountMaps(b *testing.B) { benchBeds(b, costCountMaps) }

// costCountKeyType is ipv4_addr . inet_service . integer.
var costCountKeyType = typeMagic([]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetService, nft.TypeInteger})

// costCountElems are the N elements of Service s in its endpoints-tcp-N
// map: key ClusterIP . port 80 . bucket (host order, as numgen writes it),
// data the endpoint. For DELSETELEM the data is left out.
func costCountElems(s nfttest.Service, eps []netip.AddrPort, del bool) []costRange {
	a := s.ClusterIP.As4()
	out := make([]costRange, len(eps))
	for j, ep := range eps {
		k := append(a[:], 0, 80, 0, 0)
		k = binary.NativeEndian.AppendUint32(k, uint32(j))
		out[j] = costRange{lo: k}
		if !del {
			out[j].data = costAddrPort(ep)
		}
	}
	return out
}

// costExactElems writes NEWSETELEM or DELSETELEM for exact elements (lo is
// the key): costIntervalElems' pipapo form, whose KEY_END is left out when
// hi is nil.
func (b *batch) costExactElems(msgType uint16, set string, els []costRange) {
	b.costIntervalElems(msgType, set, els, true)
}

// costCountRule is pick-tcp-N's rule:
//
//	meta l4proto tcp dnat ip to ip daddr . tcp dport . numgen random mod N map @<set>
//
// [ meta load l4proto => reg 1 ] [ cmp eq reg 1 0x00000006 ]
// [ payload load 4b @ network header + 16 => reg 1 ]
// [ payload load 2b @ transport header + 2 => reg 9 ] [ numgen reg 10 = random mod N ]
// [ lookup reg 1 set <set> dreg 1 ] [ nat dnat ip addr_min reg 1 proto_min reg 9 ]
func costCountRule(set string, setID uint32, n int) func(e *encoder) {
	return func(e *encoder) {
		e.metaLoad(unix.NFT_META_L4PROTO, reg1)
		e.cmp(unix.NFT_CMP_EQ, reg1, []byte{unix.IPPROTO_TCP})
		e.payloadLoad(unix.NFT_PAYLOAD_NETWORK_HEADER, 16, 4, slotReg(0))
		e.payloadLoad(unix.NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, slotReg(1))
		e.numgenRandom(slotReg(2), uint32(n))
		e.lookupData(reg1, reg1, set, setID)
		e.dnat(uint32(nft.IPv4), reg1, slotReg(1), unix.NF_NAT_RANGE_PROTO_SPECIFIED)
	}
}

func costCountMaps(tb *testing.B, sz benchSize) *costBed {
	size, nb := sz.services, sz.endpoints
	f := nft.IPv4
	n := newTestNS(tb).netlink(tb)
	rs := nfttest.RealisticRuleset(f, nil)
	rs.AddChain(&nft.Chain{Name: "scratch"})
	rs.Append("services", nft.Rule{Phrases: []nft.Phrase{nft.Jump("scratch")}})
	if _, err := costTx(n, nft.Diff(nil, rs)); err != nil {
		tb.Fatal(err)
	}
	mapOf := func(k int) string { return fmt.Sprintf("endpoints-tcp-%d", k) }
	chainOf := func(k int) string { return fmt.Sprintf("pick-tcp-%d", k) }
	svcs := nfttest.MakeServices(f, size, nb)
	cips, hp, sips := rs.Sets["cluster-ips"], rs.Sets["hairpin-connections"], rs.Sets["service-ips"]
	dispatch := func(s nfttest.Service, k int) []nft.Element {
		return []nft.Element{{Key: []nft.Datum{nft.Addr(s.ClusterIP), nfttest.TCP, nft.Int(80)}, Comment: s.Name(),
			Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: chainOf(k)}}}
	}
	cold, err := costRaw(n, f, func(b *batch) error {
		// The maps and chains of the endpoint counts in use (and the
		// scale-up's), created with the Services as a cold start would.
		for _, k := range []int{nb, nb + 1} {
			b.costExactMap(mapOf(k), costCountKeyType, 12, costEndpointType, 8)
			b.newChain(&nft.Chain{Name: chainOf(k)})
			b.costRule(chainOf(k), costCountRule(mapOf(k), b.setIDs[mapOf(k)], k))
		}
		var els []costRange
		ops := costServiceElements(rs, svcs, func(s nfttest.Service) []nft.Element { return dispatch(s, nb) },
			func(s nfttest.Service) { els = append(els, costCountElems(s, s.Backends, false)...) })
		b.costExactElems(unix.NFT_MSG_NEWSETELEM, mapOf(nb), els)
		if err := b.addOps(ops); err != nil {
			return err
		}
		return nil
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
	// move replaces Service s's endpoints from with to (one of them may be
	// empty: a new or removed Service, with its ClusterIP).
	move := func(s nfttest.Service, from, to []netip.AddrPort) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			return costRaw(n, f, func(b *batch) error {
				var ops []nft.Op
				// side writes the elements of eps out (del) or in; other
				// is the endpoints on the other side of the move.
				side := func(eps, other []netip.AddrPort, del bool) {
					msg, kind := uint16(unix.NFT_MSG_NEWSETELEM), nft.OpAddElements
					if del {
						msg, kind = unix.NFT_MSG_DELSETELEM, nft.OpDeleteElements
					}
					b.costExactElems(msg, mapOf(len(eps)), costCountElems(s, eps, del))
					ops = append(ops, nft.Op{Kind: kind, Set: hp, Elements: costHairpin(eps)})
					if len(other) != len(eps) {
						ops = append(ops, nft.Op{Kind: kind, Set: sips, Elements: dispatch(s, len(eps))})
					}
					if len(other) == 0 {
						ops = append(ops, nft.Op{Kind: kind, Set: cips, Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(s.ClusterIP)}}}})
					}
				}
				if len(from) > 0 {
					side(from, to, true)
				}
				if len(to) > 0 {
					side(to, from, false)
				}
				return b.addOps(ops)
			})
		}
	}
	alt := costAltBackends(k, nb)
	add("endpoint-change", move(sk, sk.Backends, alt), move(sk, alt, sk.Backends))
	more := append(costAltBackends(k, nb+1)[:1:1], sk.Backends...)
	add(fmt.Sprintf("scale-up-%d", nb+1), move(sk, sk.Backends, more), move(sk, more, sk.Backends))
	ns1 := nfttest.MakeService(f, size+500, nb)
	add("new-service", move(ns1, nil, ns1.Backends), move(ns1, ns1.Backends, nil))
	hpElem := nft.Element{Key: []nft.Datum{nft.Addr(sk.Backends[0].Addr()), nft.Addr(sk.Backends[0].Addr()), nfttest.TCP, nft.Int(9999)}}
	add("hairpin-element",
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpAddElements, Set: hp, Elements: []nft.Element{hpElem}}}})
		},
		func() (time.Duration, error) {
			return costTx(n, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteElements, Set: hp, Elements: []nft.Element{hpElem}}}})
		})
	return bed
}
