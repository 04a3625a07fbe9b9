package trace_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nfttest"
	"github.com/nftproxy/nftproxy/nft/trace"
)

// TestTraceDNATMap: the tracer follows a Service to its slot and reports
// every endpoint as a possible DNAT target; Pick chooses the one the
// packet goes to. An endpoint change is element work only.
func TestTraceDNATMap(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ctx := context.Background()
			fk := nftfake.New()
			rs := nfttest.SlotTable(f)
			web := nfttest.Addr(f, "10.96.0.10", "fd00:96::a")
			dns := nfttest.Addr(f, "10.96.0.11", "fd00:96::b")
			webEps, dnsEps := nfttest.Backends(f, 1, 3, 8080), nfttest.Backends(f, 2, 2, 53)
			// Adjacent slots: web's last range ends where dns's first starts.
			nfttest.AddSlotService(rs, "web", nft.ProtoTCP, web, 80, 2, webEps)
			nfttest.AddSlotService(rs, "web-udp", nft.ProtoUDP, web, 80, 2, nil)
			nfttest.AddSlotService(rs, "dns", nft.ProtoUDP, dns, 53, 3, dnsEps)
			if err := fk.Apply(ctx, nft.Diff(nil, rs)); err != nil {
				t.Fatal(err)
			}
			client := nfttest.Addr(f, "10.0.0.1", "fd00::1")
			for _, tc := range []struct {
				pkt  trace.Packet
				pick int
				want []netip.AddrPort
				to   netip.AddrPort
			}{
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 80}, 0, webEps, webEps[0]},
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 80}, 2, webEps, webEps[2]},
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 80}, 9, webEps, webEps[2]},
				{trace.Packet{Src: client, Dst: dns, Proto: nft.ProtoUDP, DPort: 53}, 1, dnsEps, dnsEps[1]},
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoUDP, DPort: 80}, 0, nil, netip.AddrPort{}},
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 81}, 0, nil, netip.AddrPort{}},
				{trace.Packet{Src: client, Dst: dns, Proto: nft.ProtoTCP, DPort: 53}, 0, nil, netip.AddrPort{}},
			} {
				tr := trace.New(fk.Rulesets())
				tr.Pick = tc.pick
				res := tr.Trace(tc.pkt)
				if !slices.Equal(res.DNAT, tc.want) || res.Verdict != nft.VerdictAccept {
					t.Errorf("%v pick %d: %s, DNAT %v, want %v\n%v", tc.pkt, tc.pick, res.Verdict, res.DNAT, tc.want, res.Path)
				}
			}

			// Move web to 2 other pods: the transaction changes elements only.
			ed := nft.NewEditorFrom(f, nfttest.MustLoad(t, fk, f))
			epsFrag := func(eps []netip.AddrPort) *nft.Fragment {
				var fr nft.Fragment
				for _, e := range nft.EndpointsElements(2, eps) {
					fr.Elements = append(fr.Elements, nft.SetElement{Set: nfttest.EndpointsMapName(nft.ProtoTCP), Element: e})
				}
				return &fr
			}
			for _, s := range rs.Sets {
				ed.AddSet(s)
			}
			for _, c := range rs.Chains {
				ed.Replace(nil, &nft.Fragment{Chains: []*nft.Chain{c}})
			}
			ed.Replace(nil, &nft.Fragment{Elements: setElements(rs, "services")})
			ed.Replace(nil, &nft.Fragment{Elements: setElements(rs, nfttest.EndpointsMapName(nft.ProtoUDP))})
			ed.Replace(nil, epsFrag(webEps))
			if tx := ed.Transaction(); !tx.Empty() {
				t.Fatalf("restart: %s", nfttest.OpCounts(tx))
			}
			ed.Commit()
			moved := nfttest.Backends(f, 9, 2, 9090)
			ed.Replace(epsFrag(webEps), epsFrag(moved))
			tx := ed.Transaction()
			for _, op := range tx.Ops {
				if op.Kind != nft.OpAddElements && op.Kind != nft.OpDeleteElements || op.Set.Name != nfttest.EndpointsMapName(nft.ProtoTCP) {
					t.Errorf("endpoint change: %s %s", op.Kind, op.Target())
				}
			}
			if err := fk.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
			ed.Commit()
			res := trace.New(fk.Rulesets()).Trace(trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 80})
			if !slices.Equal(res.DNAT, moved) {
				t.Errorf("after the change: DNAT %v, want %v", res.DNAT, moved)
			}
			if got, want := fk.Dump(f), ed.Ruleset().Dump(); got != want {
				t.Errorf("nftfake.Fake and Editor differ:\n%s\n%s", got, want)
			}
		})
	}
}

func setElements(rs *nft.Ruleset, set string) []nft.SetElement {
	var out []nft.SetElement
	for e := range rs.Sets[set].Elements.All() {
		out = append(out, nft.SetElement{Set: set, Element: e})
	}
	return out
}

// TestTraceDNATPick: the tracer follows a Service through the pick chain
// of its number of endpoints to the elements of its address and port; a
// number without an element falls through to the next rule.
func TestTraceDNATPick(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			fk := nftfake.New()
			rs := nfttest.SlotTable(f)
			web := nfttest.Addr(f, "10.96.0.10", "fd00:96::a")
			dns := nfttest.Addr(f, "10.96.0.11", "fd00:96::b")
			webEps, dnsEps := nfttest.Backends(f, 1, 3, 8080), nfttest.Backends(f, 2, 3, 53)
			rs.AddSet(nft.NewPickMap(f, "pick-tcp-3", nft.ProtoTCP, 3))
			rs.AddSet(nft.NewPickMap(f, "pick-udp-3", nft.ProtoUDP, 3))
			rs.AddChain(&nft.Chain{Name: "pick", Rules: []nft.Rule{
				{Phrases: []nft.Phrase{nft.DNATPick{Proto: nft.ProtoTCP, Map: "pick-tcp-3", Mod: 3}}},
				{Phrases: []nft.Phrase{nft.DNATPick{Proto: nft.ProtoUDP, Map: "pick-udp-3", Mod: 3}}},
				{Phrases: []nft.Phrase{nft.Drop()}, Comment: "no element"},
			}})
			for _, s := range []struct {
				vip   netip.Addr
				proto uint8
				port  uint16
				eps   []netip.AddrPort
			}{{web, nft.ProtoTCP, 80, webEps}, {dns, nft.ProtoUDP, 53, dnsEps}} {
				rs.AddElement("services", nft.Element{Key: []nft.Datum{nft.Addr(s.vip), nft.Int(uint32(s.proto)), nft.Int(uint32(s.port))},
					Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: "pick"}})
				for _, e := range nft.PickElements(s.vip, s.port, s.eps) {
					rs.AddElement("pick-"+nft.ProtoName(s.proto)+"-3", e)
				}
			}
			// dns's number 1 has no element: its draws of 1 fall through.
			rs.Sets["pick-udp-3"].Elements.Delete([]nft.Datum{nft.Addr(dns), nft.Int(53), nft.Int(1)})
			if err := fk.Apply(context.Background(), nft.Diff(nil, rs)); err != nil {
				t.Fatal(err)
			}
			client := nfttest.Addr(f, "10.0.0.1", "fd00::1")
			for _, tc := range []struct {
				pkt   trace.Packet
				pick  int
				want  []netip.AddrPort
				to    netip.AddrPort
				share float64
			}{
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 80}, 0, webEps, webEps[0], 1.0 / 3},
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 80}, 2, webEps, webEps[2], 1.0 / 3},
				{trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 80}, 7, webEps, webEps[2], 1.0 / 3},
				{trace.Packet{Src: client, Dst: dns, Proto: nft.ProtoUDP, DPort: 53}, 1, []netip.AddrPort{dnsEps[0], dnsEps[2]}, dnsEps[2], 1.0 / 3},
			} {
				tr := trace.New(fk.Rulesets())
				tr.Pick = tc.pick
				res := tr.Trace(tc.pkt)
				if !slices.Equal(res.DNAT, tc.want) || res.To != tc.to || res.Share != tc.share || res.Verdict != nft.VerdictAccept {
					t.Errorf("%v pick %d: %s, DNAT %v to %v share %v, want %v to %v share %v\n%v",
						tc.pkt, tc.pick, res.Verdict, res.DNAT, res.To, res.Share, tc.want, tc.to, tc.share, res.Path)
				}
			}
			// Another port of web's address has no element at all.
			res := trace.New(fk.Rulesets()).Trace(trace.Packet{Src: client, Dst: web, Proto: nft.ProtoTCP, DPort: 81})
			if len(res.DNAT) != 0 {
				t.Errorf("port 81: DNAT %v, want none", res.DNAT)
			}
		})
	}
}
