package watch

import (
	"fmt"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"github.com/nftproxy/nftproxy/proxier/changes"
)

// trackingStore is the store a reflector of Services or EndpointSlices
// writes into: it converts each object and records it in the tracker at
// once. An informer would put three more stages between the reflector and
// the tracker (its queue, its cache, and the handlers' buffer), each a map
// or a copy of every object; at start, with every object arriving at once,
// they cost about as much as decoding the objects, and the handlers ran
// behind the list.
//
// The reflector calls it from one goroutine. Resync does nothing: it
// would hand the tracker values it holds already.
type trackingStore[K comparable, V any] struct {
	h    Hooks
	kind string // KindService or KindEndpointSlice
	t    *changes.Tracker[K, *V]
	key  func(ns, name string) K
	// problems holds the problems of each object that has some, so that
	// each is reported once, when a version brings it (newProblems).
	problems map[K][]Problem
	synced   atomic.Bool // the first list is recorded
}

func newTrackingStore[K comparable, V any](h Hooks, kind string, t *changes.Tracker[K, *V],
	key func(ns, name string) K) *trackingStore[K, V] {
	return &trackingStore[K, V]{h: h, kind: kind, t: t, key: key, problems: map[K][]Problem{}}
}

// hasSynced reports whether the tracker holds the first list.
func (s *trackingStore[K, V]) hasSynced() bool { return s.synced.Load() }

// convert returns obj as converted: an API object is converted now; the
// reflector's watch-list store converted its objects already (Transformer).
func (s *trackingStore[K, V]) convert(obj any) (*converted[V], error) {
	c, err := convertForCache(obj)
	if err != nil {
		return nil, err
	}
	if cv, ok := c.(*converted[V]); ok {
		return cv, nil
	}
	return nil, fmt.Errorf("%s store given a %T", s.kind, obj)
}

// reportNew reports the problems of c that the object's previous version
// did not have, and keeps c's.
func (s *trackingStore[K, V]) reportNew(k K, c *converted[V], into map[K][]Problem) {
	report(s.h, newProblems(s.problems[k], c.problems))
	if len(c.problems) > 0 {
		into[k] = c.problems
	} else {
		delete(into, k)
	}
}

func (s *trackingStore[K, V]) Add(obj any) error { return s.Update(obj) }

func (s *trackingStore[K, V]) Update(obj any) error {
	c, err := s.convert(obj)
	if err != nil {
		return err
	}
	s.h.Event(s.kind)
	k := s.key(c.namespace, c.name)
	s.reportNew(k, c, s.problems)
	if c.value == nil { // an object the proxy ignores
		recordDelete(s.h, s.kind, s.t, k)
		return nil
	}
	// Every update of an object the proxy tracks counts, whether or not
	// it changes anything, as kube-proxy counts it.
	s.h.Updated(s.kind, 1)
	if s.t.Set(k, c.value) { // a change, or a trigger time to observe
		s.h.Changed()
	}
	return nil
}

func (s *trackingStore[K, V]) Delete(obj any) error {
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	s.h.Event(s.kind)
	k := s.key(m.GetNamespace(), m.GetName())
	delete(s.problems, k)
	recordDelete(s.h, s.kind, s.t, k)
	return nil
}

// Replace records a whole list: what it holds, and every object it does
// not hold as deleted.
func (s *trackingStore[K, V]) Replace(list []any, _ string) error {
	next := make(map[K]*V, len(list))
	problems := map[K][]Problem{}
	for _, obj := range list {
		c, err := s.convert(obj)
		if err != nil {
			return err
		}
		s.h.Event(s.kind)
		k := s.key(c.namespace, c.name)
		s.reportNew(k, c, problems)
		if c.value != nil {
			next[k] = c.value
		}
	}
	s.problems = problems
	// A relist updates the objects it changed: an informer would deliver
	// those, and only those, as updates.
	if n := s.t.Replace(next); n > 0 {
		s.h.Updated(s.kind, n)
		s.h.Changed()
	}
	s.synced.Store(true)
	return nil
}

func (s *trackingStore[K, V]) Resync() error { return nil }

// Transformer makes the reflector's watch-list store keep converted
// objects while the list streams in, not API objects.
func (s *trackingStore[K, V]) Transformer() cache.TransformFunc { return convertForCache }
