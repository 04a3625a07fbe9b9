package proxier

import (
	"slices"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// objectStore is the proxier's view of the Services and EndpointSlices as
// of the last checkout of changes. It is owned by the sync loop: the
// families' syncs, which run at once, only read it.
type objectStore struct {
	services map[model.ServiceName]*model.Service
	// slicesBySvc holds each Service's EndpointSlices (usually one: a
	// slice, not a map, saves memory per Service); sliceSvc the Service
	// each slice was recorded under.
	slicesBySvc map[model.ServiceName][]*model.EndpointSlice
	sliceSvc    map[model.SliceKey]model.ServiceName
}

func newObjectStore() objectStore {
	return objectStore{
		services:    map[model.ServiceName]*model.Service{},
		slicesBySvc: map[model.ServiceName][]*model.EndpointSlice{},
		sliceSvc:    map[model.SliceKey]model.ServiceName{},
	}
}

// record updates the store with the checked-out changes (idempotent: after
// a failed sync the same changes come again) and returns the Services they
// affect.
func (s *objectStore) record(svcs watch.ServiceChanges, slices watch.SliceChanges) map[model.ServiceName]bool {
	affected := make(map[model.ServiceName]bool, len(svcs.Changed)+len(slices.Changed))
	if len(s.services) == 0 && len(s.sliceSvc) == 0 {
		// The first checkout holds every object: no growing map by map.
		s.services = make(map[model.ServiceName]*model.Service, len(svcs.Changed))
		s.slicesBySvc = make(map[model.ServiceName][]*model.EndpointSlice, len(svcs.Changed))
		s.sliceSvc = make(map[model.SliceKey]model.ServiceName, len(slices.Changed))
	}
	for k, c := range svcs.Changed {
		if c.Deleted {
			delete(s.services, k)
		} else {
			s.services[k] = c.Value
		}
		affected[k] = true
	}
	for k, c := range slices.Changed {
		if old, ok := s.sliceSvc[k]; ok {
			s.removeSlice(old, k.Name)
			delete(s.sliceSvc, k)
			affected[old] = true
		}
		if c.Deleted {
			continue
		}
		svc := c.Value.Service
		s.slicesBySvc[svc] = append(s.slicesBySvc[svc], c.Value)
		s.sliceSvc[k] = svc
		affected[svc] = true
	}
	return affected
}

// removeSlice removes the EndpointSlice named name from svc's. (A slice's
// Service is in its namespace, so the name identifies it.)
func (s *objectStore) removeSlice(svc model.ServiceName, name string) {
	ss := slices.DeleteFunc(s.slicesBySvc[svc], func(es *model.EndpointSlice) bool { return es.Name == name })
	if len(ss) == 0 {
		delete(s.slicesBySvc, svc)
	} else {
		s.slicesBySvc[svc] = ss
	}
}

// familyLen returns how many Services the store holds with a ClusterIP
// of family f.
func (s *objectStore) familyLen(f nft.Family) int {
	n := 0
	for _, svc := range s.services {
		if hasFamily(f, svc) {
			n++
		}
	}
	return n
}

// names returns the name of every Service the store holds with a
// ClusterIP of family f, in a map with room for extra more. A Service
// without one has no service port in f's table (model.ServicePorts), so a
// family sync need not look at it: the IPv6 family of a dual-stack node
// whose Services are IPv4 walks none.
func (s *objectStore) names(f nft.Family, extra int) map[model.ServiceName]bool {
	names := make(map[model.ServiceName]bool, s.familyLen(f)+extra)
	for name, svc := range s.services {
		if hasFamily(f, svc) {
			names[name] = true
		}
	}
	return names
}

func hasFamily(f nft.Family, svc *model.Service) bool {
	for _, ip := range svc.ClusterIPs {
		if f.Contains(ip) {
			return true
		}
	}
	return false
}

// service returns the Service named name, nil if there is none.
func (s *objectStore) service(name model.ServiceName) *model.Service { return s.services[name] }

// slicesOf returns Service name's EndpointSlices of family f, in a new
// slice.
func (s *objectStore) slicesOf(f nft.Family, name model.ServiceName) []*model.EndpointSlice {
	var out []*model.EndpointSlice
	for _, es := range s.slicesBySvc[name] {
		if es.Family == f {
			out = append(out, es)
		}
	}
	return out
}

// counts returns how many Services of family f there are, with how many
// ports, and how many endpoint ports their EndpointSlices hold, in all and
// on node nodeName: the sizes a full sync into an empty table reserves
// (ruleset.Reserve).
func (s *objectStore) counts(f nft.Family, nodeName string) ruleset.Counts {
	var c ruleset.Counts
	for _, svc := range s.services {
		if hasFamily(f, svc) {
			c.Services++
			c.Ports += len(svc.Ports)
		}
	}
	for _, slices := range s.slicesBySvc {
		for _, es := range slices {
			if es.Family != f {
				continue
			}
			c.Endpoints += len(es.Endpoints) * len(es.Ports)
			for i := range es.Endpoints {
				if es.Endpoints[i].OnNode(nodeName) {
					c.LocalEndpoints += len(es.Ports)
				}
			}
		}
	}
	return c
}
