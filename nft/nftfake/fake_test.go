package nftfake_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nfttest"
	"golang.org/x/sys/unix"
)

// TestFakeEndpointsChecks: the nftfake.Fake refuses what the kernel refuses for
// endpoints maps and the phrases that use them, with the kernel's errors.
func TestFakeEndpointsChecks(t *testing.T) {
	f := nft.IPv4
	svc := netip.MustParseAddr("10.96.0.10")
	eps := nfttest.Backends(f, 1, 2, 8080)
	m := nfttest.EndpointsMapName(nft.ProtoTCP)
	const slot = 2
	base := func() *nft.Ruleset {
		rs := nfttest.SlotTable(f)
		nfttest.AddSlotService(rs, "web", nft.ProtoTCP, svc, 80, slot, eps)
		return rs
	}
	el := func(lo, hi uint32) nft.Element {
		return nft.Element{Key: []nft.Datum{nft.Int(slot*nft.EndpointBuckets + lo)}, End: slot*nft.EndpointBuckets + hi, Data: []nft.Datum{nft.Addr(eps[0].Addr()), nft.Int(1)}}
	}
	elems := func(kind nft.OpKind, es ...nft.Element) nft.Op {
		return nft.Op{Kind: kind, Set: base().Sets[m], Elements: es}
	}
	for _, tc := range []struct {
		name string
		op   nft.Op
		want unix.Errno // 0: accepted
	}{
		{"the same element again", elems(nft.OpAddElements, nft.EndpointsElements(slot, eps)[1]), 0},
		{"another slot", elems(nft.OpAddElements, nft.EndpointsElements(slot+1, eps[:1])...), 0},
		{"overlapping the start", elems(nft.OpAddElements, el(0, 7)), unix.EEXIST},
		{"overlapping the end", elems(nft.OpAddElements, el(65535, 65535)), unix.EEXIST},
		{"covering a range", elems(nft.OpAddElements, el(0, 65535)), unix.EEXIST},
		{"same start, other end", elems(nft.OpAddElements, el(32768, 40000)), unix.EEXIST},
		{"end before start", elems(nft.OpAddElements, el(9, 8)), unix.EINVAL},
		{"across slots", elems(nft.OpAddElements, el(9+nft.EndpointBuckets, 2*nft.EndpointBuckets)), unix.EINVAL},
		{"last slot", elems(nft.OpAddElements, nft.Element{Key: []nft.Datum{nft.Int(nft.EndpointsSlots * nft.EndpointBuckets)}, End: 1<<32 - 1,
			Data: []nft.Datum{nft.Addr(eps[0].Addr()), nft.Int(1)}}), unix.EINVAL},
		{"delete with another end", elems(nft.OpDeleteElements, el(0, 32766)), unix.ENOENT},
		{"delete", elems(nft.OpDeleteElements, nft.EndpointsElements(slot, eps)...), 0},
		{"range end in a plain set", nft.Op{Kind: nft.OpAddElements, Set: &nft.Set{Name: "services"},
			Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(svc), nft.Int(6), nft.Int(9)}, End: 3, Verdict: &nft.Verdict{Kind: nft.VerdictDrop}}}}, unix.EINVAL},
		{"delete a map in use", nft.Op{Kind: nft.OpDeleteSet, Set: &nft.Set{Name: m}}, unix.EBUSY},
		{"DNATMap on a missing map", nft.Op{Kind: nft.OpAddRule, ChainName: "web",
			Rule: nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoTCP, Map: "nope"}}}}, unix.ENOENT},
		{"DNATMap on another protocol's map", nft.Op{Kind: nft.OpAddRule, ChainName: "web",
			Rule: nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoUDP, Map: m}}}}, unix.EINVAL},
		{"DNATMap on a verdict map", nft.Op{Kind: nft.OpAddRule, ChainName: "web",
			Rule: nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoTCP, Map: "services"}}}}, unix.EINVAL},
		{"DNATMap on the last slot", nft.Op{Kind: nft.OpAddRule, ChainName: "web",
			Rule: nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoTCP, Map: m, Slot: nft.EndpointsSlots}}}}, unix.ERANGE},
		{"endpoints map of ICMP", nft.Op{Kind: nft.OpAddSet, Set: nft.NewEndpointsMap(f, "e", 1)}, unix.EINVAL},
		{"endpoints map of the other family", nft.Op{Kind: nft.OpAddSet, Set: nft.NewEndpointsMap(nft.IPv6, "e", nft.ProtoTCP)}, unix.EINVAL},
		{"endpoints map with a timeout", nft.Op{Kind: nft.OpAddSet, Set: func() *nft.Set {
			s := nft.NewEndpointsMap(f, "e", nft.ProtoTCP)
			s.Dynamic = true
			return s
		}()}, unix.EINVAL},
	} {
		fk := nftfake.New()
		if err := fk.Apply(context.Background(), nft.Diff(nil, base())); err != nil {
			t.Fatal(err)
		}
		err := fk.Apply(context.Background(), &nft.Transaction{Family: f, Ops: []nft.Op{tc.op}})
		switch {
		case tc.want == 0 && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != 0 && !errors.Is(err, tc.want):
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
	}
}
