package proxier

import "testing"

// TestSyncModeNext covers every transition of syncMode.next, including
// the events a mode cannot see (which leave it as it is).
func TestSyncModeNext(t *testing.T) {
	modes := []syncMode{modeUnknown, modeRewriteNext, modeFromKernel, modeFromScratch, modeIncremental}
	events := []syncEvent{eventRead, eventNotRead, eventCommitted, eventRefused}
	want := map[syncMode]map[syncEvent]syncMode{
		// At start a full sync reads the table back; if none can be read,
		// it writes it whole.
		modeUnknown: {eventRead: modeFromKernel, eventNotRead: modeFromScratch},
		// After a refused transaction diffed against a reading, the table
		// is rewritten without reading it (a read is refused: see
		// readsTable, the mode stays).
		modeRewriteNext: {eventNotRead: modeFromScratch},
		// A sync from the table read back: committed, the state is
		// incremental; refused, the reading is not to be trusted.
		modeFromKernel: {eventCommitted: modeIncremental, eventRefused: modeRewriteNext},
		// A sync from scratch: refused, the next one reads again.
		modeFromScratch: {eventCommitted: modeIncremental, eventRefused: modeUnknown},
		// Incremental: a full sync (period, repair) reads the table back;
		// a refused transaction forgets the state.
		modeIncremental: {eventRead: modeFromKernel, eventNotRead: modeFromScratch,
			eventCommitted: modeIncremental, eventRefused: modeUnknown},
	}
	for _, m := range modes {
		for _, e := range events {
			w, ok := want[m][e]
			if !ok {
				w = m // cannot happen in m: unchanged
			}
			if got := m.next(e); got != w {
				t.Errorf("%v.next(%v) = %v, want %v", m, e, got, w)
			}
		}
	}
}

// TestSyncModeFullSync checks which modes make the next sync full and
// which full syncs read the table back.
func TestSyncModeFullSync(t *testing.T) {
	for _, tc := range []struct {
		mode              syncMode
		repair, periodDue bool
		full, reads       bool
	}{
		{mode: modeUnknown, full: true, reads: true},
		{mode: modeRewriteNext, full: true, reads: false},
		{mode: modeIncremental, full: false, reads: true},
		{mode: modeIncremental, repair: true, full: true, reads: true},
		{mode: modeIncremental, periodDue: true, full: true, reads: true},
	} {
		if got := tc.mode.fullSyncDue(tc.repair, tc.periodDue); got != tc.full {
			t.Errorf("%v.fullSyncDue(repair %v, periodDue %v) = %v, want %v", tc.mode, tc.repair, tc.periodDue, got, tc.full)
		}
		if got := tc.mode.readsTable(); got != tc.reads {
			t.Errorf("%v.readsTable() = %v, want %v", tc.mode, got, tc.reads)
		}
	}
}

// TestSyncModeLifecycles walks the mode through what a family lives
// through: start, restart, a refused transaction, a load failure and a
// repair of a tampered table.
func TestSyncModeLifecycles(t *testing.T) {
	type step struct {
		event syncEvent
		want  syncMode
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"start with a table to adopt", []step{{eventRead, modeFromKernel}, {eventCommitted, modeIncremental}}},
		{"start without a table", []step{{eventNotRead, modeFromScratch}, {eventCommitted, modeIncremental}}},
		{"load failure, then refused", []step{{eventNotRead, modeFromScratch}, {eventRefused, modeUnknown},
			{eventRead, modeFromKernel}, {eventCommitted, modeIncremental}}},
		{"incremental transaction refused", []step{{eventRead, modeFromKernel}, {eventCommitted, modeIncremental},
			{eventRefused, modeUnknown}, {eventRead, modeFromKernel}}},
		{"repair refused, then rewritten", []step{{eventRead, modeFromKernel}, {eventCommitted, modeIncremental},
			{eventRead, modeFromKernel}, {eventRefused, modeRewriteNext}, {eventNotRead, modeFromScratch},
			{eventCommitted, modeIncremental}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A restart is a new state: its zero mode knows nothing and
			// reads the table back.
			var fs familyState
			if fs.mode != modeUnknown || !fs.mode.fullSyncDue(false, false) || !fs.mode.readsTable() {
				t.Fatalf("a new family's mode %v: want unknown, a full sync that reads the table", fs.mode)
			}
			for i, s := range tc.steps {
				if fs.mode = fs.mode.next(s.event); fs.mode != s.want {
					t.Fatalf("step %d (%v): mode %v, want %v", i, s.event, fs.mode, s.want)
				}
			}
		})
	}
}
