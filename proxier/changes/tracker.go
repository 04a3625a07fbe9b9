// Package changes records what the watchers saw between two syncs.
//
// A Tracker keeps, per object, the value the last successful sync applied and
// the latest value seen. Informer callbacks only write; the sync loop checks
// out a consistent snapshot, and only after the transaction built from it
// succeeded does it mark the snapshot applied. A failed sync therefore loses
// nothing: the same changes are pending at the next attempt (upstream
// kube-proxy forgets them, kubernetes#112604). Changes that cancel out (an
// update back to the applied value) are not pending.
package changes

import "sync"

// Tracker tracks objects of type V by key K. V values must be treated as
// immutable once handed to the tracker.
//
// What the last successful sync applied is not kept for every object: an
// object that is not pending has its latest value applied. Only a pending
// object keeps its applied value, so the tracker holds one map as large as
// the cluster, not two.
type Tracker[K comparable, V any] struct {
	mu      sync.Mutex
	equal   func(a, b V) bool
	current map[K]V // latest value; absent: deleted
	// pending holds, for each object whose latest value differs from the
	// value the last successful sync applied, that applied value.
	pending map[K]version[V]
	// gen counts the changes to pending, so that a snapshot taken after
	// the last of them is applied without a look at each object.
	gen uint64
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
// the values the last sync applied shared, not copied.
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

// markLocked records that object k's latest value changed from prev.
func (t *Tracker[K, V]) markLocked(k K, prev version[V]) {
	app, ok := t.pending[k]
	if !ok {
		app = prev // k was not pending: prev is what is applied
	}
	t.settleLocked(k, app)
}

// settleLocked makes k pending with applied value app, unless its latest
// value is app.
func (t *Tracker[K, V]) settleLocked(k K, app version[V]) {
	t.gen++
	cur, ok := t.current[k]
	if ok == app.ok && (!ok || t.equal(cur, app.v)) {
		delete(t.pending, k)
		return
	}
	t.pending[k] = app
}

// Pending is the number of objects whose latest value is not applied yet.
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

// Snapshot holds the changes pending when it was taken.
type Snapshot[K comparable, V any] struct {
	Changed map[K]Change[V]
	gen     uint64 // the tracker's gen when it was taken
}

// Checkout returns the pending changes. It changes nothing: call Applied
// with the snapshot once the sync built from it has succeeded. Its cost is
// proportional to the number of pending changes.
func (t *Tracker[K, V]) Checkout() Snapshot[K, V] {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot[K, V]{Changed: make(map[K]Change[V], len(t.pending)), gen: t.gen}
	for k := range t.pending {
		v, ok := t.current[k]
		s.Changed[k] = Change[V]{Value: v, Deleted: !ok}
	}
	return s
}

// All returns every current object (for a full sync).
func (t *Tracker[K, V]) All() map[K]V {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[K]V, len(t.current))
	for k, v := range t.current {
		out[k] = v
	}
	return out
}

// Applied marks the state of a snapshot as applied. Changes recorded after
// the snapshot was taken stay pending.
func (t *Tracker[K, V]) Applied(s Snapshot[K, V]) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.gen == t.gen {
		// Nothing changed since s was taken: s holds every pending
		// object, as it is now. (A new map: a map keeps the room it grew
		// to, after the first sync room for every object.)
		t.pending = map[K]version[V]{}
		return
	}
	for k, c := range s.Changed {
		t.settleLocked(k, version[V]{c.Value, !c.Deleted})
	}
	if len(t.pending) == 0 {
		t.pending = map[K]version[V]{}
	}
}
