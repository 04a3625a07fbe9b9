package main

import (
	_ "embed"
	"encoding/json"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// smokeAPIFile is the recorded API state of the smoke tests, embedded:
// the test binary runs on nodes that have no checkout (e2e/nodes).
const smokeAPIFile = "testdata/smoke/cluster.yaml"

//go:embed testdata/smoke/cluster.yaml
var smokeAPIObjects []byte

// smokeAPI is the test's copy of what the proxy's fake API holds: the
// recorded objects, then the test's changes.
type smokeAPI struct {
	keys []string                  // in the order first put
	objs map[string]runtime.Object // by kind/namespace/name
}

// loadSmokeAPI reads the recorded objects (a v1 List).
func loadSmokeAPI(t *testing.T) *smokeAPI {
	t.Helper()
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(smokeAPIObjects, nil, nil)
	if err != nil {
		t.Fatalf("%s: %v", smokeAPIFile, err)
	}
	list, ok := obj.(*v1.List)
	if !ok {
		t.Fatalf("%s: a %T, want a v1 List", smokeAPIFile, obj)
	}
	raw := make([]json.RawMessage, len(list.Items))
	for i, item := range list.Items {
		raw[i] = item.Raw
	}
	objs, err := decodeObjects(raw)
	if err != nil {
		t.Fatalf("%s: %v", smokeAPIFile, err)
	}
	a := &smokeAPI{objs: map[string]runtime.Object{}}
	for _, o := range objs {
		a.put(t, o)
	}
	return a
}

// put records objects (runtime.Objects) and returns them as JSON for the
// fake API.
func (a *smokeAPI) put(t *testing.T, objs ...any) []json.RawMessage {
	t.Helper()
	var raw []json.RawMessage
	for _, o := range objs {
		obj := o.(runtime.Object).DeepCopyObject()
		gvks, _, err := scheme.Scheme.ObjectKinds(obj)
		if err != nil {
			t.Fatal(err)
		}
		obj.GetObjectKind().SetGroupVersionKind(gvks[0])
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		key := gvks[0].Kind + "/" + m.GetNamespace() + "/" + m.GetName()
		if _, ok := a.objs[key]; !ok {
			a.keys = append(a.keys, key)
		}
		a.objs[key] = obj
		b, err := json.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, b)
	}
	return raw
}

// objects returns every object as JSON.
func (a *smokeAPI) objects() []json.RawMessage {
	var raw []json.RawMessage
	for _, k := range a.keys {
		b, err := json.Marshal(a.objs[k])
		if err != nil {
			panic(err) // marshalled before, in put
		}
		raw = append(raw, b)
	}
	return raw
}

// list is every object as a v1 List in JSON, as `kubectl get -o json`
// prints it: what `nftproxy diff --from-file` reads.
func (a *smokeAPI) list(t *testing.T) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": a.objects()})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// slice returns a copy of EndpointSlice smoke/name.
func (a *smokeAPI) slice(t *testing.T, name string) *discovery.EndpointSlice {
	t.Helper()
	s, ok := a.objs["EndpointSlice/smoke/"+name]
	if !ok {
		t.Fatalf("no EndpointSlice smoke/%s in %s", name, smokeAPIFile)
	}
	return s.DeepCopyObject().(*discovery.EndpointSlice)
}

// withEndpoints is slice s with pods as its endpoints, ready, each on its
// node.
func withEndpoints(s *discovery.EndpointSlice, pods ...*smokePod) *discovery.EndpointSlice {
	s.Endpoints = nil
	ready := true
	for _, p := range pods {
		node := p.host.name
		addr := p.ipv4
		if s.AddressType == discovery.AddressTypeIPv6 {
			addr = p.ipv6
		}
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{addr.String()},
			Conditions: discovery.EndpointConditions{Ready: &ready}, NodeName: &node})
	}
	return s
}
