// Package runner decides when the proxier syncs, and calls it then.
//
// The decision is a pure function of what happened so far (schedule): the
// end of the last sync, whether it failed and how often in a row, and
// whether a change is waiting. It is computed again after every event, so
// no event can postpone what another one scheduled: a Trigger asks for a
// sync MinInterval after the last one ended, a failure for a retry one
// backoff step after it, and neither moves the other (a retry is never
// pushed back by triggers arriving faster than the backoff).
//
// The rules are upstream's (pkg/proxy/runner/bounded_frequency_runner.go):
// at least MinInterval from the end of one sync to the start of the next, so
// that syncs never come in bursts; at most MaxInterval; after a failure a
// retry, here with exponential backoff from RetryMin to RetryMax, that any
// success cancels.
//
// One rule is ours: without a MinInterval, a BusyShare spaces syncs by what
// they cost. Upstream's fixed interval exists because its syncs are slow; a
// sync that costs a millisecond would make every change wait the interval
// for nothing, while under a storm of changes syncing at once would spend
// the node's CPU on syncs. Waiting in proportion to the last sync's cost
// bounds the share of time spent syncing and keeps the wait as short as
// that bound allows.
//
// Another is ours too: a sync waits for other processes' reads of the
// ruleset. Every commit makes a dump under way start over, so commits at
// the pace of a stream of changes would keep `nft list ruleset` (and every
// other reader) from ever finishing. A sync that follows the last one by
// less than MaxReaderWait waits while Readers says a read that was under
// way when the wait began still is, looking again every ReaderPoll, for at
// most MaxReaderWait (Readers itself bounds what one read may hold:
// proxier/readers). Three syncs never wait: the first, a repair
// (TriggerNow: a table someone deleted or changed is an outage, a listing
// is not), and a change after a quiet spell (the last sync started
// MaxReaderWait ago or more): one commit costs a reader one new start, not
// its end. A repair asked for while a sync waits ends the wait.
//
// Last, a failed sync is retried at once, whatever its backoff, when
// RetryNow says that what made it fail may be gone (the process that owned
// the table exited); if it fails again, the backoff goes on where it was.
package runner

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Config tunes a Runner.
type Config struct {
	// MinInterval is the least time from the end of a sync to the start of
	// the next (0: a trigger syncs at once).
	MinInterval time.Duration
	// BusyShare, when MinInterval is zero and BusyShare is above zero,
	// makes the least time from the end of a sync to the start of the next
	// the sync's duration × (1 − BusyShare) / BusyShare, at most BusyCap:
	// syncs take at most about BusyShare of the time, however fast
	// changes arrive.
	BusyShare float64
	// BusyCap bounds the wait BusyShare asks for, so that one slow sync
	// (a full rewrite) does not hold the next change back for long; zero
	// means defaultBusyCap.
	BusyCap time.Duration
	// MaxInterval is the most time from the end of a sync to the start of
	// the next, triggered or not (0: no periodic sync).
	MaxInterval time.Duration
	// RetryMin and RetryMax bound the backoff after failures: the first
	// retry comes RetryMin after the failed sync ended, each further one
	// twice as late, at most RetryMax.
	RetryMin, RetryMax time.Duration
	// Readers, if set, tells whether another process is reading the
	// ruleset; MaxReaderWait bounds how long a sync waits for it (0: it
	// does not wait).
	Readers       Readers
	MaxReaderWait time.Duration
	// ReaderPoll is how often a waiting sync asks Readers again; zero
	// means defaultReaderPoll.
	ReaderPoll time.Duration
	// Waited, if set, is called when a sync that waited for readers
	// starts, with how long it waited and how the wait ended.
	Waited func(waited time.Duration, end WaitEnd)
	// Clock is the time source; nil means the real clock.
	Clock clock.Clock
}

// Readers tells whether another process is reading the ruleset
// (readers.Gate): whether a read that was under way at since, when the
// wait began, still is at now.
type Readers interface {
	Reading(since, now time.Time) bool
}

// WaitEnd is how a wait for readers ended.
type WaitEnd int

const (
	// WaitEnded: the reads it waited for ended, or stopped holding
	// commits.
	WaitEnded WaitEnd = iota
	// WaitCut: it reached MaxReaderWait.
	WaitCut
	// WaitRepair: a repair (TriggerNow) ended it.
	WaitRepair
)

// Defaults for Config fields left zero.
const (
	defaultRetryMin = 100 * time.Millisecond
	defaultRetryMax = 30 * time.Second
	// defaultBusyCap is upstream's default MinInterval: BusyShare never
	// makes a change wait longer than kube-proxy would.
	defaultBusyCap = time.Second
	// defaultReaderPoll: a reader's dump lasts a few milliseconds or more,
	// and a look costs the kernel microseconds.
	defaultReaderPoll = 10 * time.Millisecond
)

// Runner calls a sync function according to Config.
type Runner struct {
	clock   clock.Clock
	sync    func(ctx context.Context) error
	trigger chan struct{}
	urgent  chan struct{}
	retry   chan struct{}
	sched   schedule
	// waiting, if set (tests), is called each time the loop starts to wait,
	// with the time the next sync is due (zero: none is).
	waiting func(due time.Time)
}

// New returns a runner for sync. It syncs once as soon as Run starts.
func New(cfg Config, sync func(ctx context.Context) error) *Runner {
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = defaultRetryMin
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(defaultRetryMax, cfg.RetryMin)
	}
	if cfg.BusyCap <= 0 {
		cfg.BusyCap = defaultBusyCap
	}
	if cfg.ReaderPoll <= 0 {
		cfg.ReaderPoll = defaultReaderPoll
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Runner{clock: cfg.Clock, sync: sync, trigger: make(chan struct{}, 1), urgent: make(chan struct{}, 1),
		retry: make(chan struct{}, 1), sched: schedule{cfg: cfg, pending: true}}
}

// Trigger asks for a sync as soon as MinInterval allows. It never blocks;
// triggers that arrive before the sync starts make one sync.
func (r *Runner) Trigger() { r.send(r.trigger) }

// TriggerNow asks for a sync at once, MinInterval or not (a repair of a
// table someone else changed), but no more often than one per MinInterval,
// and not before a retry is due; it does not wait for readers, and ends a
// wait under way. It never blocks.
func (r *Runner) TriggerNow() { r.send(r.urgent) }

// RetryNow says that what made the last sync fail may be gone: if it
// failed, the retry comes at once instead of at the end of its backoff.
// It never blocks.
func (r *Runner) RetryNow() { r.send(r.retry) }

func (r *Runner) send(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Run syncs when the schedule says, until ctx is done.
func (r *Runner) Run(ctx context.Context) {
	for {
		now := r.clock.Now()
		due, ok := r.sched.next(now)
		var timer clock.Timer
		var fire <-chan time.Time
		if ok {
			timer = r.clock.NewTimer(max(due.Sub(now), 0))
			fire = timer.C()
		}
		if r.waiting != nil {
			r.waiting(due)
		}
		select {
		case <-ctx.Done():
			stop(timer)
			return
		case <-r.trigger:
			stop(timer)
			r.sched.triggered()
			continue
		case <-r.urgent:
			stop(timer)
			r.sched.triggeredNow()
			continue
		case <-r.retry:
			stop(timer)
			r.sched.retryNow = r.sched.failures > 0
			continue
		case <-fire:
		}
		if r.sched.waitsForReaders(r.clock.Now()) {
			continue
		}
		r.sched.started(r.clock.Now())
		err := r.sync(ctx)
		r.sched.finished(r.clock.Now(), err)
	}
}

func stop(t clock.Timer) {
	if t != nil {
		t.Stop()
	}
}

// schedule is what the runner knows, and when it syncs next.
type schedule struct {
	cfg       Config
	lastEnd   time.Time // end of the last sync; zero before the first
	pending   bool      // a sync was asked for since the last one started
	urgent    bool      // ... at once (TriggerNow)
	failures  int       // failed syncs in a row
	lastStart time.Time // start of the last sync
	// lastUrgent is when the last sync asked for at once started.
	lastUrgent time.Time
	// retryNow: the failed sync is to be retried at once (RetryNow).
	retryNow bool
	// waitStart is when the due sync began to wait for readers (zero: it
	// does not wait), and recheck when it asks again.
	waitStart, recheck time.Time
}

// next returns when the next sync is due, now or later; false means none
// is (nothing pending, no periodic sync).
func (s *schedule) next(now time.Time) (time.Time, bool) {
	if s.lastEnd.IsZero() {
		return now, true // the first sync, at once
	}
	if s.failures > 0 {
		due := s.lastEnd.Add(max(s.backoff(), s.minGap()))
		if s.retryNow {
			due = s.lastEnd.Add(s.minGap())
		}
		return s.afterRecheck(due), true
	}
	var due time.Time
	earliest := func(t time.Time) {
		if due.IsZero() || t.Before(due) {
			due = t
		}
	}
	if s.urgent {
		earliest(latest(s.lastEnd.Add(s.busyGap()), s.lastUrgent.Add(s.cfg.MinInterval)))
	}
	if s.pending {
		earliest(s.afterRecheck(s.lastEnd.Add(s.minGap())))
	}
	if s.cfg.MaxInterval > 0 {
		earliest(s.afterRecheck(s.lastEnd.Add(s.cfg.MaxInterval)))
	}
	return due, !due.IsZero()
}

// afterRecheck moves a sync due at due to the next look at the readers
// it waits for, if any. A repair does not wait.
func (s *schedule) afterRecheck(due time.Time) time.Time {
	if s.urgent {
		return due
	}
	return latest(due, s.recheck)
}

// waitsForReaders reports whether the sync due at now waits for readers;
// if so, recheck is when to ask again. A wait starts only if the last sync
// started less than MaxReaderWait ago and the sync is not a repair, and
// ends at most MaxReaderWait after it started.
func (s *schedule) waitsForReaders(now time.Time) bool {
	if s.cfg.Readers == nil || s.cfg.MaxReaderWait <= 0 || s.urgent {
		return false
	}
	if s.waitStart.IsZero() && (s.lastStart.IsZero() || now.Sub(s.lastStart) >= s.cfg.MaxReaderWait) {
		return false // a change after a quiet spell
	}
	end := s.waitStart.Add(s.cfg.MaxReaderWait)
	if !s.waitStart.IsZero() && !now.Before(end) {
		return false // cut
	}
	since := s.waitStart
	if since.IsZero() {
		since = now
	}
	if !s.cfg.Readers.Reading(since, now) {
		return false
	}
	if s.waitStart.IsZero() {
		s.waitStart, end = now, now.Add(s.cfg.MaxReaderWait)
	}
	s.recheck = earliestOf(now.Add(s.cfg.ReaderPoll), end)
	return true
}

func earliestOf(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// minGap is the least time from the end of the last sync to the start of
// the next: MinInterval, or what BusyShare allows after the last sync.
func (s *schedule) minGap() time.Duration {
	return max(s.cfg.MinInterval, s.busyGap())
}

// busyGap is the wait BusyShare asks for after the last sync; zero when a
// MinInterval is set or BusyShare is not.
func (s *schedule) busyGap() time.Duration {
	if s.cfg.MinInterval > 0 || s.cfg.BusyShare <= 0 || s.lastEnd.IsZero() {
		return 0
	}
	took := s.lastEnd.Sub(s.lastStart)
	gap := time.Duration(float64(took) * (1 - s.cfg.BusyShare) / s.cfg.BusyShare)
	return min(gap, s.cfg.BusyCap)
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// backoff is the wait before the retry of the failures-th failure in a row.
func (s *schedule) backoff() time.Duration {
	d := s.cfg.RetryMin
	for i := 1; i < s.failures && d < s.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, s.cfg.RetryMax)
}

func (s *schedule) triggered()    { s.pending = true }
func (s *schedule) triggeredNow() { s.urgent = true }

// started: the sync about to run, at now, covers everything asked for so
// far.
func (s *schedule) started(now time.Time) {
	s.lastStart = now
	if !s.waitStart.IsZero() && s.cfg.Waited != nil {
		waited, end := now.Sub(s.waitStart), WaitEnded
		switch {
		case s.urgent:
			end = WaitRepair
		case waited >= s.cfg.MaxReaderWait:
			end = WaitCut
		}
		s.cfg.Waited(waited, end)
	}
	if s.urgent {
		s.lastUrgent = now
	}
	s.pending, s.urgent, s.retryNow = false, false, false
	s.waitStart, s.recheck = time.Time{}, time.Time{}
}

func (s *schedule) finished(end time.Time, err error) {
	s.lastEnd = end
	if err != nil {
		s.failures++
	} else {
		s.failures = 0
	}
}
