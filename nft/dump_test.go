package nft

import (
	"net/netip"
	"strings"
	"testing"
)

// TestCanonical: a listing in nft's layout (blocks in its order, elements
// wrapped several to a line) becomes what Dump prints.
func TestCanonical(t *testing.T) {
	rs := NewRuleset(IPv4)
	rs.AddSet(&Set{Name: "a", Key: []DataType{TypeIPv4Addr}})
	rs.AddChain(&Chain{Name: "b", Rules: []Rule{{Phrases: []Phrase{Drop()}}}})
	var elems []string
	for i := range 20000 {
		a := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		rs.AddElement("a", Element{Key: []Datum{Addr(a)}})
		elems = append(elems, a.String())
	}
	var wrapped []string
	for i := 0; i < len(elems); i += 3 {
		wrapped = append(wrapped, strings.Join(elems[i:min(i+3, len(elems))], ", "))
	}
	listing := "table ip nftproxy {\n\tchain b {\n\t\tdrop\n\t}\n\n\tset a {\n\t\ttype ipv4_addr\n" +
		"\t\telements = { " + strings.Join(wrapped, ",\n\t\t\t     ") + " }\n\t}\n}\n"
	if got, want := Canonical(listing), rs.Dump(); got != want {
		t.Errorf("Canonical:\n%.500s\nwant:\n%.500s", got, want)
	}
	for _, f := range []Family{IPv4, IPv6} {
		rs := realisticRuleset(f, makeServices(f, 100, 3))
		if d := rs.Dump(); Canonical(d) != d {
			t.Errorf("%s: Canonical(Dump()) != Dump()", f)
		}
	}
}

func BenchmarkCanonical10k(b *testing.B) {
	d := realisticRuleset(IPv4, makeServices(IPv4, 10000, 5)).Dump()
	b.SetBytes(int64(len(d)))
	for b.Loop() {
		Canonical(d)
	}
}
