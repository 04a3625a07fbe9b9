package proxier

import (
	"iter"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/changes"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// objectStore is the proxier's view of the Services and EndpointSlices as
// of the last checkout of changes (changes.Tracker.Checkout): every object
// as it was handed out, programmed or not. It is owned by the sync loop:
// the families' syncs, which run at once, only read it.
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

// presize gives an empty store room for the Services and EndpointSlices a
// first checkout is about to record: no growing map by map.
func (s *objectStore) presize(services, slices int) {
	if len(s.services) > 0 || len(s.sliceSvc) > 0 {
		return
	}
	s.services = make(map[model.ServiceName]*model.Service, services)
	s.slicesBySvc = make(map[model.ServiceName][]*model.EndpointSlice, services)
	s.sliceSvc = make(map[model.SliceKey]model.ServiceName, slices)
}

// recordService records a checked-out change of Service k and adds k to
// affected (if not nil).
func (s *objectStore) recordService(k model.ServiceName, c changes.Change[*model.Service], affected map[model.ServiceName]bool) {
	if c.Deleted {
		delete(s.services, k)
	} else {
		s.services[k] = c.Value
	}
	mark(affected, k)
}

// recordSlice records a checked-out change of EndpointSlice k and adds the
// Services it affects to affected (if not nil): the one it was recorded
// under and the one it now names.
func (s *objectStore) recordSlice(k model.SliceKey, c changes.Change[*model.EndpointSlice], affected map[model.ServiceName]bool) {
	if old, ok := s.sliceSvc[k]; ok {
		s.removeSlice(old, k.Name)
		delete(s.sliceSvc, k)
		mark(affected, old)
	}
	if c.Deleted {
		return
	}
	svc := c.Value.Service
	s.slicesBySvc[svc] = append(s.slicesBySvc[svc], c.Value)
	s.sliceSvc[k] = svc
	mark(affected, svc)
}

func mark(affected map[model.ServiceName]bool, name model.ServiceName) {
	if affected != nil {
		affected[name] = true
	}
}

// recordAll records every Service and EndpointSlice of a listing, as a
// first checkout would hand them out.
func (s *objectStore) recordAll(svcs map[model.ServiceName]*model.Service, slices map[model.SliceKey]*model.EndpointSlice) {
	s.presize(len(svcs), len(slices))
	for k, v := range svcs {
		s.recordService(k, changes.Change[*model.Service]{Value: v}, nil)
	}
	for k, v := range slices {
		s.recordSlice(k, changes.Change[*model.EndpointSlice]{Value: v}, nil)
	}
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
	for range s.each(f) {
		n++
	}
	return n
}

// each yields the name of every Service the store holds with a ClusterIP
// of family f. A Service without one has no service port in f's table
// (model.ServicePorts), so a family sync need not look at it: the IPv6
// family of a dual-stack node whose Services are IPv4 walks none.
func (s *objectStore) each(f nft.Family) iter.Seq[model.ServiceName] {
	return func(yield func(model.ServiceName) bool) {
		for name, svc := range s.services {
			if hasFamily(f, svc) && !yield(name) {
				return
			}
		}
	}
}

// names returns each(f) in a map with room for extra more.
func (s *objectStore) names(f nft.Family, extra int) map[model.ServiceName]bool {
	names := make(map[model.ServiceName]bool, s.familyLen(f)+extra)
	for name := range s.each(f) {
		names[name] = true
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
