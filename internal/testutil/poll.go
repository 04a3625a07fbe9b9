package testutil

import (
	"testing"
	"time"
)

// Timeout is how long Poll and Eventually wait for a condition. It is
// generous: what a test waits for (a sync of the proxier, an informer's
// event, a goroutine reaching the fake clock) takes milliseconds, but the
// tests run with the race detector on two cores shared with other tests,
// where a wait of a few seconds once timed out. A failing test pays it once.
const Timeout = 10 * time.Second

// Interval is the pause between two looks at a condition.
const Interval = 10 * time.Millisecond

// Poll calls cond, then again every Interval, until it returns true or
// Timeout has passed, and reports whether it returned true. For a failure
// message that needs what cond saw last, keep it in a variable cond sets.
func Poll(cond func() bool) bool {
	for deadline := time.Now().Add(Timeout); ; time.Sleep(Interval) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// Eventually fails the test unless cond returns true within Timeout (see
// Poll); what names the awaited event in the failure.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !Poll(cond) {
		t.Fatalf("timed out after %v waiting for %s", Timeout, what)
	}
}
