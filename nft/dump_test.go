package nft_test

import (
	"github.com/nftproxy/nftproxy/nft"

	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// TestCanonical: a listing in nft's layout (blocks in its order, elements
// wrapped several to a line) becomes what Dump prints.
func TestCanonical(t *testing.T) {
	rs := nft.NewRuleset(nft.IPv4)
	rs.AddSet(&nft.Set{Name: "a", Key: []nft.DataType{nft.TypeIPv4Addr}})
	rs.AddChain(&nft.Chain{Name: "b", Rules: []nft.Rule{{Phrases: []nft.Phrase{nft.Drop()}}}})
	var elems []string
	for i := range 20000 {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		rs.AddElement("a", nft.Element{Key: []nft.Datum{nft.Addr(a)}})
		elems = append(elems, a.String())
	}
	var wrapped []string
	for i := 0; i < len(elems); i += 3 {
		wrapped = append(wrapped, strings.Join(elems[i:min(i+3, len(elems))], ", "))
	}
	listing := "table ip nftproxy {\n\tchain b {\n\t\tdrop\n\t}\n\n\tset a {\n\t\ttype ipv4_addr\n" +
		"\t\telements = { " + strings.Join(wrapped, ",\n\t\t\t     ") + " }\n\t}\n}\n"
	if got, want := nft.Canonical(listing), rs.Dump(); got != want {
		t.Errorf("Canonical:\n%.500s\nwant:\n%.500s", got, want)
	}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		rs := nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 100, 3))
		if d := rs.Dump(); nft.Canonical(d) != d {
			t.Errorf("%s: Canonical(Dump()) != Dump()", f)
		}
	}
}

func BenchmarkCanonical10k(b *testing.B) {
	d := nfttest.RealisticRuleset(nft.IPv4, nfttest.MakeServices(nft.IPv4, 10000, 5)).Dump()
	b.SetBytes(int64(len(d)))
	for b.Loop() {
		nft.Canonical(d)
	}
}

// TestCanonicalPriorities: a base chain's priority reads the same however
// the listing's nft wrote it: nft 1.1 names dstnat on the output hook
// ("dstnat - 10") where nft 1.0.6 prints a number (-110).
func TestCanonicalPriorities(t *testing.T) {
	rs := nft.NewRuleset(nft.IPv4)
	for _, c := range []struct {
		name string
		typ  nft.ChainType
		hook nft.Hook
		prio int32
	}{
		{"nat-output", nft.ChainNAT, nft.HookOutput, nft.PriorityDstNAT},
		{"filter-output-pre-dnat", nft.ChainFilter, nft.HookOutput, nft.PriorityPreDstNATFilter},
		{"nat-prerouting", nft.ChainNAT, nft.HookPrerouting, nft.PriorityDstNAT},
		{"nat-postrouting", nft.ChainNAT, nft.HookPostrouting, nft.PrioritySrcNAT},
		{"filter-input", nft.ChainFilter, nft.HookInput, nft.PriorityFilter},
		{"odd", nft.ChainFilter, nft.HookInput, -42},
	} {
		rs.AddChain(&nft.Chain{Name: c.name, Base: &nft.BaseChain{Type: c.typ, Hook: c.hook, Priority: c.prio}})
	}
	want := rs.Dump()
	if got := nft.Canonical(want); got != want {
		t.Errorf("Canonical(Dump) =\n%s\nwant\n%s", got, want)
	}
	nft11 := strings.NewReplacer(
		"type nat hook output priority -100;", "type nat hook output priority dstnat;",
		"type filter hook output priority -110;", "type filter hook output priority dstnat - 10;",
		"type filter hook input priority filter;", "type filter hook input priority 0;",
	).Replace(want)
	if nft11 == want {
		t.Fatal("the replacements changed nothing")
	}
	if got := nft.Canonical(nft11); got != want {
		t.Errorf("Canonical of nft 1.1's listing =\n%s\nwant\n%s", got, want)
	}
}
