package changes

import (
	"maps"
	"testing"
)

func newIntTracker() *Tracker[string, int] {
	return New[string, int](func(a, b int) bool { return a == b })
}

// checkout is tr's pending changes, checked out.
func checkout(t *testing.T, tr *Tracker[string, int]) map[string]Change[int] {
	t.Helper()
	got := map[string]Change[int]{}
	n := tr.Checkout(func(k string, c Change[int]) {
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
	if !tr.Replace(map[string]int{"a": 1, "b": 1, "c": 1}) {
		t.Fatal("first list reported no change")
	}
	checkout(t, tr)
	if tr.Replace(map[string]int{"a": 1, "b": 1, "c": 1}) || tr.Pending() != 0 {
		t.Fatalf("relist of the same objects: pending %d", tr.Pending())
	}
	if !tr.Replace(map[string]int{"a": 1, "b": 2, "d": 1}) {
		t.Fatal("relist with changes reported none")
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
