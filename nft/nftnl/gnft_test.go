package nftnl

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// TestGoogleNftablesAgrees reads tables our Netlink wrote back with
// github.com/google/nftables, an independent decoder, and checks that our
// own reader (Load) sees the same chains, rule counts, sets and elements.
// What google/nftables v0.3.0 cannot decode is named where it is skipped.
func TestGoogleNftablesAgrees(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		endpoints := nfttest.SlotTable(f)
		for i := range 20 {
			svc := nfttest.Addr(f, fmt.Sprintf("10.96.1.%d", i+1), fmt.Sprintf("fd00:96::1:%x", i+1))
			nfttest.AddSlotService(endpoints, fmt.Sprintf("svc-%d", i), nft.ProtoTCP, svc, 80, uint16(i), nfttest.Backends(f, i, 1+i%5, 8080))
		}
		for name, rs := range map[string]*nft.Ruleset{
			"realistic":    nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 30, 3)),
			"every phrase": nfttest.EveryPhraseRuleset(f),
			"endpoints":    endpoints,
		} {
			t.Run(f.String()+"/"+name, func(t *testing.T) { crossCheck(t, rs) })
		}
	}
}

func crossCheck(t *testing.T, want *nft.Ruleset) {
	ns := newTestNS(t)
	n := ns.netlink(t)
	apply(t, n, nft.Diff(nil, want))
	got, err := n.Load(context.Background(), want.Family)
	if err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(ns.Fd))
	if err != nil {
		t.Fatal(err)
	}
	table := &nftables.Table{Name: nft.TableName, Family: nftables.TableFamily(want.Family)}
	checkChains(t, c, table, want, got)
	sets, err := c.GetSets(table)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sets {
		names = append(names, s.Name)
		if ours, ok := got.Sets[s.Name]; ok {
			checkSet(t, c, want.Family, s, ours)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(names)), got.SortedSetNames()) {
		t.Errorf("sets: google/nftables %v, Load %v", slices.Sorted(slices.Values(names)), got.SortedSetNames())
	}
}

// checkChains compares the chains, their hooks and their rule counts.
// google/nftables decodes every rule of ours into expressions (GetRules
// fails on one it cannot); only their number is compared.
func checkChains(t *testing.T, c *nftables.Conn, table *nftables.Table, want, got *nft.Ruleset) {
	chains, err := c.ListChainsOfTableFamily(table.Family)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ch := range chains {
		if ch.Table.Name != table.Name {
			continue
		}
		names = append(names, ch.Name)
		ours, ok := got.Chains[ch.Name]
		if !ok || ours.Loaded == nil {
			t.Errorf("chain %q: google/nftables lists it, Load does not", ch.Name)
			continue
		}
		rules, err := c.GetRules(table, ch)
		if err != nil {
			t.Errorf("chain %q: google/nftables GetRules: %v", ch.Name, err)
		} else if len(rules) != ours.Loaded.Count || len(rules) != len(want.Chains[ch.Name].Rules) {
			t.Errorf("chain %q: google/nftables %d rules, Load %d, written %d", ch.Name, len(rules), ours.Loaded.Count, len(want.Chains[ch.Name].Rules))
		}
		if theirs, ours := gnftBase(ch), fmt.Sprint(ours.Base); theirs != ours {
			t.Errorf("chain %q: google/nftables base %s, Load %s", ch.Name, theirs, ours)
		}
	}
	if slices.Sort(names); !slices.Equal(names, slices.Sorted(maps.Keys(got.Chains))) {
		t.Errorf("chains: google/nftables %v, Load %v", names, slices.Sorted(maps.Keys(got.Chains)))
	}
}

var gnftHooks = map[nftables.ChainHook]nft.Hook{
	unix.NF_INET_PRE_ROUTING: nft.HookPrerouting, unix.NF_INET_LOCAL_IN: nft.HookInput, unix.NF_INET_FORWARD: nft.HookForward,
	unix.NF_INET_LOCAL_OUT: nft.HookOutput, unix.NF_INET_POST_ROUTING: nft.HookPostrouting,
}

// gnftBase prints a chain's base as fmt prints our *nft.BaseChain.
func gnftBase(ch *nftables.Chain) string {
	if ch.Hooknum == nil {
		return fmt.Sprint((*nft.BaseChain)(nil))
	}
	return fmt.Sprint(&nft.BaseChain{Type: nft.ChainType(ch.Type), Hook: gnftHooks[*ch.Hooknum], Priority: int32(*ch.Priority)})
}

// checkSet compares a set's types, flags and elements. google/nftables
// v0.3.0 stores a verdict map's data type in KeyType (set.go, "Special
// case for the data type verdict"), so a verdict map's key type is not
// compared; it does not decode a set's comment, nor (verdictText) the
// verdicts of a verdict map's elements.
func checkSet(t *testing.T, c *nftables.Conn, f nft.Family, s *nftables.Set, ours *nft.Set) {
	t.Helper()
	type flags struct {
		Map, Interval, Concat, Timeout, Dynamic bool
		Size                                    uint32
	}
	theirs := flags{s.IsMap, s.Interval, s.Concatenation, s.HasTimeout, s.Dynamic, s.Size}
	// The kernel's concatenation flag marks interval concatenations only
	// (nft sets it for those); key types tell the others.
	want := flags{ours.IsMap(), ours.EndpointsProto != 0, len(ours.Key) > 1 && ours.EndpointsProto != 0, ours.Timeout > 0, ours.Dynamic, ours.Size}
	if theirs != want {
		t.Errorf("set %q: google/nftables %+v, Load %+v", s.Name, theirs, want)
	}
	if s.HasTimeout && s.Timeout != ours.Timeout {
		t.Errorf("set %q: timeout %v, Load %v", s.Name, s.Timeout, ours.Timeout)
	}
	if !ours.IsVerdictMap() && s.KeyType.GetNFTMagic() != setKeyMagic(ours) {
		t.Errorf("set %q: key type %d, Load %d", s.Name, s.KeyType.GetNFTMagic(), setKeyMagic(ours))
	}
	if ours.IsMap() && !ours.IsVerdictMap() && s.DataType.GetNFTMagic() != typeMagic(ours.Data) {
		t.Errorf("set %q: data type %d, Load %d", s.Name, s.DataType.GetNFTMagic(), typeMagic(ours.Data))
	}
	elems, err := c.GetSetElements(s)
	if err != nil {
		t.Fatalf("set %q: google/nftables GetSetElements: %v", s.Name, err)
	}
	theirElems, theirEnds := gnftElements(elems, ours.IsVerdictMap())
	ourElems, ourEnds := wireElements(t, f, ours)
	if !maps.Equal(theirElems, ourElems) || !maps.Equal(theirEnds, ourEnds) {
		t.Errorf("set %q: elements differ\ngoogle/nftables %v ends %v\nLoad            %v ends %v", s.Name, theirElems, theirEnds, ourElems, ourEnds)
	}
}

// gnftElements maps each element's key (hex) to its value (hex data, or
// the verdict), and lists the keys of the elements that end ranges.
func gnftElements(es []nftables.SetElement, verdictMap bool) (map[string]string, map[string]bool) {
	elems, ends := map[string]string{}, map[string]bool{}
	for _, e := range es {
		if e.IntervalEnd {
			ends[hex.EncodeToString(e.Key)] = true
			continue
		}
		v := hex.EncodeToString(e.Val)
		if verdictMap {
			v = verdictText(e.Val)
		}
		elems[hex.EncodeToString(e.Key)] = v
	}
	return elems, ends
}

// verdictText decodes a verdict map element's value. google/nftables
// v0.3.0 leaves it undecoded in Val (the NFTA_DATA_VERDICT nest: code,
// then chain), so it is decoded here with the attribute decoder it uses.
func verdictText(b []byte) string {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return err.Error()
	}
	ad.ByteOrder = binary.BigEndian
	var kind, chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			kind = gnftVerdicts[expr.VerdictKind(int32(ad.Uint32()))]
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		}
	}
	if err := ad.Err(); err != nil {
		return err.Error()
	}
	return kind + " " + chain
}

var gnftVerdicts = map[expr.VerdictKind]string{
	expr.VerdictAccept: "accept", expr.VerdictDrop: "drop", expr.VerdictReturn: "return",
	expr.VerdictJump: "jump", expr.VerdictGoto: "goto",
}

// wireElements writes what Load read as the kernel holds it, by the
// layout nft documents (addresses and ports in network byte order, other
// integers in host order, big endian in an interval map's key; every
// field of a concatenation padded to 4 bytes). It is written here, apart
// from our encoder, so that a mistake shared by encoder and reader shows.
func wireElements(t *testing.T, f nft.Family, s *nft.Set) (map[string]string, map[string]bool) {
	elems, ends := map[string]string{}, map[string]bool{}
	for e := range s.Elements.All() {
		k := hex.EncodeToString(wireTuple(t, s.Key, e.Key, s.EndpointsProto != 0))
		v := hex.EncodeToString(wireTuple(t, s.Data, e.Data, false))
		if e.Verdict != nil {
			v = string(e.Verdict.Kind) + " " + e.Verdict.Chain
		}
		elems[k] = v
		if s.EndpointsProto != 0 {
			ends[hex.EncodeToString(binary.BigEndian.AppendUint32(nil, e.End+1))] = true
		}
	}
	return elems, ends
}

func wireTuple(t *testing.T, types []nft.DataType, ds []nft.Datum, bigEndian bool) []byte {
	var out []byte
	for i, d := range ds {
		var b []byte
		switch {
		case d.Addr.IsValid():
			b = d.Addr.AsSlice()
		case types[i] == nft.TypeInetService:
			b = binary.BigEndian.AppendUint16(nil, uint16(d.Int))
		case types[i] == nft.TypeInetProto:
			b = []byte{byte(d.Int)}
		case bigEndian:
			b = binary.BigEndian.AppendUint32(nil, d.Int)
		default:
			b = binary.NativeEndian.AppendUint32(nil, d.Int)
		}
		if len(b) != types[i].Len {
			t.Fatalf("field %d of %v: %d bytes for %s", i, ds, len(b), types[i].Name)
		}
		if len(types) > 1 {
			b = append(b, make([]byte, pad4(len(b))-len(b))...)
		}
		out = append(out, b...)
	}
	return out
}

// TestDataTypesMatchGoogleNftables: our set data types carry the numbers
// and lengths google/nftables defines for them.
func TestDataTypesMatchGoogleNftables(t *testing.T) {
	for _, p := range []struct {
		ours   nft.DataType
		theirs nftables.SetDatatype
	}{
		{nft.TypeVerdict, nftables.TypeVerdict}, {nft.TypeInteger, nftables.TypeInteger},
		{nft.TypeIPv4Addr, nftables.TypeIPAddr}, {nft.TypeIPv6Addr, nftables.TypeIP6Addr},
		{nft.TypeInetProto, nftables.TypeInetProto}, {nft.TypeInetService, nftables.TypeInetService},
		{nft.TypeMark, nftables.TypeMark},
	} {
		if p.ours.Name != p.theirs.Name || p.ours.Magic != p.theirs.GetNFTMagic() || p.ours.Len != int(p.theirs.Bytes) {
			t.Errorf("%+v, google/nftables %+v (magic %d)", p.ours, p.theirs, p.theirs.GetNFTMagic())
		}
	}
	if concatTypeBits != nftables.SetConcatTypeBits {
		t.Errorf("concatenation shift %d, google/nftables %d", concatTypeBits, nftables.SetConcatTypeBits)
	}
}
