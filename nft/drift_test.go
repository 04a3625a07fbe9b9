package nft_test

import (
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// driftTable is a small desired table: a set, a verdict map, a base chain
// and a Service chain.
func driftTable() *nft.Ruleset {
	rs := nft.NewRuleset(nft.IPv4)
	rs.AddSet(&nft.Set{Name: "ips", Key: []nft.DataType{nft.TypeIPv4Addr}, Comment: "IPs"})
	rs.AddSet(&nft.Set{Name: "dispatch", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService},
		Data: []nft.DataType{nft.TypeVerdict}})
	rs.AddElement("ips", nft.Element{Key: []nft.Datum{addr("10.96.0.1")}})
	rs.AddElement("ips", nft.Element{Key: []nft.Datum{addr("10.96.0.2")}})
	rs.AddElement("dispatch", dispatch("10.96.0.1", "svc-1"))
	rs.AddChain(&nft.Chain{Name: "nat-prerouting", Base: &nft.BaseChain{Type: nft.ChainNAT, Hook: nft.HookPrerouting, Priority: -100},
		Rules: []nft.Rule{{Phrases: []nft.Phrase{nft.VmapLookup{Map: "dispatch", Fields: []nft.Field{nft.FieldDstAddr, nft.FieldL4Proto, nft.FieldDstPort}}}}}})
	rs.AddChain(&nft.Chain{Name: "svc-1", Rules: []nft.Rule{
		{Phrases: []nft.Phrase{nft.DNAT{To: netip.MustParseAddrPort("10.244.0.1:8080")}}, Comment: "ep-a"}}})
	return rs
}

func addr(s string) nft.Datum { return nft.Addr(netip.MustParseAddr(s)) }

func dispatch(ip, chain string) nft.Element {
	return nft.Element{Key: []nft.Datum{addr(ip), nft.Int(uint32(nft.ProtoTCP)), nft.Int(80)},
		Verdict: &nft.Verdict{Kind: nft.VerdictGoto, Chain: chain}, Comment: chain}
}

// TestDriftText: each kind of drift of a table read back from the kernel
// is named, with its elements and desired rules in nft syntax, and the
// drift is empty exactly when Diff's transaction is.
func TestDriftText(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(k *nft.Ruleset)
		want   string
	}{
		{"same", func(*nft.Ruleset) {}, ""},
		{"element missing and extra", func(k *nft.Ruleset) {
			k.Sets["ips"].Elements.Delete([]nft.Datum{addr("10.96.0.2")})
			k.AddElement("ips", nft.Element{Key: []nft.Datum{addr("10.96.9.9")}})
		}, "table ip nftproxy: ips elements differ: 1 missing, 1 extra\n" +
			"\t- element 10.96.9.9\n\t+ element 10.96.0.2\n"},
		{"element value changed", func(k *nft.Ruleset) {
			k.AddElement("dispatch", dispatch("10.96.0.1", "svc-2"))
		}, "table ip nftproxy: dispatch elements differ: 1 changed\n" +
			"\t- element 10.96.0.1 . tcp . 80 comment \"svc-2\" : goto svc-2\n" +
			"\t+ element 10.96.0.1 . tcp . 80 comment \"svc-1\" : goto svc-1\n"},
		{"set missing", func(k *nft.Ruleset) { delete(k.Sets, "ips") },
			"table ip nftproxy: ips missing\n\t+ set ips { type ipv4_addr comment \"IPs\" }\n" +
				"\t+ element 10.96.0.1\n\t+ element 10.96.0.2\n"},
		{"set extra", func(k *nft.Ruleset) { k.AddSet(&nft.Set{Name: "old", Key: []nft.DataType{nft.TypeIPv4Addr}}) },
			"table ip nftproxy: old extra\n\t- set old { type ipv4_addr }\n"},
		{"set definition", func(k *nft.Ruleset) { k.Sets["ips"].Comment = "old" },
			"table ip nftproxy: ips definition differs\n\t- set ips { type ipv4_addr comment \"old\" }\n" +
				"\t+ set ips { type ipv4_addr comment \"IPs\" }\n"},
		{"rule added", func(k *nft.Ruleset) { k.Chains["svc-1"].Loaded.Count++ },
			"table ip nftproxy: chain svc-1 rules differ: the kernel has 2 rules, 1 rule desired; desired:\n" +
				"\t+ dnat to 10.244.0.1:8080 comment \"ep-a\"\n"},
		{"rule replaced", func(k *nft.Ruleset) { k.Chains["svc-1"].Loaded.Digest[0]++ },
			"table ip nftproxy: chain svc-1 rules differ: the kernel has 1 rule as desired, other ones (digest differs); desired:\n" +
				"\t+ dnat to 10.244.0.1:8080 comment \"ep-a\"\n"},
		{"no digest", func(k *nft.Ruleset) { k.Chains["svc-1"].Loaded.HasDigest = false },
			"table ip nftproxy: chain svc-1 rules differ: the kernel has 1 rule without nftproxy's digest (written by another program); desired:\n" +
				"\t+ dnat to 10.244.0.1:8080 comment \"ep-a\"\n"},
		{"chain missing", func(k *nft.Ruleset) { delete(k.Chains, "svc-1") },
			"table ip nftproxy: chain svc-1 missing\n\t+ dnat to 10.244.0.1:8080 comment \"ep-a\"\n"},
		{"chain extra", func(k *nft.Ruleset) {
			k.AddChain(&nft.Chain{Name: "svc-9", Loaded: &nft.LoadedRules{Count: 3}})
		}, "table ip nftproxy: chain svc-9 extra, with 3 rules\n"},
		{"base chain definition", func(k *nft.Ruleset) { k.Chains["nat-prerouting"].Base.Priority = 0 },
			"table ip nftproxy: chain nat-prerouting definition differs\n" +
				"\t- type nat hook prerouting priority filter\n\t+ type nat hook prerouting priority dstnat\n"},
		{"foreign chain", func(k *nft.Ruleset) { k.Chains["svc-1"].Loaded.Foreign = true },
			"table ip nftproxy: chain svc-1 definition differs (a policy or flags nftproxy never sets)\n" +
				"\t- regular chain\n\t+ regular chain\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			desired := driftTable()
			kernel := loadedForm(desired)
			for _, c := range kernel.Chains {
				if c.Base != nil {
					b := *c.Base
					c.Base = &b
				}
			}
			tc.tamper(kernel)
			d := nft.CompareLoaded(kernel, desired)
			if got := d.Text(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
			if txEmpty := nft.Diff(kernel, desired).Empty(); d.Empty() != txEmpty {
				t.Errorf("drift empty %v, Diff's transaction empty %v", d.Empty(), txEmpty)
			}
		})
	}
}

// TestDriftNoTable: without a table in the kernel everything is missing.
func TestDriftNoTable(t *testing.T) {
	d := nft.CompareLoaded(nil, driftTable())
	if !d.NoTable || len(d.Sets) != 2 || len(d.Chains) != 2 || d.Empty() {
		t.Fatalf("%+v", d)
	}
}
