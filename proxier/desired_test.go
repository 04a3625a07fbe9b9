package proxier

import (
	"context"
	"net/netip"
	"strings"
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
			p, err := New(cfg, Deps{NFT: map[nft.Family]nft.Backend{nft.IPv4: fakes[nft.IPv4], nft.IPv6: fakes[nft.IPv6]}})
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

// TestDesiredOnAKeptTable: a proxier that ran a while hands slots out in
// another order than Desired (it reuses those of deleted Services) and
// keeps an endpoints map it no longer needs; DesiredOn its table read
// back compares equal to that table (nft.CompareLoaded), where Desired
// does not, and still names a chain and an element the kernel lost.
func TestDesiredOnAKeptTable(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour,
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	fk := nftfake.New()
	p, err := New(cfg, Deps{NFT: map[nft.Family]nft.Backend{nft.IPv4: fk}})
	if err != nil {
		t.Fatal(err)
	}
	// 250 Services need several endpoints maps; when they are deleted
	// and 5 more added, those take the first map's slots (in the order
	// the proxier meets them) and the other maps stay, empty.
	svcs, slices := testServices(255, 0)
	setAll(p, svcs[:250], slices[:250])
	syncOK(t, p)
	for _, svc := range svcs[:250] {
		p.trackers.Services.Delete(svc.Name)
	}
	syncOK(t, p) // releases their slots
	setAll(p, svcs[250:], slices[250:])
	syncOK(t, p)
	snap := watch.Snapshot{Services: map[model.ServiceName]*model.Service{}, Slices: map[model.SliceKey]*model.EndpointSlice{}}
	for i, svc := range svcs {
		if i >= 250 {
			snap.Services[svc.Name] = svc
			snap.Slices[model.SliceKey{Namespace: svc.Name.Namespace, Name: slices[i].Name}] = slices[i]
		}
	}
	loaded, err := fk.Load(context.Background(), nft.IPv4)
	if err != nil || loaded == nil {
		t.Fatalf("load: %v", err)
	}
	if _, kept := loaded.Sets[ruleset.EndpointsMapName(nft.ProtoTCP, 1)]; !kept {
		t.Fatalf("the proxier no longer keeps an endpoints map it no longer needs: the test needs another history")
	}
	if d := nft.CompareLoaded(loaded, Desired(cfg, nft.IPv4, snap)); d.Empty() {
		t.Errorf("Desired, slots handed out afresh, equals the kept table: the test shows nothing")
	}
	if d := nft.CompareLoaded(loaded, DesiredOn(cfg, nft.IPv4, snap, loaded)); !d.Empty() {
		t.Errorf("DesiredOn the kept table differs from it:\n%s", d.Text())
	}
	// A changed Service chain and a lost ClusterIP are still named.
	var chain string
	for name := range loaded.Chains {
		if strings.Contains(name, "ns/svc-251/") {
			chain = name
		}
	}
	loaded.Chains[chain].Loaded.Count++
	loaded.Sets["cluster-ips"].Elements.Delete([]nft.Datum{nft.Addr(svcs[251].ClusterIPs[0])})
	d := nft.CompareLoaded(loaded, DesiredOn(cfg, nft.IPv4, snap, loaded))
	if len(d.Chains) != 1 || d.Chains[0].Name != chain || d.Chains[0].Kind != nft.DriftContent ||
		len(d.Sets) != 1 || len(d.Sets[0].Missing) != 1 || d.Sets[0].Missing[0] != svcs[251].ClusterIPs[0].String() {
		t.Errorf("tampered table (a rule more in chain %s, ClusterIP %s gone):\n%s", chain, svcs[251].ClusterIPs[0], d.Text())
	}
}

func syncOK(t *testing.T, p *Proxier) {
	t.Helper()
	if err := p.sync(context.Background()); err != nil {
		t.Fatal(err)
	}
}
