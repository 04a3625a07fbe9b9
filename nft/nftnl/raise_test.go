package nftnl

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// lowerRaise lowers r as Apply writes it and raises the expressions back.
func lowerRaise(t *testing.T, f nft.Family, r nft.Rule) []nft.Phrase {
	t.Helper()
	b := newBatch(&nft.Transaction{Family: f}, batchOptions{})
	list := b.enc.Nest(unix.NFTA_RULE_EXPRESSIONS)
	if err := b.lowerRule(r); err != nil {
		t.Fatalf("lower %q: %v", r.Text(f), err)
	}
	b.enc.EndNest(list)
	var d nlcodec.Decoder
	var exprs []kexpr
	d.Attrs(b.enc.Buf[list:], func(_ uint16, v []byte) { exprs = decodeExprs(&d, v) })
	if err := d.Err(); err != nil {
		t.Fatalf("decode %q: %v", r.Text(f), err)
	}
	return raiseRule(f, exprs)
}

// TestRaiseEveryPhrase: every rule of the ruleset that uses every phrase,
// in both families, raises back to the phrases it was lowered from.
func TestRaiseEveryPhrase(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		rs := nfttest.EveryPhraseRuleset(f)
		seen := map[string]bool{}
		for _, c := range rs.Chains {
			for _, r := range c.Rules {
				got := nft.Rule{Phrases: lowerRaise(t, f, r)}
				want := nft.Rule{Phrases: r.Phrases}
				if got.Text(f) != want.Text(f) {
					t.Errorf("%s chain %s:\n got %s\nwant %s", f, c.Name, got.Text(f), want.Text(f))
				}
				for _, p := range got.Phrases {
					seen[phraseType(p)] = true
				}
			}
		}
		// The fixture must keep using every phrase, or this test proves less.
		for _, p := range []nft.Phrase{nft.MatchPrefix{}, nft.MatchSet{}, nft.VmapLookup{}, nft.MatchL4Proto{},
			nft.MatchCtStateNew{}, nft.MatchCtStatusDNAT{}, nft.MatchMarkBits{}, nft.SetMarkBits{},
			nft.ToggleMarkBits{}, nft.Masquerade{}, nft.Reject{}, nft.RejectTCPReset{}, nft.VerdictPhrase{},
			nft.MatchRandom{}, nft.DNAT{}, nft.DNATMap{}, nft.MatchFibLocal{}, nft.MatchIifname{}, nft.UpdateSet{}} {
			if !seen[phraseType(p)] {
				t.Errorf("%s: the fixture has no %s phrase", f, phraseType(p))
			}
		}
	}
}

func phraseType(p nft.Phrase) string { return fmt.Sprintf("%T", p) }

// TestRaiseVariants: the forms a phrase takes that the fixture may not
// have (prefix lengths, negations, interface prefixes, slots).
func TestRaiseVariants(t *testing.T) {
	v4 := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	cases := []struct {
		f nft.Family
		p nft.Phrase
	}{
		{nft.IPv4, nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: v4("10.96.0.0/12")}},
		{nft.IPv4, nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: v4("10.244.0.0/16"), Negate: true}},
		{nft.IPv4, nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: v4("10.96.0.10/32")}},
		{nft.IPv4, nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: v4("10.0.0.0/1")}},
		{nft.IPv6, nft.MatchPrefix{Field: nft.FieldSrcAddr, Prefix: v4("fd00:244::/60")}},
		{nft.IPv6, nft.MatchPrefix{Field: nft.FieldDstAddr, Prefix: v4("fd00::1/128"), Negate: true}},
		{nft.IPv4, nft.MatchSet{Fields: []nft.Field{nft.FieldDstAddr}, Set: "s", Negate: true}},
		{nft.IPv6, nft.MatchSet{Fields: []nft.Field{nft.FieldSrcAddr, nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}, Set: "h"}},
		{nft.IPv4, nft.VmapLookup{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldDstPort}, Map: "m"}},
		{nft.IPv4, nft.MatchIifname{Name: "eth0", Negate: true}},
		{nft.IPv4, nft.MatchIifname{Name: "veth", Prefix: true}},
		{nft.IPv4, nft.MatchFibLocal{Field: nft.FieldSrcAddr}},
		{nft.IPv6, nft.DNATMap{Proto: nft.ProtoSCTP, Map: "endpoints-sctp-3", Slot: 63}},
		{nft.IPv6, nft.DNAT{To: netip.MustParseAddrPort("[fd00:244:1::11]:8080")}},
		{nft.IPv4, nft.ToggleMarkBits{Bits: 0x4000}},
		{nft.IPv4, nft.MatchRandom{Mod: 7}},
		{nft.IPv6, nft.Reject{}},
		{nft.IPv6, nft.UpdateSet{Field: nft.FieldSrcAddr, Set: "affinity"}},
		{nft.IPv4, nft.Goto("service-x")},
		{nft.IPv4, nft.VerdictPhrase{Verdict: nft.Verdict{Kind: nft.VerdictReturn}}},
	}
	for _, c := range cases {
		r := nft.Rule{Phrases: []nft.Phrase{c.p}}
		if _, ok := c.p.(nft.DNAT); ok {
			r.Phrases = []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP}, c.p}
		}
		got := nft.Rule{Phrases: lowerRaise(t, c.f, r)}
		if got.Text(c.f) != r.Text(c.f) {
			t.Errorf("%s: got %q, want %q", c.f, got.Text(c.f), r.Text(c.f))
		}
	}
}

// TestRaiseOpaque: expressions that are no phrase of ours are named, and
// do not hide the phrases around them.
func TestRaiseOpaque(t *testing.T) {
	exprs := []kexpr{
		{name: "counter", attrs: map[uint16][]byte{}},
		{name: "log", attrs: map[uint16][]byte{}},
		{name: "meta", attrs: map[uint16][]byte{unix.NFTA_META_KEY: be32(unix.NFT_META_L4PROTO), unix.NFTA_META_DREG: be32(reg1)}},
		{name: "range", attrs: map[uint16][]byte{}},
		{name: "immediate", attrs: map[uint16][]byte{unix.NFTA_IMMEDIATE_DREG: be32(unix.NFT_REG_VERDICT),
			unix.NFTA_IMMEDIATE_DATA: verdictData(nft.Verdict{Kind: nft.VerdictDrop})}},
	}
	got := nft.Rule{Phrases: raiseRule(nft.IPv4, exprs)}
	if want := "[counter log meta range] drop"; got.Text(nft.IPv4) != want {
		t.Errorf("got %q, want %q", got.Text(nft.IPv4), want)
	}
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func verdictData(v nft.Verdict) []byte {
	var e encoder
	e.verdict(v)
	return e.Buf
}
