package nodes

import "testing"

func TestLoadOrder(t *testing.T) {
	mods := map[string]*kernelModule{}
	for name, deps := range map[string][]string{
		"nf_tables":       {"nfnetlink", "libcrc32c"},
		"nfnetlink":       nil,
		"nft_ct":          {"nf_tables", "nf_conntrack"},
		"nf_conntrack":    {"nf_defrag_ipv4", "libcrc32c"},
		"nf_defrag_ipv4":  nil,
		"libcrc32c":       nil,
		"crc32c_generic":  nil,
		"veth":            {"builtin_thing"}, // built in: not among the modules
		"crc32c_intel":    nil,
		"nf_nat":          {"nf_conntrack", "libcrc32c"},
		"nft_chain_nat":   {"nf_nat", "nf_tables"},
		"ip6_udp_tunnel":  nil,
		"sctp":            {"ip6_udp_tunnel", "libcrc32c"},
		"xt_conntrack":    {"nf_conntrack", "x_tables"},
		"x_tables":        nil,
		"nf_defrag_ipv6":  nil,
		"nf_conntrack_ft": {"nf_conntrack"},
	} {
		mods[name] = &kernelModule{Name: name, Depends: deps}
	}
	order, err := loadOrder(mods)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range order {
		pos[m.Name] = i
	}
	if len(order) != len(mods) {
		t.Fatalf("%d modules in order, want %d", len(order), len(mods))
	}
	for i, name := range []string{"crc32c_generic", "crc32c_intel", "libcrc32c"} {
		if pos[name] != i {
			t.Errorf("%s loads at %d, want %d", name, pos[name], i)
		}
	}
	for name, m := range mods {
		for _, d := range m.Depends {
			if _, ok := mods[d]; ok && pos[d] > pos[name] {
				t.Errorf("%s loads before %s, which it depends on", name, d)
			}
		}
	}

	mods["nfnetlink"].Depends = []string{"nft_ct"}
	if _, err := loadOrder(mods); err == nil {
		t.Error("a cycle: no error")
	}
}

func TestModuleName(t *testing.T) {
	for file, want := range map[string]string{
		"kernel/arch/x86/crypto/crc32c-intel.ko":       "crc32c_intel",
		"kernel/net/netfilter/nf_tables.ko.xz":         "nf_tables",
		"kernel/net/netfilter/nft_ct.ko.zst":           "nft_ct",
		"kernel/net/netfilter/nf_conntrack_ftp.ko.gz":  "nf_conntrack_ftp",
		"kernel/net/netfilter/modules.order":           "",
		"kernel/net/netfilter/ipvs/ip_vs_rr.ko.xz.sig": "",
	} {
		if got := moduleName(file); got != want {
			t.Errorf("moduleName(%s) = %q, want %q", file, got, want)
		}
	}
}
