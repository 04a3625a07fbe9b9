package changes

import (
	"maps"
	"slices"
	"testing"
	"time"
)

func newIntTracker() *Tracker[string, int] {
	return New[string, int](func(a, b int) bool { return a == b })
}

// checkout is tr's pending changes, checked out.
func checkout(t *testing.T, tr *Tracker[string, int]) map[string]Change[int] {
	t.Helper()
	got := map[string]Change[int]{}
	n, _ := tr.Checkout(func(k string, c Change[int]) {
		if _, ok := got[k]; ok {
			t.Errorf("%s handed out twice", k)
		}
		got[k] = c
	})
	if n != len(got) {
		t.Errorf("checkout counted %d changes, handed out %d", n, len(got))
	}
	return got
}

func TestNoOpChangesAreNotPending(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	checkout(t, tr)
	if tr.Pending() != 0 {
		t.Fatalf("pending after a checkout: %d", tr.Pending())
	}
	tr.Set("a", 2)
	tr.Set("a", 1) // back to the value handed out
	if tr.Pending() != 0 {
		t.Errorf("update back to the value handed out is pending")
	}
	tr.Set("b", 1)
	tr.Delete("b") // never handed out
	if tr.Pending() != 0 {
		t.Errorf("add then delete is pending")
	}
}

// TestCheckoutIsFinal: what a checkout handed out is not handed out again,
// whatever became of the sync that took it.
func TestCheckoutIsFinal(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	if got := checkout(t, tr); len(got) != 1 || got["a"].Value != 1 {
		t.Fatalf("first checkout %+v, want a=1", got)
	}
	if got := checkout(t, tr); len(got) != 0 {
		t.Fatalf("second checkout %+v, want nothing", got)
	}
}

func TestChangesDuringSyncStayPending(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	tr.Set("b", 1)
	checkout(t, tr)
	tr.Set("a", 2) // arrives while the sync runs
	tr.Delete("b")
	got := checkout(t, tr)
	if len(got) != 2 || got["a"].Value != 2 || !got["b"].Deleted {
		t.Fatalf("want a=2 and b deleted pending, got %+v", got)
	}
}

// TestReplace: a relist records what changed, adds and deletes; objects
// it leaves as they are stay as handed out, and a relist that changes
// nothing reports nothing.
func TestReplace(t *testing.T) {
	tr := newIntTracker()
	if n := tr.Replace(map[string]int{"a": 1, "b": 1, "c": 1}); n != 3 {
		t.Fatalf("first list changed %d objects, want 3", n)
	}
	checkout(t, tr)
	if n := tr.Replace(map[string]int{"a": 1, "b": 1, "c": 1}); n != 0 || tr.Pending() != 0 {
		t.Fatalf("relist of the same objects: %d changed, pending %d", n, tr.Pending())
	}
	if n := tr.Replace(map[string]int{"a": 1, "b": 2, "d": 1}); n != 3 {
		t.Fatalf("relist changed %d objects, want 3 (b updated, c deleted, d added)", n)
	}
	got := checkout(t, tr)
	want := map[string]Change[int]{"b": {Value: 2}, "c": {Deleted: true}, "d": {Value: 1}}
	if !maps.Equal(got, want) {
		t.Fatalf("pending %+v, want %+v", got, want)
	}
	if all := tr.All(); len(all) != 3 || all["a"] != 1 || all["b"] != 2 || all["d"] != 1 {
		t.Errorf("current after relist: %v", all)
	}
}

// TestRevertAfterCheckout: an object set back, after a checkout, to the
// value it had before is pending: the sync loop was handed the other
// value, whether or not its sync succeeded (a failed sync's changes are
// programmed from what the sync loop holds). An object first changed after
// the checkout is pending too.
func TestRevertAfterCheckout(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	checkout(t, tr)
	tr.Set("a", 2)
	checkout(t, tr)
	tr.Set("a", 1)
	tr.Set("c", 1)
	got := checkout(t, tr)
	if len(got) != 2 || got["a"].Value != 1 || got["c"].Value != 1 {
		t.Fatalf("pending %+v, want a=1 and c=1", got)
	}
}

// TestCheckoutForgets: once every change is checked out, nothing is
// pending and the next change is measured against what was handed out.
func TestCheckoutForgets(t *testing.T) {
	tr := newIntTracker()
	for i := range 100 {
		tr.Set(string(rune('a'+i%26))+string(rune('a'+i/26)), i)
	}
	checkout(t, tr)
	if tr.Pending() != 0 {
		t.Fatalf("pending after everything was checked out: %d", tr.Pending())
	}
	tr.Set("aa", 0) // the value handed out
	tr.Set("ba", 7)
	if got := checkout(t, tr); len(got) != 1 || got["ba"].Value != 7 {
		t.Fatalf("pending %+v, want ba=7 only", got)
	}
}

// stampedValue is a value whose stamp is its own time (zero: none).
type stampedValue struct {
	v  int
	at time.Time
}

func newStampedTracker() *Tracker[string, stampedValue] {
	return NewStamped[string](func(a, b stampedValue) bool { return a == b },
		func(v stampedValue) time.Time { return v.at })
}

// TestStamps: a checkout hands out one stamp per update of an object,
// however many updates one object had before it (kube-proxy's programming
// latency has a sample for each), including updates that change nothing
// or set an object back to the value handed out, and one per object a
// relist changed; an update without a time has none, and a deletion drops
// the stamps of the object's updates not yet handed out.
func TestStamps(t *testing.T) {
	at := func(s int) time.Time { return time.Unix(int64(s), 0) }
	tr := newStampedTracker()
	// Two updates of a, then one that changes nothing, one of b without a
	// time.
	tr.Set("a", stampedValue{1, at(1)})
	tr.Set("a", stampedValue{2, at(2)})
	if !tr.Set("a", stampedValue{2, at(2)}) {
		t.Error("a stamped update that changes nothing reported nothing new")
	}
	if tr.Set("b", stampedValue{1, time.Time{}}); tr.Set("b", stampedValue{1, time.Time{}}) {
		t.Error("an unstamped update that changes nothing reported something new")
	}
	want := []time.Time{at(1), at(2), at(2)}
	if got := checkoutStamps(t, tr); !slices.Equal(got, want) {
		t.Fatalf("first checkout: stamps %v, want %v", got, want)
	}
	if got := checkoutStamps(t, tr); len(got) != 0 {
		t.Fatalf("stamps handed out twice: %v", got)
	}
	// a changed and set back: not pending, but both updates happened.
	tr.Set("a", stampedValue{3, at(3)})
	tr.Set("a", stampedValue{2, at(2)})
	if tr.Pending() != 0 {
		t.Fatalf("a set back to the value handed out is pending")
	}
	if got, want := checkoutStamps(t, tr), []time.Time{at(3), at(2)}; !slices.Equal(got, want) {
		t.Fatalf("after a change and back: stamps %v, want %v", got, want)
	}
	// c updated and then deleted: nothing of c is programmed.
	tr.Set("c", stampedValue{1, at(4)})
	tr.Delete("c")
	if got := checkoutStamps(t, tr); len(got) != 0 {
		t.Fatalf("a deleted object's stamps were handed out: %v", got)
	}
	// A relist: b updated, a unchanged, d added, and a deleted.
	tr.Set("a", stampedValue{5, at(5)})
	tr.Replace(map[string]stampedValue{"b": {2, at(6)}, "d": {1, at(7)}})
	got := checkoutStamps(t, tr)
	slices.SortFunc(got, time.Time.Compare)
	if want := []time.Time{at(6), at(7)}; !slices.Equal(got, want) {
		t.Fatalf("after a relist: stamps %v, want %v", got, want)
	}
}

// TestUnstampedTrackerHandsOutNone: a tracker made by New stamps nothing.
func TestUnstampedTrackerHandsOutNone(t *testing.T) {
	tr := New[string](func(a, b stampedValue) bool { return a == b })
	tr.Set("a", stampedValue{1, time.Unix(1, 0)})
	if got := checkoutStamps(t, tr); len(got) != 0 {
		t.Fatalf("stamps %v from a tracker without a stamp", got)
	}
}

// checkoutStamps checks tr's changes out and returns the stamps' times in
// the order handed out.
func checkoutStamps(t *testing.T, tr *Tracker[string, stampedValue]) []time.Time {
	t.Helper()
	_, stamps := tr.Checkout(func(string, Change[stampedValue]) {})
	var out []time.Time
	for _, s := range stamps {
		if s.At != s.Value.at {
			t.Errorf("stamp at %v with a value of %v", s.At, s.Value.at)
		}
		out = append(out, s.At)
	}
	return out
}

// TestGet: Get returns the latest value, whatever was checked out.
func TestGet(t *testing.T) {
	tr := newIntTracker()
	if _, ok := tr.Get("a"); ok {
		t.Fatal("a value before any was set")
	}
	tr.Set("a", 1)
	checkout(t, tr)
	tr.Set("a", 2)
	if v, ok := tr.Get("a"); !ok || v != 2 {
		t.Errorf("Get = %v, %v; want 2", v, ok)
	}
	tr.Delete("a")
	if _, ok := tr.Get("a"); ok {
		t.Error("a deleted object has a value")
	}
}
