package testutil

import "testing"

func TestPollReturnsOnceTrue(t *testing.T) {
	calls := 0
	if !Poll(func() bool { calls++; return calls == 3 }) {
		t.Fatal("Poll = false, want true")
	}
	if calls != 3 {
		t.Errorf("cond called %d times, want 3 (until it holds, then no more)", calls)
	}
}

func TestEventuallyAtOnce(t *testing.T) {
	Eventually(t, "a condition that holds", func() bool { return true })
}
