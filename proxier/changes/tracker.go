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
//
// A tracker may also stamp each update of an object with the time the
// change behind it happened (an EndpointSlice's
// last-change-trigger-time): a checkout hands out the stamps of every
// such update since the last checkout, however many updates one object
// had, which is what the network programming latency counts (kube-proxy
// records one sample per update, each from its own trigger time, and so
// must we, or a busy node's latency reads low).
package changes

import (
	"sync"
	"time"
)

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
	stamp   func(V) time.Time // nil: updates are not stamped
	current map[K]V           // latest value; absent: deleted
	// pending holds, for each object whose latest value differs from the
	// value the last checkout handed out, that value.
	pending map[K]version[V]
	// stamps holds, for each object updated since the last checkout, the
	// stamps of its updates, oldest first.
	stamps map[K][]Stamp[V]
}

// Stamp is when the change behind one update happened, and the value the
// update recorded.
type Stamp[V any] struct {
	At    time.Time
	Value V
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

// NewStamped returns a tracker that uses equal to drop no-op changes and
// stamps every update (Set) with stamp's time (none where it is zero), and
// every object a relist (Replace) changed. An object's deletion drops the stamps of its updates not
// yet checked out: what they changed is not programmed, the deletion is,
// and a deletion carries no time of its own (kube-proxy drops them alike).
func NewStamped[K comparable, V any](equal func(a, b V) bool, stamp func(V) time.Time) *Tracker[K, V] {
	t := New[K](equal)
	t.stamp, t.stamps = stamp, map[K][]Stamp[V]{}
	return t
}

// Set records the latest value of an object (add or update). It reports
// whether the next checkout hands out something new: a change, or the
// stamp of this update (an update is stamped even when it changes nothing,
// as kube-proxy, which compares whole API objects, records a sample for
// it too).
func (t *Tracker[K, V]) Set(k K, v V) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	stamped := t.stampLocked(k, v)
	old, ok := t.current[k]
	if ok && t.equal(old, v) {
		return stamped
	}
	t.current[k] = v
	t.markLocked(k, version[V]{old, ok})
	return true
}

// Replace records next as the latest value of every object: objects
// absent from next are gone. It returns how many objects it changed (added,
// updated or deleted). The tracker keeps next (the caller must not use it
// again); an unchanged object keeps the value recorded before, so that a
// relist leaves the values handed out shared, not copied.
func (t *Tracker[K, V]) Replace(next map[K]V) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	old, changed := t.current, 0
	t.current = next
	for k, v := range next {
		o, ok := old[k]
		if ok && t.equal(o, v) {
			next[k] = o
			continue
		}
		t.markLocked(k, version[V]{o, ok})
		t.stampLocked(k, v)
		changed++
	}
	for k, o := range old {
		if _, ok := next[k]; !ok {
			t.markLocked(k, version[V]{o, true})
			delete(t.stamps, k)
			changed++
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
	delete(t.stamps, k)
	return true
}

// stampLocked records the stamp of an update that set object k to v, and
// reports whether it had one.
func (t *Tracker[K, V]) stampLocked(k K, v V) bool {
	if t.stamp == nil {
		return false
	}
	at := t.stamp(v)
	if at.IsZero() {
		return false
	}
	t.stamps[k] = append(t.stamps[k], Stamp[V]{At: at, Value: v})
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
// many there were, and the stamps of the updates recorded since the last
// checkout (an object updated and then set back to the value handed out
// is not pending, but its updates were made and are stamped); none is
// pending after. f runs under the tracker's lock (the watchers wait for
// it) and must not call the tracker. Its cost is proportional to the
// number of pending changes: the changes go straight to what the caller
// keeps, with no copy of them in between (at the first sync, that copy
// would be a map of every object).
func (t *Tracker[K, V]) Checkout(f func(K, Change[V])) (int, []Stamp[V]) {
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
	var stamps []Stamp[V]
	if len(t.stamps) > 0 {
		for _, s := range t.stamps {
			stamps = append(stamps, s...)
		}
		t.stamps = map[K][]Stamp[V]{}
	}
	return n, stamps
}

// Get returns an object's current value.
func (t *Tracker[K, V]) Get(k K) (V, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.current[k]
	return v, ok
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
