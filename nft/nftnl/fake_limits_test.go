package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"

	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// limitCases are operations at and past the kernel's limits on names and
// comments, and a match our encoder refuses; want nil: accepted.
func limitCases() []struct {
	name string
	op   nft.Op
	want error
} {
	long := func(n int) string { return "c" + strings.Repeat("x", n-1) }
	elem := func(comment string) nft.Op {
		return nft.Op{Kind: nft.OpAddElements, Set: limitsBase().Sets["ips"],
			Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(netip.MustParseAddr("10.0.0.1"))}, Comment: comment}}}
	}
	return []struct {
		name string
		op   nft.Op
		want error
	}{
		{"chain name of 255 bytes", nft.Op{Kind: nft.OpAddChain, Chain: &nft.Chain{Name: long(255)}}, nil},
		{"chain name of 256 bytes", nft.Op{Kind: nft.OpAddChain, Chain: &nft.Chain{Name: long(256)}}, unix.ERANGE},
		{"set name of 255 bytes", nft.Op{Kind: nft.OpAddSet, Set: &nft.Set{Name: long(255), Key: []nft.DataType{nft.TypeIPv4Addr}}}, nil},
		{"set name of 256 bytes", nft.Op{Kind: nft.OpAddSet, Set: &nft.Set{Name: long(256), Key: []nft.DataType{nft.TypeIPv4Addr}}}, unix.ERANGE},
		{"element comment of 253 bytes", elem(long(253)), nil},
		{"element comment of 254 bytes", elem(long(254)), unix.ERANGE},
		{"rule comment of 253 bytes", nft.Op{Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{nft.Drop()}, Comment: long(253)}}, nil},
		{"rule comment of 254 bytes", nft.Op{Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{nft.Drop()}, Comment: long(254)}}, unix.ERANGE},
		{"a prefix of 1 bit", nft.Op{Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{
			nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: netip.MustParsePrefix("0.0.0.0/1")}, nft.Drop()}}}, nil},
		{"a prefix of everything", nft.Op{Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{
			nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: netip.MustParsePrefix("0.0.0.0/0")}, nft.Drop()}}}, unix.EINVAL},
	}
}

func limitsBase() *nft.Ruleset {
	rs := nft.NewRuleset(nft.IPv4)
	rs.Chains["c"] = &nft.Chain{Name: "c"}
	rs.Sets["ips"] = &nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}}
	return rs
}

// TestFakeChecksLimits: the Fake refuses names and comments the kernel
// (or our encoder, for comments and a prefix of every address) refuses, so
// that the proxier's tests see such a ruleset fail the sync as the kernel
// would.
func TestFakeChecksLimits(t *testing.T) {
	for _, tc := range limitCases() {
		fk := nftfake.New()
		if err := fk.Apply(context.Background(), nft.Diff(nil, limitsBase())); err != nil {
			t.Fatal(err)
		}
		err := fk.Apply(context.Background(), &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{tc.op}})
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestNetlinkLimitsMatchFake: the kernel, through our encoder, accepts and
// refuses the same operations as the Fake.
func TestNetlinkLimitsMatchFake(t *testing.T) {
	for _, tc := range limitCases() {
		t.Run(tc.name, func(t *testing.T) {
			ns := newTestNS(t)
			n := ns.netlink(t)
			apply(t, n, nft.Diff(nil, limitsBase()))
			err := n.Apply(context.Background(), &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{tc.op}})
			if (err == nil) != (tc.want == nil) {
				t.Errorf("kernel: error %v, the Fake's %v", err, tc.want)
			}
		})
	}
}
