package proxier

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// TestNodePortAddressesPerFamily: what --nodeport-addresses (its keywords
// expanded by cmd/nftproxy) opens in each family's rules. A family the
// list names nothing of answers on every address, as upstream's;
// loopback CIDRs never reach the kernel's NodePort rules.
func TestNodePortAddressesPerFamily(t *testing.T) {
	node := model.Node{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("10.10.0.11"), netip.MustParseAddr("fd00:10::11")}}
	p := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	a := func(s string) []netip.Addr { return []netip.Addr{netip.MustParseAddr(s)} }
	for _, tc := range []struct {
		name    string
		primary bool
		cidrs   []netip.Prefix
		node    model.Node
		v4, v6  ruleset.NodePortAddresses
	}{
		{name: "primary (the default)", primary: true, node: node,
			v4: ruleset.NodePortAddresses{Addresses: a("10.10.0.11")}, v6: ruleset.NodePortAddresses{Addresses: a("fd00:10::11")}},
		{name: "nothing given counts as primary", node: node,
			v4: ruleset.NodePortAddresses{Addresses: a("10.10.0.11")}, v6: ruleset.NodePortAddresses{Addresses: a("fd00:10::11")}},
		{name: "primary before the Node is seen", primary: true},
		{name: "primary with a CIDR of one family", primary: true, cidrs: p("10.20.0.0/16"), node: node,
			v4: ruleset.NodePortAddresses{Addresses: a("10.10.0.11"), CIDRs: p("10.20.0.0/16")},
			v6: ruleset.NodePortAddresses{Addresses: a("fd00:10::11")}},
		{name: "a CIDR of one family: the other answers everywhere", cidrs: p("10.20.0.0/16"), node: node,
			v4: ruleset.NodePortAddresses{CIDRs: p("10.20.0.0/16")}, v6: ruleset.NodePortAddresses{CIDRs: p("::/0")}},
		{name: "all", cidrs: p("0.0.0.0/0", "::/0"), node: node,
			v4: ruleset.NodePortAddresses{CIDRs: p("0.0.0.0/0")}, v6: ruleset.NodePortAddresses{CIDRs: p("::/0")}},
		{name: "localhost alone: no NodePort in the kernel's rules", cidrs: p("127.0.0.0/8", "::1/128"), node: node},
		{name: "127.0.0.1/32 alone: IPv6 answers everywhere", cidrs: p("127.0.0.1/32"), node: node,
			v6: ruleset.NodePortAddresses{CIDRs: p("::/0")}},
		{name: "primary and localhost", primary: true, cidrs: p("127.0.0.0/8", "::1/128"), node: node,
			v4: ruleset.NodePortAddresses{Addresses: a("10.10.0.11")}, v6: ruleset.NodePortAddresses{Addresses: a("fd00:10::11")}},
		{name: "all and localhost", cidrs: p("127.0.0.0/8", "::1/128", "0.0.0.0/0", "::/0"), node: node,
			v4: ruleset.NodePortAddresses{CIDRs: p("0.0.0.0/0")}, v6: ruleset.NodePortAddresses{CIDRs: p("::/0")}},
		{name: "a CIDR around loopback stays", cidrs: p("96.0.0.0/3"), node: node,
			v4: ruleset.NodePortAddresses{CIDRs: p("96.0.0.0/3")}, v6: ruleset.NodePortAddresses{CIDRs: p("::/0")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{NodeName: "n1", NodePortPrimary: tc.primary, NodePortCIDRs: tc.cidrs}
			for f, want := range map[nft.Family]ruleset.NodePortAddresses{nft.IPv4: tc.v4, nft.IPv6: tc.v6} {
				if got := nodePortAddresses(c, f, tc.node); !reflect.DeepEqual(got, want) {
					t.Errorf("%s: got %+v, want %+v", f, got, want)
				}
			}
		})
	}
}
