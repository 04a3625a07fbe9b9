package proxier

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/changes"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// TestObjectStoreRecord follows Services and EndpointSlices through the
// store: added, updated, moved from one Service to another, deleted.
func TestObjectStoreRecord(t *testing.T) {
	web, db := model.ServiceName{Namespace: "ns", Name: "web"}, model.ServiceName{Namespace: "ns", Name: "db"}
	svc := func(n model.ServiceName, ips ...string) *model.Service {
		s := &model.Service{Name: n, Ports: []model.ServicePort{{Protocol: nft.ProtoTCP, Port: 80}, {Protocol: nft.ProtoTCP, Port: 443}}}
		for _, ip := range ips {
			s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr(ip))
		}
		return s
	}
	slice := func(name string, n model.ServiceName, f nft.Family, nodes ...string) *model.EndpointSlice {
		es := &model.EndpointSlice{Name: name, Service: n, Family: f, Ports: []model.EndpointPort{{Port: 8080}}}
		for _, node := range nodes {
			es.Endpoints = append(es.Endpoints, model.Endpoint{Place: &model.Placement{NodeName: node}})
		}
		return es
	}
	s := newObjectStore()
	record := func(svcs map[model.ServiceName]changes.Change[*model.Service],
		slices map[model.SliceKey]changes.Change[*model.EndpointSlice]) map[model.ServiceName]bool {
		affected := map[model.ServiceName]bool{}
		for k, c := range svcs {
			s.recordService(k, c, affected)
		}
		for k, c := range slices {
			s.recordSlice(k, c, affected)
		}
		return affected
	}
	k1, k2, k6 := model.SliceKey{Namespace: "ns", Name: "web-1"}, model.SliceKey{Namespace: "ns", Name: "web-2"},
		model.SliceKey{Namespace: "ns", Name: "web-6"}
	web1, web2, web6 := slice("web-1", web, nft.IPv4, "a", "b"), slice("web-2", web, nft.IPv4, "a"), slice("web-6", web, nft.IPv6, "a")

	first := func() map[model.ServiceName]bool {
		return record(map[model.ServiceName]changes.Change[*model.Service]{
			web: {Value: svc(web, "10.96.0.1", "fd00::1")}, db: {Value: svc(db, "10.96.0.2")}},
			map[model.SliceKey]changes.Change[*model.EndpointSlice]{k1: {Value: web1}, k2: {Value: web2}, k6: {Value: web6}})
	}
	if got := first(); !reflect.DeepEqual(got, map[model.ServiceName]bool{web: true, db: true}) {
		t.Fatalf("first checkout affects %v, want web and db", got)
	}
	first() // the same objects again (updated to themselves): nothing is doubled
	if n, v4, v6 := len(s.slicesOf(nft.IPv4, web)), s.familyLen(nft.IPv4), s.familyLen(nft.IPv6); n != 2 || v4 != 2 || v6 != 1 {
		t.Fatalf("after recording twice: %d IPv4 slices of web, %d IPv4 and %d IPv6 Services; want 2, 2 and 1", n, v4, v6)
	}
	want := ruleset.Counts{Services: 2, Ports: 4, Endpoints: 3, LocalEndpoints: 2}
	if got := s.counts(nft.IPv4, "a"); got != want {
		t.Errorf("IPv4 counts on node a = %+v, want %+v", got, want)
	}
	if got := s.slicesOf(nft.IPv6, web); !reflect.DeepEqual(got, []*model.EndpointSlice{web6}) {
		t.Errorf("IPv6 slices of web = %v, want web-6", got)
	}

	// web-2 now belongs to db; web is deleted: both are affected.
	moved := slice("web-2", db, nft.IPv4, "b")
	got := record(map[model.ServiceName]changes.Change[*model.Service]{web: {Deleted: true}},
		map[model.SliceKey]changes.Change[*model.EndpointSlice]{k2: {Value: moved}})
	if !reflect.DeepEqual(got, map[model.ServiceName]bool{web: true, db: true}) {
		t.Fatalf("the move affects %v, want web and db", got)
	}
	if s.service(web) != nil || s.familyLen(nft.IPv4) != 1 {
		t.Errorf("web is still stored after its deletion (%d Services)", s.familyLen(nft.IPv4))
	}
	if got := s.slicesOf(nft.IPv4, db); !reflect.DeepEqual(got, []*model.EndpointSlice{moved}) {
		t.Errorf("db's slices = %v, want the moved web-2", got)
	}
	if got := s.slicesOf(nft.IPv4, web); !reflect.DeepEqual(got, []*model.EndpointSlice{web1}) {
		t.Errorf("web's IPv4 slices = %v, want web-1 only", got)
	}

	// Deleting the last slices of web forgets web's slices altogether.
	record(nil, map[model.SliceKey]changes.Change[*model.EndpointSlice]{k1: {Deleted: true}, k6: {Deleted: true}})
	if _, ok := s.slicesBySvc[web]; ok {
		t.Errorf("web keeps an entry for its slices after they were all deleted")
	}
	if names := s.names(nft.IPv4, 0); !reflect.DeepEqual(names, map[model.ServiceName]bool{db: true}) {
		t.Errorf("IPv4 names = %v, want db", names)
	}
	if names := s.names(nft.IPv6, 0); len(names) != 0 {
		t.Errorf("IPv6 names = %v, want none (db is IPv4 only)", names)
	}
}
