package nft

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestEndpointsElements: the ranges of a slot's endpoints cover every
// bucket of the slot once, in order, and differ in size by at most one.
func TestEndpointsElements(t *testing.T) {
	const slot = 7
	base := uint32(slot * EndpointBuckets)
	for _, n := range []int{1, 2, 3, 5, 7, 10, 100, 1000, 65535, 65536, 70000} {
		eps := make([]netip.AddrPort, n)
		for j := range eps {
			eps[j] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128, byte(j >> 8), byte(j)}), uint16(j))
		}
		els := EndpointsElements(slot, eps)
		if want := min(n, EndpointBuckets); len(els) != want {
			t.Fatalf("%d endpoints: %d elements, want %d", n, len(els), want)
		}
		next, smallest, largest := base, uint32(EndpointBuckets), uint32(0)
		for j, e := range els {
			lo := e.Key[0].Int
			if lo != next || e.End < lo || len(e.Key) != 1 {
				t.Fatalf("%d endpoints: element %d is %v-%d, want it to start at %d", n, j, e.Key, e.End, next)
			}
			if to := netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int)); to != eps[j] {
				t.Fatalf("%d endpoints: element %d goes to %v, want %v", n, j, to, eps[j])
			}
			size := e.End - lo + 1
			smallest, largest = min(smallest, size), max(largest, size)
			next = e.End + 1
		}
		if next != base+EndpointBuckets || largest-smallest > 1 {
			t.Errorf("%d endpoints: ranges end at %d, sizes %d to %d", n, next, smallest, largest)
		}
	}
	if els := EndpointsElements(slot, nil); len(els) != 0 {
		t.Errorf("no endpoints: %d elements", len(els))
	}
}

func epMap(proto uint8) string { return "endpoints-" + ProtoName(proto) }

// slotTable is a small table of the slot shape: the Services' vmap in
// prerouting, and one endpoints map per protocol.
func slotTable(f Family) *Ruleset {
	rs := NewRuleset(f)
	rs.AddSet(&Set{Name: "services", Key: []DataType{f.AddrType(), TypeInetProto, TypeInetService}, Data: []DataType{TypeVerdict}})
	rs.AddChain(&Chain{Name: "nat-prerouting", Base: &BaseChain{ChainNAT, HookPrerouting, PriorityDstNAT},
		Rules: []Rule{{Phrases: []Phrase{VmapLookup{Fields: []Field{FieldDstAddr, FieldL4Proto, FieldDstPort}, Map: "services"}}}}})
	for _, proto := range []uint8{ProtoTCP, ProtoUDP} {
		rs.AddSet(NewEndpointsMap(f, epMap(proto), proto))
	}
	return rs
}

// addSlotService adds a Service port's chain (one DNATMap rule on its
// slot), its vmap element and its endpoints' ranges.
func addSlotService(rs *Ruleset, name string, proto uint8, svc netip.Addr, port uint16, slot uint16, eps []netip.AddrPort) {
	rs.AddChain(&Chain{Name: name, Rules: []Rule{{Phrases: []Phrase{DNATMap{Proto: proto, Map: epMap(proto), Slot: slot}}}}})
	rs.AddElement("services", Element{Key: []Datum{Addr(svc), Int(uint32(proto)), Int(uint32(port))},
		Verdict: &Verdict{Kind: VerdictGoto, Chain: name}})
	for _, e := range EndpointsElements(slot, eps) {
		rs.AddElement(epMap(proto), e)
	}
}

// TestTraceDNATMap: the tracer follows a Service to its slot and reports
// every endpoint as a possible DNAT target; Pick chooses the one the
// packet goes to. An endpoint change is element work only.
func TestTraceDNATMap(t *testing.T) {
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ctx := context.Background()
			fk := NewFake()
			rs := slotTable(f)
			web := addr(f, "10.96.0.10", "fd00:96::a")
			dns := addr(f, "10.96.0.11", "fd00:96::b")
			webEps, dnsEps := backends(f, 1, 3, 8080), backends(f, 2, 2, 53)
			// Adjacent slots: web's last range ends where dns's first starts.
			addSlotService(rs, "web", ProtoTCP, web, 80, 2, webEps)
			addSlotService(rs, "web-udp", ProtoUDP, web, 80, 2, nil)
			addSlotService(rs, "dns", ProtoUDP, dns, 53, 3, dnsEps)
			if err := fk.Apply(ctx, Diff(nil, rs)); err != nil {
				t.Fatal(err)
			}
			client := addr(f, "10.0.0.1", "fd00::1")
			for _, tc := range []struct {
				pkt  Packet
				pick int
				want []netip.AddrPort
				to   netip.AddrPort
			}{
				{Packet{Src: client, Dst: web, Proto: ProtoTCP, DPort: 80}, 0, webEps, webEps[0]},
				{Packet{Src: client, Dst: web, Proto: ProtoTCP, DPort: 80}, 2, webEps, webEps[2]},
				{Packet{Src: client, Dst: web, Proto: ProtoTCP, DPort: 80}, 9, webEps, webEps[2]},
				{Packet{Src: client, Dst: dns, Proto: ProtoUDP, DPort: 53}, 1, dnsEps, dnsEps[1]},
				{Packet{Src: client, Dst: web, Proto: ProtoUDP, DPort: 80}, 0, nil, netip.AddrPort{}},
				{Packet{Src: client, Dst: web, Proto: ProtoTCP, DPort: 81}, 0, nil, netip.AddrPort{}},
				{Packet{Src: client, Dst: dns, Proto: ProtoTCP, DPort: 53}, 0, nil, netip.AddrPort{}},
			} {
				tr := NewTracer(fk)
				tr.Pick = tc.pick
				res := tr.Trace(tc.pkt)
				if !slices.Equal(res.DNAT, tc.want) || res.Verdict != VerdictAccept {
					t.Errorf("%v pick %d: %s, DNAT %v, want %v\n%v", tc.pkt, tc.pick, res.Verdict, res.DNAT, tc.want, res.Log)
				}
			}

			// Move web to 2 other pods: the transaction changes elements only.
			ed := NewEditorFrom(f, mustLoad(t, fk, f))
			epsFrag := func(eps []netip.AddrPort) *Fragment {
				var fr Fragment
				for _, e := range EndpointsElements(2, eps) {
					fr.Elements = append(fr.Elements, SetElement{Set: epMap(ProtoTCP), Element: e})
				}
				return &fr
			}
			for _, s := range rs.Sets {
				ed.AddSet(s)
			}
			for _, c := range rs.Chains {
				ed.Replace(nil, &Fragment{Chains: []*Chain{c}})
			}
			ed.Replace(nil, &Fragment{Elements: setElements(rs, "services")})
			ed.Replace(nil, &Fragment{Elements: setElements(rs, epMap(ProtoUDP))})
			ed.Replace(nil, epsFrag(webEps))
			if tx := ed.Transaction(); !tx.Empty() {
				t.Fatalf("restart: %s", opCounts(tx))
			}
			ed.Commit()
			moved := backends(f, 9, 2, 9090)
			ed.Replace(epsFrag(webEps), epsFrag(moved))
			tx := ed.Transaction()
			for _, op := range tx.Ops {
				if op.Kind != OpAddElements && op.Kind != OpDeleteElements || op.Set.Name != epMap(ProtoTCP) {
					t.Errorf("endpoint change: %s %s", op.Kind, op.target())
				}
			}
			if err := fk.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
			ed.Commit()
			res := NewTracer(fk).Trace(Packet{Src: client, Dst: web, Proto: ProtoTCP, DPort: 80})
			if !slices.Equal(res.DNAT, moved) {
				t.Errorf("after the change: DNAT %v, want %v", res.DNAT, moved)
			}
			if got, want := fk.Dump(f), ed.Ruleset().Dump(); got != want {
				t.Errorf("Fake and Editor differ:\n%s\n%s", got, want)
			}
		})
	}
}

func mustLoad(t *testing.T, fk *Fake, f Family) *Ruleset {
	t.Helper()
	rs, err := fk.Load(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func setElements(rs *Ruleset, set string) []SetElement {
	var out []SetElement
	for e := range rs.Sets[set].Elements.All() {
		out = append(out, SetElement{Set: set, Element: e})
	}
	return out
}

// TestFakeEndpointsChecks: the Fake refuses what the kernel refuses for
// endpoints maps and the phrases that use them, with the kernel's errors.
func TestFakeEndpointsChecks(t *testing.T) {
	f := IPv4
	svc := netip.MustParseAddr("10.96.0.10")
	eps := backends(f, 1, 2, 8080)
	m := epMap(ProtoTCP)
	const slot = 2
	base := func() *Ruleset {
		rs := slotTable(f)
		addSlotService(rs, "web", ProtoTCP, svc, 80, slot, eps)
		return rs
	}
	el := func(lo, hi uint32) Element {
		return Element{Key: []Datum{Int(slot*EndpointBuckets + lo)}, End: slot*EndpointBuckets + hi, Data: []Datum{Addr(eps[0].Addr()), Int(1)}}
	}
	elems := func(kind OpKind, es ...Element) Op {
		return Op{Kind: kind, Set: base().Sets[m], Elements: es}
	}
	for _, tc := range []struct {
		name string
		op   Op
		want unix.Errno // 0: accepted
	}{
		{"the same element again", elems(OpAddElements, EndpointsElements(slot, eps)[1]), 0},
		{"another slot", elems(OpAddElements, EndpointsElements(slot+1, eps[:1])...), 0},
		{"overlapping the start", elems(OpAddElements, el(0, 7)), unix.EEXIST},
		{"overlapping the end", elems(OpAddElements, el(65535, 65535)), unix.EEXIST},
		{"covering a range", elems(OpAddElements, el(0, 65535)), unix.EEXIST},
		{"same start, other end", elems(OpAddElements, el(32768, 40000)), unix.EEXIST},
		{"end before start", elems(OpAddElements, el(9, 8)), unix.EINVAL},
		{"across slots", elems(OpAddElements, el(9+EndpointBuckets, 2*EndpointBuckets)), unix.EINVAL},
		{"last slot", elems(OpAddElements, Element{Key: []Datum{Int(EndpointsSlots * EndpointBuckets)}, End: 1<<32 - 1,
			Data: []Datum{Addr(eps[0].Addr()), Int(1)}}), unix.EINVAL},
		{"delete with another end", elems(OpDeleteElements, el(0, 32766)), unix.ENOENT},
		{"delete", elems(OpDeleteElements, EndpointsElements(slot, eps)...), 0},
		{"range end in a plain set", Op{Kind: OpAddElements, Set: &Set{Name: "services"},
			Elements: []Element{{Key: []Datum{Addr(svc), Int(6), Int(9)}, End: 3, Verdict: &Verdict{Kind: VerdictDrop}}}}, unix.EINVAL},
		{"delete a map in use", Op{Kind: OpDeleteSet, Set: &Set{Name: m}}, unix.EBUSY},
		{"DNATMap on a missing map", Op{Kind: OpAddRule, ChainName: "web",
			Rule: Rule{Phrases: []Phrase{DNATMap{Proto: ProtoTCP, Map: "nope"}}}}, unix.ENOENT},
		{"DNATMap on another protocol's map", Op{Kind: OpAddRule, ChainName: "web",
			Rule: Rule{Phrases: []Phrase{DNATMap{Proto: ProtoUDP, Map: m}}}}, unix.EINVAL},
		{"DNATMap on a verdict map", Op{Kind: OpAddRule, ChainName: "web",
			Rule: Rule{Phrases: []Phrase{DNATMap{Proto: ProtoTCP, Map: "services"}}}}, unix.EINVAL},
		{"DNATMap on the last slot", Op{Kind: OpAddRule, ChainName: "web",
			Rule: Rule{Phrases: []Phrase{DNATMap{Proto: ProtoTCP, Map: m, Slot: EndpointsSlots}}}}, unix.ERANGE},
		{"endpoints map of ICMP", Op{Kind: OpAddSet, Set: NewEndpointsMap(f, "e", 1)}, unix.EINVAL},
		{"endpoints map of the other family", Op{Kind: OpAddSet, Set: NewEndpointsMap(IPv6, "e", ProtoTCP)}, unix.EINVAL},
		{"endpoints map with a timeout", Op{Kind: OpAddSet, Set: func() *Set {
			s := NewEndpointsMap(f, "e", ProtoTCP)
			s.Dynamic = true
			return s
		}()}, unix.EINVAL},
	} {
		fk := NewFake()
		if err := fk.Apply(context.Background(), Diff(nil, base())); err != nil {
			t.Fatal(err)
		}
		err := fk.Apply(context.Background(), &Transaction{Family: f, Ops: []Op{tc.op}})
		switch {
		case tc.want == 0 && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != 0 && !errors.Is(err, tc.want):
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestEndpointsMapEncodingErrors: the encoder refuses what it cannot write
// as nft would.
func TestEndpointsMapEncodingErrors(t *testing.T) {
	f := IPv4
	bad := NewEndpointsMap(f, "e", ProtoTCP)
	bad.Key = []DataType{TypeMark}
	m := NewEndpointsMap(f, "m", ProtoTCP)
	svc := netip.MustParseAddr("10.96.0.10")
	for name, op := range map[string]Op{
		"wrong key":    {Kind: OpAddSet, Set: bad},
		"ICMP":         {Kind: OpAddSet, Set: NewEndpointsMap(f, "e", 1)},
		"end < start":  {Kind: OpAddElements, Set: m, Elements: []Element{{Key: []Datum{Int(5)}, End: 4, Data: []Datum{Addr(svc), Int(1)}}}},
		"DNATMap ICMP": {Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{DNATMap{Proto: 1, Map: "m"}}}},
		"last slot":    {Kind: OpAddRule, ChainName: "c", Rule: Rule{Phrases: []Phrase{DNATMap{Proto: ProtoTCP, Map: "m", Slot: EndpointsSlots}}}},
	} {
		if _, err := encodeTransaction(&Transaction{Family: f, Ops: []Op{op}}, batchOptions{}); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestNetlinkEndpointsChanges: endpoint changes of adjacent slots, applied
// by the kernel as element work only. After each, `nft list` prints what
// Dump prints and Load reads the same ranges back.
func TestNetlinkEndpointsChanges(t *testing.T) {
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newTestNS(t)
			n := ns.netlink(t)
			web := addr(f, "10.96.0.10", "fd00:96::a")
			dns := addr(f, "10.96.0.11", "fd00:96::b")
			build := func(webEps, dnsEps []netip.AddrPort) *Ruleset {
				rs := slotTable(f)
				addSlotService(rs, "web", ProtoTCP, web, 80, 2, webEps)
				addSlotService(rs, "web-next", ProtoTCP, web, 81, 3, dnsEps)
				addSlotService(rs, "dns", ProtoUDP, dns, 53, 2, dnsEps)
				return rs
			}
			have := build(backends(f, 1, 3, 8080), backends(f, 2, 2, 53))
			apply(t, n, Diff(nil, have))
			for i, step := range []struct{ web, dns []netip.AddrPort }{
				{backends(f, 1, 2, 8080), backends(f, 2, 2, 53)},  // 3 → 2, same first start
				{backends(f, 3, 5, 8080), backends(f, 4, 1, 53)},  // 2 → 5, 2 → 1 next door
				{backends(f, 3, 5, 9090), backends(f, 4, 1, 53)},  // same ranges, new ports
				{nil, backends(f, 4, 7, 53)},                      // web's slot emptied
				{backends(f, 5, 1, 8080), nil},                    // and filled again; next door empty
				{backends(f, 6, 100, 8080), backends(f, 7, 3, 1)}, // many
			} {
				want := build(step.web, step.dns)
				tx := Diff(have, want)
				for _, op := range tx.Ops {
					if op.Kind != OpAddElements && op.Kind != OpDeleteElements {
						t.Errorf("step %d: %s %s", i, op.Kind, op.target())
					}
				}
				apply(t, n, tx)
				if got, wantDump := Canonical(ns.list(t, f)), want.Dump(); got != wantDump {
					t.Fatalf("step %d: nft list differs from Dump: %s", i, firstDiff(got, wantDump))
				}
				if loaded := load(t, ns, f); Diff(loaded, want).Changes() != 0 {
					t.Fatalf("step %d: Load differs by %d objects", i, Diff(loaded, want).Changes())
				}
				have = want
			}
		})
	}
}
