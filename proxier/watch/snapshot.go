package watch

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nftproxy/nftproxy/proxier/model"
)

// Objects are the API objects that decide a node's rules, as listed from
// the API or read from a file: the input of NewSnapshot.
type Objects struct {
	Services     []*v1.Service
	Slices       []*discovery.EndpointSlice
	Nodes        []*v1.Node
	ServiceCIDRs []*networking.ServiceCIDR
}

// Add files obj under its kind; it reports false for any other kind.
func (o *Objects) Add(obj runtime.Object) bool {
	switch x := obj.(type) {
	case *v1.Service:
		o.Services = append(o.Services, x)
	case *discovery.EndpointSlice:
		o.Slices = append(o.Slices, x)
	case *v1.Node:
		o.Nodes = append(o.Nodes, x)
	case *networking.ServiceCIDR:
		o.ServiceCIDRs = append(o.ServiceCIDRs, x)
	default:
		return false
	}
	return true
}

// Snapshot is what the proxier holds for one node once its informers have
// synced: the Services and EndpointSlices it proxies, converted, this
// node's Node and the ServiceCIDRs' ranges. A tool (nftproxy dump) builds
// the node's rules from it without running informers.
type Snapshot struct {
	// Node is this node's object converted; zero if there is none.
	Node model.Node
	// ServiceCIDRs are the ranges of the ServiceCIDR objects, sorted;
	// none: the proxier falls back to its --service-cidr.
	ServiceCIDRs []netip.Prefix
	Services     map[model.ServiceName]*model.Service
	Slices       map[model.SliceKey]*model.EndpointSlice
}

// NewSnapshot converts objs as the watchers do: the informers' label
// selector, ConvertService, ConvertEndpointSlice, ConvertNode for the Node
// named nodeName, and the ServiceCIDRs' ranges. An object given twice
// counts once, the last one given (as a watch ends with the latest). It
// returns the problems found, which the watchers would have logged.
func NewSnapshot(nodeName string, objs Objects) (Snapshot, []Problem) {
	proxied, err := labels.Parse(ProxyLabelSelector)
	if err != nil {
		panic("ProxyLabelSelector does not parse: " + err.Error()) // a constant
	}
	s := Snapshot{Services: map[model.ServiceName]*model.Service{}, Slices: map[model.SliceKey]*model.EndpointSlice{}}
	var problems []Problem
	for _, svc := range objs.Services {
		name := model.ServiceName{Namespace: svc.Namespace, Name: svc.Name}
		delete(s.Services, name)
		if !proxied.Matches(labels.Set(svc.Labels)) {
			continue
		}
		v, ps := ConvertService(svc)
		problems = append(problems, ps...)
		if v != nil {
			s.Services[name] = v
		}
	}
	for _, es := range objs.Slices {
		key := model.SliceKey{Namespace: es.Namespace, Name: es.Name}
		delete(s.Slices, key)
		if !proxied.Matches(labels.Set(es.Labels)) {
			continue
		}
		v, ps := ConvertEndpointSlice(es)
		problems = append(problems, ps...)
		if v != nil {
			s.Slices[key] = v
		}
	}
	for _, n := range objs.Nodes {
		if n.Name == nodeName {
			s.Node = ConvertNode(n)
		}
	}
	var ps []Problem
	s.ServiceCIDRs, ps = ConvertServiceCIDRs(objs.ServiceCIDRs)
	return s, append(problems, ps...)
}

// ConvertServiceCIDRs returns the ranges of ServiceCIDR objects, sorted
// and without repeats, and the problems of those that do not parse.
func ConvertServiceCIDRs(objs []*networking.ServiceCIDR) ([]netip.Prefix, []Problem) {
	var out []netip.Prefix
	var problems []Problem
	for _, sc := range objs {
		for _, c := range sc.Spec.CIDRs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				problems = append(problems, Problem{Kind: KindServiceCIDR, Object: sc.Name, Reason: ReasonInvalidCIDR, Detail: c})
				continue
			}
			out = append(out, p.Masked())
		}
	}
	// In a stable order (an informer's store lists in a random one): the
	// rules follow it, and a mere reordering would rebuild every Service's
	// rules.
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out), problems
}
