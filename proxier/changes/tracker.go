// Package changes records what the watchers saw between two syncs.
//
// A Tracker keeps the latest value of each object, and which objects
// changed since the sync loop last checked the changes out. Informer
// callbacks only write; the sync loop checks the changes out and keeps
// what it was handed, so that it always holds every object as of its last
// checkout. Changes that cancel out (an update back to the value handed
// out) are not pending.
//
// A checkout is final: the tracker does not hand the same changes out
// again after a failed sync. The sync loop holds them already, and a
// failed sync must program them from there (the proxier's next sync of a
// failed family rebuilds it from every object it holds). Handing them out
// again instead would hand out too little: an object changed back, after
// the failed sync, to the value it had before that sync is not pending,
// and the sync loop would hold the value the failed sync was given.
package changes

import "sync"

// Tracker tracks objects of type V by key K. V values must be treated as
// immutable once handed to the tracker.
//
// What was handed out is not kept for every object: an object that is not
// pending was handed out with its latest value. Only a pending object keeps
// the value handed out (or its absence), so the tracker holds one map as
// large as the cluster, not two.
type Tracker[K comparable, V any] struct {
	mu      sync.Mutex
	equal   func(a, b V) bool
	current map[K]V // latest value; absent: deleted
	// pending holds, for each object whose latest value differs from the
	// value the last checkout handed out, that value.
	pending map[K]version[V]
}

// version is a value of an object, or its absence (ok false).
type version[V any] struct {
	v  V
	ok bool
}

// New returns a tracker that uses equal to drop no-op changes.
func New[K comparable, V any](equal func(a, b V) bool) *Tracker[K, V] {
	return &Tracker[K, V]{equal: equal, current: map[K]V{}, pending: map[K]version[V]{}}
}

// Set records the latest value of an object (add or update). It reports
// whether this changed what is pending.
func (t *Tracker[K, V]) Set(k K, v V) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.current[k]
	if ok && t.equal(old, v) {
		return false
	}
	t.current[k] = v
	t.markLocked(k, version[V]{old, ok})
	return true
}

// Replace records next as the latest value of every object: objects
// absent from next are gone. It reports whether this changed what is
// pending. The tracker keeps next (the caller must not use it again); an
// unchanged object keeps the value recorded before, so that a relist leaves
// the values handed out shared, not copied.
func (t *Tracker[K, V]) Replace(next map[K]V) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, changed := t.current, false
	t.current = next
	for k, v := range next {
		o, ok := old[k]
		if ok && t.equal(o, v) {
			next[k] = o
			continue
		}
		t.markLocked(k, version[V]{o, ok})
		changed = true
	}
	for k, o := range old {
		if _, ok := next[k]; !ok {
			t.markLocked(k, version[V]{o, true})
			changed = true
		}
	}
	return changed
}

// Delete records that an object is gone. It reports whether this changed
// what is pending.
func (t *Tracker[K, V]) Delete(k K) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.current[k]
	if !ok {
		return false
	}
	delete(t.current, k)
	t.markLocked(k, version[V]{old, true})
	return true
}

// markLocked records that object k's latest value changed from prev: k
// is pending unless its latest value is the one handed out.
func (t *Tracker[K, V]) markLocked(k K, prev version[V]) {
	out, ok := t.pending[k]
	if !ok {
		out = prev // k was not pending: prev is what was handed out
	}
	cur, ok := t.current[k]
	if ok == out.ok && (!ok || t.equal(cur, out.v)) {
		delete(t.pending, k)
		return
	}
	t.pending[k] = out
}

// Pending is the number of objects changed since the last checkout.
func (t *Tracker[K, V]) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Change is the latest state of one object: its value, or deleted.
type Change[V any] struct {
	Value   V
	Deleted bool
}

// Checkout hands every pending change to f, in no order, and returns how
// many there were; none is pending after. f runs under the tracker's lock
// (the watchers wait for it) and must not call the tracker. Its cost is
// proportional to the number of pending changes: the changes go straight
// to what the caller keeps, with no copy of them in between (at the first
// sync, that copy would be a map of every object).
func (t *Tracker[K, V]) Checkout(f func(K, Change[V])) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.pending)
	for k := range t.pending {
		v, ok := t.current[k]
		f(k, Change[V]{Value: v, Deleted: !ok})
	}
	// A new map: a map keeps the room it grew to, after the first sync
	// room for every object.
	t.pending = map[K]version[V]{}
	return n
}

// All returns every current object.
func (t *Tracker[K, V]) All() map[K]V {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[K]V, len(t.current))
	for k, v := range t.current {
		out[k] = v
	}
	return out
}
