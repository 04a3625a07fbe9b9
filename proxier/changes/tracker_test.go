package changes

import "testing"

func newIntTracker() *Tracker[string, int] {
	return New[string, int](func(a, b int) bool { return a == b })
}

func TestNoOpChangesAreNotPending(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	s := tr.Checkout()
	tr.Applied(s)
	if tr.Pending() != 0 {
		t.Fatalf("pending after applied: %d", tr.Pending())
	}
	tr.Set("a", 2)
	tr.Set("a", 1) // back to the applied value
	if tr.Pending() != 0 {
		t.Errorf("update back to applied value is pending")
	}
	tr.Set("b", 1)
	tr.Delete("b") // never applied
	if tr.Pending() != 0 {
		t.Errorf("add then delete is pending")
	}
}

func TestFailedSyncKeepsChanges(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	_ = tr.Checkout() // the sync fails: Applied is not called
	s := tr.Checkout()
	if _, ok := s.Changed["a"]; !ok || tr.Pending() != 1 {
		t.Fatalf("change lost after failed sync: %+v", s)
	}
}

func TestChangesDuringSyncStayPending(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	tr.Set("b", 1)
	s := tr.Checkout()
	tr.Set("a", 2) // arrives while the sync runs
	tr.Delete("b")
	tr.Applied(s)
	got := tr.Checkout()
	if len(got.Changed) != 2 || got.Changed["a"].Value != 2 || !got.Changed["b"].Deleted {
		t.Fatalf("want a=2 and b deleted pending, got %+v", got.Changed)
	}
}

// TestReplace: a relist records what changed, adds and deletes; objects
// it leaves as they are stay applied, and a relist that changes nothing
// reports nothing.
func TestReplace(t *testing.T) {
	tr := newIntTracker()
	if !tr.Replace(map[string]int{"a": 1, "b": 1, "c": 1}) {
		t.Fatal("first list reported no change")
	}
	tr.Applied(tr.Checkout())
	if tr.Replace(map[string]int{"a": 1, "b": 1, "c": 1}) || tr.Pending() != 0 {
		t.Fatalf("relist of the same objects: pending %d", tr.Pending())
	}
	if !tr.Replace(map[string]int{"a": 1, "b": 2, "d": 1}) {
		t.Fatal("relist with changes reported none")
	}
	got := tr.Checkout().Changed
	want := map[string]Change[int]{"b": {Value: 2}, "c": {Deleted: true}, "d": {Value: 1}}
	if len(got) != len(want) {
		t.Fatalf("pending %+v, want %+v", got, want)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: pending %+v, want %+v", k, got[k], w)
		}
	}
	if all := tr.All(); len(all) != 3 || all["a"] != 1 || all["b"] != 2 || all["d"] != 1 {
		t.Errorf("current after relist: %v", all)
	}
}

// TestRevertDuringSync: an object set back, while a sync runs, to the
// value applied before that sync is pending once the sync has applied the
// value it checked out; an object first changed during the sync stays
// pending too.
func TestRevertDuringSync(t *testing.T) {
	tr := newIntTracker()
	tr.Set("a", 1)
	tr.Applied(tr.Checkout())
	tr.Set("a", 2)
	s := tr.Checkout()
	tr.Set("a", 1) // what is applied until s is
	tr.Set("c", 1)
	if tr.Pending() != 1 {
		t.Fatalf("pending during the sync: %d, want 1 (c)", tr.Pending())
	}
	tr.Applied(s)
	got := tr.Checkout().Changed
	if len(got) != 2 || got["a"].Value != 1 || got["c"].Value != 1 {
		t.Fatalf("pending after the sync: %+v, want a=1 and c=1", got)
	}
}

// TestAppliedForgetsWhatItApplied: once every pending change is applied,
// nothing is pending and the next change is measured against it.
func TestAppliedForgetsWhatItApplied(t *testing.T) {
	tr := newIntTracker()
	for i := range 100 {
		tr.Set(string(rune('a'+i%26))+string(rune('a'+i/26)), i)
	}
	tr.Applied(tr.Checkout())
	if tr.Pending() != 0 {
		t.Fatalf("pending after everything was applied: %d", tr.Pending())
	}
	tr.Set("aa", 0) // the applied value
	tr.Set("ba", 7)
	if got := tr.Checkout().Changed; len(got) != 1 || got["ba"].Value != 7 {
		t.Fatalf("pending %+v, want ba=7 only", got)
	}
}
