package proxier

import (
	"cmp"
	"maps"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// Desired returns the table of family f that a proxier with configuration
// cfg programs for the objects of s when it starts afresh (no table in the
// kernel): what `nftproxy dump` prints. It takes the sync's own steps, the
// configuration (rulesetConfig), the object store and each Service's
// ports (model.ServicePorts), and builds them with ruleset.Build. The
// endpoints-map slots are handed out in the order of the Services' names:
// a fresh proxier hands out the same ones in the order it meets the
// Services, a long-running one reuses those released by earlier changes,
// so only the slot numbers can differ from its table.
func Desired(cfg Config, f nft.Family, s watch.Snapshot) *nft.Ruleset {
	return DesiredOn(cfg, f, s, nil)
}

// DesiredOn is Desired on top of loaded, the family's table read back from
// the kernel (nft.Loader; nil for none), as a proxier that restarts
// programs it: the chains keep the endpoints-map slots they hold there
// (seedSlots), so that a table a proxier keeps up compares equal to it.
// Endpoints maps loaded has beyond those the slots need are kept, empty,
// as a running proxier keeps the maps it once needed; their elements, if
// any, are not desired.
func DesiredOn(cfg Config, f nft.Family, s watch.Snapshot, loaded *nft.Ruleset) *nft.Ruleset {
	rcfg, node := rulesetConfig(cfg, f, s.Node, s.ServiceCIDRs)
	store := newObjectStore()
	store.recordAll(s.Services, s.Slices)
	var ports []model.ServicePortState
	for _, name := range slices.SortedFunc(maps.Keys(store.services), compareNames) {
		ports = append(ports, model.ServicePorts(f, node, store.service(name), store.slicesOf(f, name))...)
	}
	rs := ruleset.BuildSlots(rcfg, f, ports, seedSlots(f, loaded))
	if loaded != nil {
		for name := range loaded.Sets {
			if _, ok := rs.Sets[name]; !ok {
				if m, ours := ruleset.EndpointsMap(f, name); ours {
					rs.AddSet(m)
				}
			}
		}
	}
	return rs
}

func compareNames(a, b model.ServiceName) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}
