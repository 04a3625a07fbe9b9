package conntrack

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

func TestFamilyNames(t *testing.T) {
	if IPv4.String() != "IPv4" || IPv6.String() != "IPv6" {
		t.Errorf("names %q %q", IPv4, IPv6)
	}
}

func TestStaleTCP(t *testing.T) {
	for _, family := range []Family{IPv4, IPv6} {
		for k, c := range tcpCases {
			t.Run(fmt.Sprintf("%s/%s", family, c.name), func(t *testing.T) {
				w := world{family: family, proto: ProtoTCP, k: k}
				sc := c.build(w)
				got := Stale(sc.all(), sc.previous, sc.current, w.isNodePortAddr)
				if diff := flowDiff(got, sc.stale); diff != "" {
					t.Error(diff)
				}
			})
		}
	}
}

// forEachWorld runs fn for every family and reconciled protocol.
func forEachWorld(t *testing.T, fn func(t *testing.T, family Family, proto uint8)) {
	for _, family := range []Family{IPv4, IPv6} {
		for _, proto := range []uint8{ProtoUDP, ProtoSCTP} {
			t.Run(fmt.Sprintf("%s/%s", family, nft.ProtoName(proto)), func(t *testing.T) {
				fn(t, family, proto)
			})
		}
	}
}

func TestStale(t *testing.T) {
	forEachWorld(t, func(t *testing.T, family Family, proto uint8) {
		for k, c := range staleCases {
			t.Run(c.name, func(t *testing.T) {
				w := world{family: family, proto: proto, k: k}
				sc := c.build(w)
				got := Stale(sc.all(), sc.previous, sc.current, w.isNodePortAddr)
				if diff := flowDiff(got, sc.stale); diff != "" {
					t.Error(diff)
				}
			})
		}
	})
}

// flowDiff compares two sets of flows.
func flowDiff(got, want []Flow) string {
	var b strings.Builder
	for _, fl := range want {
		if !slices.Contains(got, fl) {
			fmt.Fprintf(&b, "\n  missing: %s", fl)
		}
	}
	for _, fl := range got {
		if !slices.Contains(want, fl) {
			fmt.Fprintf(&b, "\n  unexpected: %s", fl)
		}
	}
	if len(got) != len(want) && b.Len() == 0 {
		fmt.Fprintf(&b, "\n  got %d flows, want %d (duplicates?)", len(got), len(want))
	}
	return b.String()
}

func TestStaleNilIsNodePortAddrMatchesEveryAddress(t *testing.T) {
	w := world{family: IPv4, proto: ProtoUDP}
	np := w.np(1)
	prev := Frontends{np: eps(w.ep(1))}
	cur := Frontends{np: eps(w.ep(2))}
	flows := []Flow{w.nat(1, ap(w.node(), np.Port), w.ep(1)), w.nat(2, ap(w.other(), np.Port), w.ep(1))}
	if got := Stale(flows, prev, cur, nil); len(got) != 2 {
		t.Errorf("nil isNodePortAddr (upstream's port-only match): %d stale, want 2", len(got))
	}
	if got := Stale(flows, prev, cur, w.isNodePortAddr); len(got) != 1 {
		t.Errorf("node address only: %d stale, want 1", len(got))
	}
}

func TestStaleKeepsZoneAndID(t *testing.T) {
	w := world{family: IPv6, proto: ProtoUDP}
	fe := w.fe(w.cip(1), 53)
	fl := w.nat(1, ap(fe.Addr, 53), w.ep(1))
	fl.Zone, fl.ID = 3, 0xdeadbeef
	got := Stale([]Flow{fl}, nil, Frontends{fe: eps(w.ep(2))}, nil)
	if len(got) != 1 || got[0] != fl {
		t.Errorf("got %v, want %v", got, fl)
	}
}

func TestStaleMappedAddresses(t *testing.T) {
	// A caller's IPv4-mapped IPv6 addresses match the kernel's IPv4 ones.
	fe := Frontend{Proto: ProtoUDP, Addr: netip.MustParseAddr("::ffff:10.96.0.10"), Port: 53}
	ep := netip.MustParseAddrPort("[::ffff:10.244.0.1]:5353")
	kept := natFlow(ProtoUDP, netip.MustParseAddrPort("10.1.0.1:4000"), netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.244.0.1:5353"))
	stale := natFlow(ProtoUDP, netip.MustParseAddrPort("10.1.0.2:4000"), netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.244.0.2:5353"))
	got := Stale([]Flow{kept, stale}, nil, Frontends{fe: eps(ep)}, nil)
	if diff := flowDiff(got, []Flow{stale}); diff != "" {
		t.Error(diff)
	}
}

func TestStaleDuplicateEndpoints(t *testing.T) {
	// A frontend listing one endpoint twice still has endpoints; an
	// endpoint listed under one frontend does not serve another.
	w := world{family: IPv4, proto: ProtoUDP}
	a, b := w.fe(w.cip(1), 53), w.fe(w.cip(2), 53)
	cur := Frontends{a: eps(w.ep(1), w.ep(1)), b: eps(w.ep(2))}
	flows := []Flow{w.nat(1, ap(a.Addr, 53), w.ep(1)), w.nat(2, ap(a.Addr, 53), w.ep(2))}
	if diff := flowDiff(Stale(flows, nil, cur, nil), flows[1:]); diff != "" {
		t.Error(diff)
	}
}

func TestProtocols(t *testing.T) {
	udp := Frontend{Proto: ProtoUDP, Port: 1}
	sctp := Frontend{Proto: ProtoSCTP, Port: 1}
	tcp := Frontend{Proto: ProtoTCP, Port: 1}
	for _, tc := range []struct {
		prev, cur Frontends
		want      []uint8
	}{
		{nil, nil, nil},
		{Frontends{tcp: nil}, nil, nil},
		{Frontends{tcp: nil}, Frontends{tcp: nil}, []uint8{ProtoTCP}},
		{Frontends{udp: nil}, nil, []uint8{ProtoUDP}},
		{nil, Frontends{sctp: nil, tcp: nil}, []uint8{ProtoSCTP, ProtoTCP}},
		{Frontends{sctp: nil}, Frontends{udp: nil}, []uint8{ProtoUDP, ProtoSCTP}},
	} {
		if got := protocols(tc.prev, tc.cur); !slices.Equal(got, tc.want) {
			t.Errorf("protocols(%v, %v) = %v, want %v", tc.prev, tc.cur, got, tc.want)
		}
	}
}

// BenchmarkStale decides over 100,000 flows (see bigTable).
func BenchmarkStale(b *testing.B) {
	flows, prev, cur := bigTable(100_000, 1_000)
	b.ResetTimer()
	for b.Loop() {
		if got := Stale(flows, prev, cur, nil); len(got) != 1_000 {
			b.Fatal(len(got))
		}
	}
}
