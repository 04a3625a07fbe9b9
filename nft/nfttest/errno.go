package nfttest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/nftproxy/nftproxy/nft"
	"golang.org/x/sys/unix"
)

// ErrnoCase is one operation applied on top of a base table, with the
// error the kernel answers (0: accepted). The same table runs against the
// Fake (nft/nftfake) and the kernel (nft/nftnl): both must give the same
// errno, so the Fake stays faithful where the proxier's tests rely on it.
//
// Encoder cases are refused by our netlink encoder before the kernel sees
// them (our own invariants: one slot per range, no range end outside an
// interval set, comments that fit their userdata): there the kernel test
// checks that nftnl refuses them without a kernel errno, and Want is the
// errno the Fake gives.
type ErrnoCase struct {
	Name    string
	Base    func() *nft.Ruleset
	Op      nft.Op
	Want    unix.Errno
	Encoder bool
}

// olderErrnos are the errnos older kernels answer instead of a case's
// Want, by case: CheckKernel accepts them; the Fake gives Want, as the
// newest kernels do.
var olderErrnos = map[string]unix.Errno{
	// Debian's 6.1 and 5.10 answer EINVAL, 6.12 and later ENODATA.
	"DNATMap on a verdict map": unix.EINVAL,
}

// Check applies the case's base table, then its operation, on a fresh
// backend and reports how the result differs from Want (nil: as wanted).
func (c ErrnoCase) Check(ctx context.Context, be nft.Interface) error {
	return c.check(ctx, be, false)
}

// CheckKernel is Check for a kernel, which may answer what older kernels
// answer instead (olderErrnos).
func (c ErrnoCase) CheckKernel(ctx context.Context, be nft.Interface) error {
	return c.check(ctx, be, true)
}

func (c ErrnoCase) check(ctx context.Context, be nft.Interface, older bool) error {
	base := c.Base()
	if err := be.Apply(ctx, nft.Diff(nil, base)); err != nil {
		return fmt.Errorf("base table: %w", err)
	}
	err := be.Apply(ctx, &nft.Transaction{Family: base.Family, Ops: []nft.Op{c.Op}})
	switch {
	case c.Want == 0 && err != nil:
		return fmt.Errorf("error %v, want none", err)
	case older && olderErrnos[c.Name] != 0 && errors.Is(err, olderErrnos[c.Name]):
		return nil
	case c.Want != 0 && !errors.Is(err, c.Want):
		return fmt.Errorf("error %v, want %v (%s)", err, c.Want, unix.ErrnoName(c.Want))
	}
	return nil
}

// ErrnoCases is every case: endpoints maps and the phrases that use them,
// then names and comments at and past the kernel's limits.
func ErrnoCases() []ErrnoCase {
	return append(EndpointsErrnoCases(), LimitErrnoCases()...)
}

// endpointsBase is a slot table with one Service of two endpoints on slot
// endpointsSlot of the TCP endpoints map.
func endpointsBase() *nft.Ruleset {
	rs := SlotTable(nft.IPv4)
	AddSlotService(rs, "web", nft.ProtoTCP, endpointsSvc, 80, endpointsSlot, endpointsEps())
	rs.AddSet(&nft.Set{Name: "vips", Key: []nft.DataType{nft.TypeIPv4Addr}})
	return rs
}

const endpointsSlot = 2

var endpointsSvc = netip.MustParseAddr("10.96.0.10")

func endpointsEps() []netip.AddrPort { return Backends(nft.IPv4, 1, 2, 8080) }

// EndpointsErrnoCases are the checks on endpoints maps' ranges and on
// DNATMap rules.
func EndpointsErrnoCases() []ErrnoCase {
	m := EndpointsMapName(nft.ProtoTCP)
	eps := endpointsEps()
	el := func(lo, hi uint32) nft.Element {
		return nft.Element{Key: []nft.Datum{nft.Int(endpointsSlot*nft.EndpointBuckets + lo)}, End: endpointsSlot*nft.EndpointBuckets + hi,
			Data: []nft.Datum{nft.Addr(eps[0].Addr()), nft.Int(1)}}
	}
	elems := func(kind nft.OpKind, es ...nft.Element) nft.Op {
		return nft.Op{Kind: kind, Set: endpointsBase().Sets[m], Elements: es}
	}
	rule := func(p nft.Phrase) nft.Op {
		return nft.Op{Kind: nft.OpAddRule, ChainName: "web", Rule: nft.Rule{Phrases: []nft.Phrase{p}}}
	}
	withTimeout := nft.NewEndpointsMap(nft.IPv4, "e", nft.ProtoTCP)
	withTimeout.Dynamic = true
	last := nft.Element{Key: []nft.Datum{nft.Int(nft.EndpointsSlots * nft.EndpointBuckets)}, End: 1<<32 - 1,
		Data: []nft.Datum{nft.Addr(eps[0].Addr()), nft.Int(1)}}
	rangeInPlainSet := nft.Element{Key: []nft.Datum{nft.Addr(endpointsSvc), nft.Int(6), nft.Int(9)}, End: 3, Verdict: &nft.Verdict{Kind: nft.VerdictDrop}}
	cases := []ErrnoCase{
		{"the same element again", nil, elems(nft.OpAddElements, nft.EndpointsElements(endpointsSlot, eps)[1]), 0, false},
		{"another slot", nil, elems(nft.OpAddElements, nft.EndpointsElements(endpointsSlot+1, eps[:1])...), 0, false},
		{"overlapping the start", nil, elems(nft.OpAddElements, el(0, 7)), unix.EEXIST, false},
		{"overlapping the end", nil, elems(nft.OpAddElements, el(65535, 65535)), unix.EEXIST, false},
		{"covering a range", nil, elems(nft.OpAddElements, el(0, 65535)), unix.EEXIST, false},
		{"same start, other end", nil, elems(nft.OpAddElements, el(32768, 40000)), unix.EEXIST, false},
		{"end before start", nil, elems(nft.OpAddElements, el(9, 8)), unix.EINVAL, true},
		{"across slots", nil, elems(nft.OpAddElements, el(9+nft.EndpointBuckets, 2*nft.EndpointBuckets)), unix.EINVAL, true},
		{"last slot", nil, elems(nft.OpAddElements, last), unix.EINVAL, true},
		{"delete with another end", nil, elems(nft.OpDeleteElements, el(0, 32766)), unix.ENOENT, false},
		{"delete", nil, elems(nft.OpDeleteElements, nft.EndpointsElements(endpointsSlot, eps)...), 0, false},
		{"range end in a plain set", nil, nft.Op{Kind: nft.OpAddElements, Set: &nft.Set{Name: "services"}, Elements: []nft.Element{rangeInPlainSet}}, unix.EINVAL, true},
		{"delete a map in use", nil, nft.Op{Kind: nft.OpDeleteSet, Set: &nft.Set{Name: m}}, unix.EBUSY, false},
		{"DNATMap on a missing map", nil, rule(nft.DNATMap{Proto: nft.ProtoTCP, Map: "nope"}), unix.ENOENT, false},
		{"DNATMap on another protocol's map", nil, rule(nft.DNATMap{Proto: nft.ProtoUDP, Map: m}), 0, false},
		{"DNATMap on a verdict map", nil, rule(nft.DNATMap{Proto: nft.ProtoTCP, Map: "services"}), unix.ENODATA, false},
		{"DNATMap on a plain set", nil, rule(nft.DNATMap{Proto: nft.ProtoTCP, Map: "vips"}), unix.EINVAL, false},
		{"DNATMap on the last slot", nil, rule(nft.DNATMap{Proto: nft.ProtoTCP, Map: m, Slot: nft.EndpointsSlots}), unix.ERANGE, true},
		{"endpoints map of ICMP", nil, nft.Op{Kind: nft.OpAddSet, Set: nft.NewEndpointsMap(nft.IPv4, "e", 1)}, unix.EINVAL, true},
		{"endpoints map of the other family", nil, nft.Op{Kind: nft.OpAddSet, Set: nft.NewEndpointsMap(nft.IPv6, "e", nft.ProtoTCP)}, unix.EINVAL, true},
		{"endpoints map with a timeout", nil, nft.Op{Kind: nft.OpAddSet, Set: withTimeout}, unix.EINVAL, true},
	}
	for i := range cases {
		cases[i].Base = endpointsBase
	}
	return cases
}

func limitsBase() *nft.Ruleset {
	rs := nft.NewRuleset(nft.IPv4)
	rs.Chains["c"] = &nft.Chain{Name: "c"}
	rs.Sets["ips"] = &nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}}
	return rs
}

// LimitErrnoCases are names and comments at and past the kernel's limits,
// and a match our encoder refuses (a prefix of every address).
func LimitErrnoCases() []ErrnoCase {
	long := func(n int) string { return "c" + strings.Repeat("x", n-1) }
	elem := func(comment string) nft.Op {
		return nft.Op{Kind: nft.OpAddElements, Set: limitsBase().Sets["ips"],
			Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(netip.MustParseAddr("10.0.0.1"))}, Comment: comment}}}
	}
	rule := func(comment string, ps ...nft.Phrase) nft.Op {
		return nft.Op{Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: ps, Comment: comment}}
	}
	prefix := func(p string) nft.Phrase {
		return nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: netip.MustParsePrefix(p)}
	}
	set := func(name string) *nft.Set { return &nft.Set{Name: name, Key: []nft.DataType{nft.TypeIPv4Addr}} }
	cases := []ErrnoCase{
		{"chain name of 255 bytes", nil, nft.Op{Kind: nft.OpAddChain, Chain: &nft.Chain{Name: long(255)}}, 0, false},
		{"chain name of 256 bytes", nil, nft.Op{Kind: nft.OpAddChain, Chain: &nft.Chain{Name: long(256)}}, unix.ERANGE, false},
		{"set name of 255 bytes", nil, nft.Op{Kind: nft.OpAddSet, Set: set(long(255))}, 0, false},
		{"set name of 256 bytes", nil, nft.Op{Kind: nft.OpAddSet, Set: set(long(256))}, unix.ERANGE, false},
		{"element comment of 253 bytes", nil, elem(long(253)), 0, false},
		{"element comment of 254 bytes", nil, elem(long(254)), unix.ERANGE, true},
		{"rule comment of 253 bytes", nil, rule(long(253), nft.Drop()), 0, false},
		{"rule comment of 254 bytes", nil, rule(long(254), nft.Drop()), unix.ERANGE, true},
		{"a prefix of 1 bit", nil, rule("", prefix("0.0.0.0/1"), nft.Drop()), 0, false},
		{"a prefix of everything", nil, rule("", prefix("0.0.0.0/0"), nft.Drop()), unix.EINVAL, true},
	}
	for i := range cases {
		cases[i].Base = limitsBase
	}
	return cases
}
