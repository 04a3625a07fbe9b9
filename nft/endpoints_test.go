package nft

import (
	"net/netip"
	"testing"
)

// TestEndpointsElements: the ranges of a Service's endpoints cover every
// bucket once, in order, and differ in size by at most one.
func TestEndpointsElements(t *testing.T) {
	svc := netip.MustParseAddr("10.96.0.10")
	for _, n := range []int{1, 2, 3, 5, 7, 10, 100, 1000, 65535, 65536, 70000} {
		eps := make([]netip.AddrPort, n)
		for j := range eps {
			eps[j] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128, byte(j >> 8), byte(j)}), uint16(j))
		}
		els := EndpointsElements(svc, 80, eps)
		if want := min(n, EndpointBuckets); len(els) != want {
			t.Fatalf("%d endpoints: %d elements, want %d", n, len(els), want)
		}
		next, smallest, largest := uint32(0), uint32(EndpointBuckets), uint32(0)
		for j, e := range els {
			lo := e.Key[2].Int
			if lo != next || e.End < lo || e.Key[0].Addr != svc || e.Key[1].Int != 80 {
				t.Fatalf("%d endpoints: element %d is %v-%d, want it to start at %d", n, j, e.Key, e.End, next)
			}
			if to := netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int)); to != eps[j] {
				t.Fatalf("%d endpoints: element %d goes to %v, want %v", n, j, to, eps[j])
			}
			size := e.End - lo + 1
			smallest, largest = min(smallest, size), max(largest, size)
			next = e.End + 1
		}
		if next != EndpointBuckets || largest-smallest > 1 {
			t.Errorf("%d endpoints: ranges end at %d, sizes %d to %d", n, next, smallest, largest)
		}
	}
	if els := EndpointsElements(svc, 80, nil); len(els) != 0 {
		t.Errorf("no endpoints: %d elements", len(els))
	}
}

func TestAddrLowBits(t *testing.T) {
	for _, tc := range []struct {
		addr string
		bits int
		want uint32
		key  string
	}{
		{"10.96.0.10", 8, 10, "0.0.0.10"},
		{"10.96.3.10", 10, 0x30a, "0.0.3.10"},
		{"10.96.3.10", 16, 0x30a, "0.0.3.10"},
		{"fd00:96::1:3ff", 8, 0xff, "::ff"},
		{"fd00:96::1:3ff", 10, 0x3ff, "::3ff"},
		{"fd00:96::5:3ff", 32, 0x503ff, "::5:3ff"},
	} {
		a := netip.MustParseAddr(tc.addr)
		got := AddrLowBits(a, tc.bits)
		f := IPv4
		if a.Is6() {
			f = IPv6
		}
		if key := LowBitsAddr(f, got).String(); got != tc.want || key != tc.key {
			t.Errorf("%s & %d bits: %#x (key %s), want %#x (%s)", tc.addr, tc.bits, got, key, tc.want, tc.key)
		}
	}
	for f, want := range map[Family]string{IPv4: "ip daddr & 0.0.0.255 vmap @d", IPv6: "ip6 daddr & ::3ff vmap @d"} {
		bits := 8
		if f == IPv6 {
			bits = 10
		}
		if got := (VmapAddrBits{Field: FieldDstAddr, Bits: bits, Map: "d"}).Text(f); got != want {
			t.Errorf("%s: %q, want %q", f, got, want)
		}
	}
}

// TestEndpointsMapEncodingErrors: the encoder refuses what it cannot write
// as nft would.
func TestEndpointsMapEncodingErrors(t *testing.T) {
	f := IPv4
	bad := NewEndpointsMap(f, "e", ProtoTCP)
	bad.Key = bad.Key[:2]
	m := NewEndpointsMap(f, "m", ProtoTCP)
	svc := netip.MustParseAddr("10.96.0.10")
	for name, op := range map[string]Op{
		"wrong key":    {Kind: OpAddSet, Set: bad},
		"ICMP":         {Kind: OpAddSet, Set: NewEndpointsMap(f, "e", 1)},
		"end < start":  {Kind: OpAddElements, Set: m, Elements: []Element{{Key: []Datum{Addr(svc), Int(80), Int(5)}, End: 4, Data: []Datum{Addr(svc), Int(1)}}}},
		"DNATMap ICMP": {Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{DNATMap{Proto: 1, Map: "m"}}}},
		"bits 0":       {Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{VmapAddrBits{Field: FieldDstAddr, Map: "m"}}}},
		"bits of port": {Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{VmapAddrBits{Field: FieldDstPort, Bits: 2, Map: "m"}}}},
	} {
		if _, err := encodeTransaction(&Transaction{Family: f, Ops: []Op{op}}, batchOptions{}); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}
