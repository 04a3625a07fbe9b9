package proxier

// syncMode is what a family's state knows of its table, and so what the
// family's next sync does. Every change of mode is made by next; the
// proxier only reports what happened (syncEvent).
//
//	event \ mode   unknown    rewriteNext  fromKernel   fromScratch  incremental
//	read           fromKernel -            -            -            fromKernel
//	notRead        fromScratch fromScratch -            -            fromScratch
//	committed      -          -            incremental  incremental  incremental
//	refused        -          -            rewriteNext  unknown      unknown
//
// "-" marks events that cannot happen in a mode (a full sync begins only
// in unknown, rewriteNext and incremental, and every sync it begins ends
// committed or refused); next leaves the mode as it is for them.
type syncMode uint8

const (
	// modeUnknown: nothing is known of the table (at start, and after the
	// kernel refused a transaction that was not diffed against a reading).
	// The next sync is full and reads the table back.
	modeUnknown syncMode = iota
	// modeRewriteNext: the kernel refused a transaction diffed against the
	// table read back, so that reading cannot be trusted. The next sync is
	// full and writes the table from scratch without reading it.
	modeRewriteNext
	// modeFromKernel: a full sync began from the table read back; its
	// transaction writes only what differs, so a restart with unchanged
	// state writes nothing and a repair keeps session affinity entries.
	modeFromKernel
	// modeFromScratch: a full sync began from an empty table (none in the
	// kernel, it could not be read, or a rewrite was due); its transaction
	// writes the whole table.
	modeFromScratch
	// modeIncremental: the editor holds what the kernel committed; a sync
	// sends only what changed. A full sync is due on FullSyncPeriod and
	// on a repair.
	modeIncremental
)

// syncEvent is what happened to a family's table.
type syncEvent uint8

const (
	// eventRead: a full sync began from the table read back.
	eventRead syncEvent = iota
	// eventNotRead: a full sync began from an empty table.
	eventNotRead
	// eventCommitted: the sync's transaction was applied (or was empty).
	eventCommitted
	// eventRefused: the kernel refused the sync's transaction.
	eventRefused
)

var modeNames = [...]string{modeUnknown: "unknown", modeRewriteNext: "rewriteNext", modeFromKernel: "fromKernel",
	modeFromScratch: "fromScratch", modeIncremental: "incremental"}

func (m syncMode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "invalid"
}

var eventNames = [...]string{eventRead: "read", eventNotRead: "notRead", eventCommitted: "committed", eventRefused: "refused"}

func (e syncEvent) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return "invalid"
}

// next returns the mode after event e in mode m.
func (m syncMode) next(e syncEvent) syncMode {
	begins := m == modeUnknown || m == modeRewriteNext || m == modeIncremental
	ends := m == modeFromKernel || m == modeFromScratch || m == modeIncremental
	switch {
	case e == eventRead && begins && m.readsTable():
		return modeFromKernel
	case e == eventNotRead && begins:
		return modeFromScratch
	case e == eventCommitted && ends:
		return modeIncremental
	case e == eventRefused && m == modeFromKernel:
		return modeRewriteNext
	case e == eventRefused && ends:
		return modeUnknown
	}
	return m
}

// knowsTable reports whether the state holds what the kernel has (or is
// about to have): when it does not, the next sync must be full.
func (m syncMode) knowsTable() bool { return m != modeUnknown && m != modeRewriteNext }

// fullSyncDue reports whether a sync in mode m is full: always when the
// table is not known, else when a repair or the periodic full sync is due.
func (m syncMode) fullSyncDue(repair, periodDue bool) bool {
	return !m.knowsTable() || repair || periodDue
}

// readsTable reports whether a full sync that begins in mode m reads the
// table back to diff against.
func (m syncMode) readsTable() bool { return m != modeRewriteNext }
