package nftnl

import (
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// TestEndpointsMapEncodingErrors: the encoder refuses what it cannot write
// as nft would.
func TestEndpointsMapEncodingErrors(t *testing.T) {
	f := nft.IPv4
	bad := nft.NewEndpointsMap(f, "e", nft.ProtoTCP)
	bad.Key = []nft.DataType{nft.TypeMark}
	m := nft.NewEndpointsMap(f, "m", nft.ProtoTCP)
	svc := netip.MustParseAddr("10.96.0.10")
	for name, op := range map[string]nft.Op{
		"wrong key":    {Kind: nft.OpAddSet, Set: bad},
		"ICMP":         {Kind: nft.OpAddSet, Set: nft.NewEndpointsMap(f, "e", 1)},
		"end < start":  {Kind: nft.OpAddElements, Set: m, Elements: []nft.Element{{Key: []nft.Datum{nft.Int(5)}, End: 4, Data: []nft.Datum{nft.Addr(svc), nft.Int(1)}}}},
		"DNATMap ICMP": {Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: 1, Map: "m"}}}},
		"last slot":    {Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{nft.DNATMap{Proto: nft.ProtoTCP, Map: "m", Slot: nft.EndpointsSlots}}}},
	} {
		if _, err := encodeTransaction(&nft.Transaction{Family: f, Ops: []nft.Op{op}}, batchOptions{}); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestNetlinkEndpointsChanges: endpoint changes of adjacent slots, applied
// by the kernel as element work only. After each, `nft list` prints what
// Dump prints and Load reads the same ranges back.
func TestNetlinkEndpointsChanges(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newTestNS(t)
			n := ns.netlink(t)
			web := nfttest.Addr(f, "10.96.0.10", "fd00:96::a")
			dns := nfttest.Addr(f, "10.96.0.11", "fd00:96::b")
			build := func(webEps, dnsEps []netip.AddrPort) *nft.Ruleset {
				rs := nfttest.SlotTable(f)
				nfttest.AddSlotService(rs, "web", nft.ProtoTCP, web, 80, 2, webEps)
				nfttest.AddSlotService(rs, "web-next", nft.ProtoTCP, web, 81, 3, dnsEps)
				nfttest.AddSlotService(rs, "dns", nft.ProtoUDP, dns, 53, 2, dnsEps)
				return rs
			}
			have := build(nfttest.Backends(f, 1, 3, 8080), nfttest.Backends(f, 2, 2, 53))
			apply(t, n, nft.Diff(nil, have))
			for i, step := range []struct{ web, dns []netip.AddrPort }{
				{nfttest.Backends(f, 1, 2, 8080), nfttest.Backends(f, 2, 2, 53)},  // 3 → 2, same first start
				{nfttest.Backends(f, 3, 5, 8080), nfttest.Backends(f, 4, 1, 53)},  // 2 → 5, 2 → 1 next door
				{nfttest.Backends(f, 3, 5, 9090), nfttest.Backends(f, 4, 1, 53)},  // same ranges, new ports
				{nil, nfttest.Backends(f, 4, 7, 53)},                              // web's slot emptied
				{nfttest.Backends(f, 5, 1, 8080), nil},                            // and filled again; next door empty
				{nfttest.Backends(f, 6, 100, 8080), nfttest.Backends(f, 7, 3, 1)}, // many
			} {
				want := build(step.web, step.dns)
				tx := nft.Diff(have, want)
				for _, op := range tx.Ops {
					if op.Kind != nft.OpAddElements && op.Kind != nft.OpDeleteElements {
						t.Errorf("step %d: %s %s", i, op.Kind, op.Target())
					}
				}
				apply(t, n, tx)
				if got, wantDump := ns.listed(t, f), ns.dumped(t, want); got != wantDump {
					t.Fatalf("step %d: nft list differs from Dump: %s", i, nfttest.FirstDiff(got, wantDump))
				}
				if loaded := load(t, ns, f); nft.Diff(loaded, want).Changes() != 0 {
					t.Fatalf("step %d: Load differs by %d objects", i, nft.Diff(loaded, want).Changes())
				}
				have = want
			}
		})
	}
}
