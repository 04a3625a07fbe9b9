package nft

import (
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
	op   Op
	want error
} {
	long := func(n int) string { return "c" + strings.Repeat("x", n-1) }
	elem := func(comment string) Op {
		return Op{Kind: OpAddElements, Set: limitsBase().Sets["ips"],
			Elements: []Element{{Key: []Datum{Addr(netip.MustParseAddr("10.0.0.1"))}, Comment: comment}}}
	}
	return []struct {
		name string
		op   Op
		want error
	}{
		{"chain name of 255 bytes", Op{Kind: OpAddChain, Chain: &Chain{Name: long(255)}}, nil},
		{"chain name of 256 bytes", Op{Kind: OpAddChain, Chain: &Chain{Name: long(256)}}, unix.ERANGE},
		{"set name of 255 bytes", Op{Kind: OpAddSet, Set: &Set{Name: long(255), Key: []DataType{TypeIPv4Addr}}}, nil},
		{"set name of 256 bytes", Op{Kind: OpAddSet, Set: &Set{Name: long(256), Key: []DataType{TypeIPv4Addr}}}, unix.ERANGE},
		{"element comment of 253 bytes", elem(long(253)), nil},
		{"element comment of 254 bytes", elem(long(254)), unix.ERANGE},
		{"rule comment of 253 bytes", Op{Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{Drop()}, Comment: long(253)}}, nil},
		{"rule comment of 254 bytes", Op{Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{Drop()}, Comment: long(254)}}, unix.ERANGE},
		{"a prefix of 1 bit", Op{Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{
			MatchPrefix{Field: FieldSrcAddr, Prefix: netip.MustParsePrefix("0.0.0.0/1")}, Drop()}}}, nil},
		{"a prefix of everything", Op{Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{
			MatchPrefix{Field: FieldSrcAddr, Prefix: netip.MustParsePrefix("0.0.0.0/0")}, Drop()}}}, unix.EINVAL},
	}
}

func limitsBase() *Ruleset {
	rs := NewRuleset(IPv4)
	rs.Chains["c"] = &Chain{Name: "c"}
	rs.Sets["ips"] = &Set{Name: "ips", Key: []DataType{TypeIPv4Addr}}
	return rs
}

// TestFakeChecksLimits: the Fake refuses names and comments the kernel
// (or our encoder, for comments and a prefix of every address) refuses, so
// that the proxier's tests see such a ruleset fail the sync as the kernel
// would.
func TestFakeChecksLimits(t *testing.T) {
	for _, tc := range limitCases() {
		fk := NewFake()
		if err := fk.Apply(context.Background(), Diff(nil, limitsBase())); err != nil {
			t.Fatal(err)
		}
		err := fk.Apply(context.Background(), &Transaction{Family: IPv4, Ops: []Op{tc.op}})
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
			apply(t, n, Diff(nil, limitsBase()))
			err := n.Apply(context.Background(), &Transaction{Family: IPv4, Ops: []Op{tc.op}})
			if (err == nil) != (tc.want == nil) {
				t.Errorf("kernel: error %v, the Fake's %v", err, tc.want)
			}
		})
	}
}
