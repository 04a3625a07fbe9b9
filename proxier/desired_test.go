package proxier

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// TestDesiredIsWhatAFreshProxierPrograms: for Services of every kind
// (testServices), a Node, ServiceCIDRs and each way of detecting local
// traffic and choosing NodePort addresses, Desired equals the table a
// proxier's first sync writes, in both families, up to the endpoints-map
// slots (assigned in another order).
func TestDesiredIsWhatAFreshProxierPrograms(t *testing.T) {
	node := model.Node{Name: "n1", Zone: "a", Addresses: []netip.Addr{netip.MustParseAddr("10.10.0.11"), netip.MustParseAddr("fd00:10::11")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}}
	base := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/48")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	apiCIDRs := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:96::/112")}
	for name, tc := range map[string]struct {
		cfg      func(*Config)
		node     model.Node
		apiCIDRs []netip.Prefix
	}{
		"cluster CIDR, node primary IPs, ServiceCIDR objects": {cfg: func(*Config) {}, node: node, apiCIDRs: apiCIDRs},
		"no Node object, --service-cidr":                      {cfg: func(*Config) {}},
		"node CIDR, masquerade all, bit 3": {node: node, cfg: func(c *Config) {
			c.LocalDetect, c.MasqueradeAll, c.MasqueradeBit = LocalDetect{Mode: DetectNodeCIDR}, true, 3
		}},
		"interface prefix, nodeport CIDRs": {node: node, cfg: func(c *Config) {
			c.LocalDetect = LocalDetect{Mode: DetectInterfaceNamePrefix, InterfaceNamePrefix: "veth"}
			c.NodePortCIDRs = []netip.Prefix{netip.MustParsePrefix("10.10.0.0/24")}
		}},
		"bridge": {node: node, cfg: func(c *Config) { c.LocalDetect = LocalDetect{Mode: DetectBridgeInterface, BridgeInterface: "cbr0"} }},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := base
			tc.cfg(&cfg)
			svcs, slices := testServices(40, 0)
			fakes := map[nft.Family]*nftfake.Fake{nft.IPv4: nftfake.New(), nft.IPv6: nftfake.New()}
			p, err := New(cfg, Deps{NFT: map[nft.Family]nft.Interface{nft.IPv4: fakes[nft.IPv4], nft.IPv6: fakes[nft.IPv6]}})
			if err != nil {
				t.Fatal(err)
			}
			snap := watch.Snapshot{Node: tc.node, ServiceCIDRs: tc.apiCIDRs,
				Services: map[model.ServiceName]*model.Service{}, Slices: map[model.SliceKey]*model.EndpointSlice{}}
			if tc.node.Name != "" {
				p.setNode(tc.node)
			}
			p.setAPIServiceCIDRs(tc.apiCIDRs)
			setAll(p, svcs, slices)
			for i, svc := range svcs {
				snap.Services[svc.Name] = svc
				snap.Slices[model.SliceKey{Namespace: svc.Name.Namespace, Name: slices[i].Name}] = slices[i]
			}
			if err := p.sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			canon := func(rs *nft.Ruleset) string { return ruleset.CanonicalSlots(rs).Dump() }
			for f, fk := range fakes {
				if got, want := canon(Desired(cfg, f, snap)), canon(fk.Ruleset(f)); got != want {
					t.Errorf("%s: Desired:\n%s\nthe proxier programmed:\n%s", f, got, want)
				}
			}
		})
	}
}
