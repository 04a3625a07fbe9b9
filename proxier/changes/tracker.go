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
type Tracker[K comparable, V any] struct {
	mu      sync.Mutex
	equal   func(a, b V) bool
	current map[K]V        // latest value; absent: deleted
	applied map[K]V        // value the last successful sync applied
	dirty   map[K]struct{} // keys whose current differs from applied
}

// New returns a tracker that uses equal to drop no-op changes.
func New[K comparable, V any](equal func(a, b V) bool) *Tracker[K, V] {
	return &Tracker[K, V]{equal: equal, current: map[K]V{}, applied: map[K]V{}, dirty: map[K]struct{}{}}
}

// Set records the latest value of an object (add or update). It reports
// whether this changed what is pending.
func (t *Tracker[K, V]) Set(k K, v V) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.current[k]; ok && t.equal(old, v) {
		return false
	}
	t.current[k] = v
	t.markLocked(k)
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
		if o, ok := old[k]; ok && t.equal(o, v) {
			next[k] = o
			continue
		}
		t.markLocked(k)
		changed = true
	}
	for k := range old {
		if _, ok := next[k]; !ok {
			t.markLocked(k)
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
	if _, ok := t.current[k]; !ok {
		return false
	}
	delete(t.current, k)
	t.markLocked(k)
	return true
}

func (t *Tracker[K, V]) markLocked(k K) {
	app, hasApp := t.applied[k]
	t.markAppliedLocked(k, app, hasApp)
}

// markAppliedLocked is markLocked given what is applied for k.
func (t *Tracker[K, V]) markAppliedLocked(k K, app V, hasApp bool) {
	cur, hasCur := t.current[k]
	if hasCur == hasApp && (!hasCur || t.equal(cur, app)) {
		delete(t.dirty, k)
		return
	}
	t.dirty[k] = struct{}{}
}

// Pending is the number of objects whose latest value is not applied yet.
func (t *Tracker[K, V]) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.dirty)
}

// Change is the latest state of one object: its value, or deleted.
type Change[V any] struct {
	Value   V
	Deleted bool
}

// Snapshot holds the changes pending when it was taken.
type Snapshot[K comparable, V any] struct {
	Changed map[K]Change[V]
}

// Checkout returns the pending changes. It changes nothing: call Applied
// with the snapshot once the sync built from it has succeeded. Its cost is
// proportional to the number of pending changes.
func (t *Tracker[K, V]) Checkout() Snapshot[K, V] {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot[K, V]{Changed: make(map[K]Change[V], len(t.dirty))}
	for k := range t.dirty {
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
	if len(t.applied) == 0 {
		// The first sync applies every object: sized once, the map does
		// not grow (and rehash) as it fills.
		t.applied = make(map[K]V, len(s.Changed))
	}
	for k, c := range s.Changed {
		if c.Deleted {
			delete(t.applied, k)
		} else {
			t.applied[k] = c.Value
		}
		t.markAppliedLocked(k, c.Value, !c.Deleted)
	}
	if len(t.dirty) == 0 {
		// A map keeps the room it grew to: after the first sync that
		// is room for every object, held for nothing.
		t.dirty = map[K]struct{}{}
	}
}
