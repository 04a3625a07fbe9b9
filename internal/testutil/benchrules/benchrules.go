// Package benchrules is the bench's cluster (proxier/model/benchstate) as
// the rules a full sync writes, for the benchmarks of proxier/ruleset and
// nft/nftnl: one way to build them, so that the Editor one package's
// benchmarks time is the one the other's encode.
package benchrules

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// Fragment is the IPv4 fragment of Service i of the cluster of size sz in
// generation gen (benchstate.Service), built with cfg; its endpoints take
// slots in slots.
func Fragment(cfg ruleset.Config, slots *ruleset.Slots, sz benchstate.Size, i, gen int) *nft.Fragment {
	svc, es := benchstate.Service(sz, i, gen)
	return ruleset.ServiceFragment(cfg, model.ServicePorts(nft.IPv4, benchstate.Node, svc, []*model.EndpointSlice{es}), slots)
}

// Fragments are the fragments of every Service of the cluster of size sz
// in generation 0, in order (Fragment).
func Fragments(cfg ruleset.Config, slots *ruleset.Slots, sz benchstate.Size) []*nft.Fragment {
	out := make([]*nft.Fragment, sz.Services)
	for i := range out {
		out[i] = Fragment(cfg, slots, sz, i, 0)
	}
	return out
}

// Editor is the IPv4 Editor of a full sync of frags: the table's sets, the
// endpoints and pick maps of slots, the base chains of cfg, every fragment,
// then the pick maps' chains (as the proxier's sync adds them:
// ruleset.Slots.UpdatePicks). Its Transaction is the full sync's.
func Editor(cfg ruleset.Config, slots *ruleset.Slots, frags []*nft.Fragment) *nft.Editor {
	ed := nft.NewEditor(nft.IPv4)
	for _, s := range ruleset.Sets(nft.IPv4, ruleset.Config{}) {
		ed.AddSet(s)
	}
	for _, m := range slots.Maps(nft.IPv4) {
		ed.AddSet(m)
	}
	ed.Replace(nil, ruleset.Base(cfg, nft.IPv4))
	for _, fr := range frags {
		ed.Replace(nil, fr)
	}
	ed.Replace(nil, slots.PickChains())
	return ed
}
