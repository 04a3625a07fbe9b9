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
