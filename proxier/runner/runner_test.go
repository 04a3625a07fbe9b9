package runner

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

const ms = time.Millisecond

// every returns the times from `from` to `to` (inclusive), step apart.
func every(step, from, to time.Duration) []time.Duration {
	var out []time.Duration
	for t := from; t <= to; t += step {
		out = append(out, t)
	}
	return out
}

// world is what happens around a runner in a simulation: when triggers
// arrive, how long a sync takes and which syncs fail.
type world struct {
	triggers []time.Duration            // Trigger, sorted
	urgent   []time.Duration            // TriggerNow, sorted
	takes    time.Duration              // each sync's duration
	fails    func(n int) bool           // whether the n-th sync (from 1) fails
	failAt   func(t time.Duration) bool // or whether a sync started at t fails
	retries  []time.Duration            // RetryNow, sorted
	reading  func(t time.Duration) bool // whether another process reads at t (Readers)
	// readingSince, if set, is Readers: whether a read under way at since
	// still is at t.
	readingSince func(since, t time.Duration) bool
	until        time.Duration // syncs that would start later are not run
}

// readersFunc is a Readers answering with a function.
type readersFunc func(since, now time.Time) bool

func (f readersFunc) Reading(since, now time.Time) bool { return f(since, now) }

// simulate runs the schedule through w as Run would, and returns the start
// times of the syncs.
func simulate(cfg Config, w world) []time.Duration {
	if w.reading != nil {
		cfg.Readers = readersFunc(func(_, now time.Time) bool { return w.reading(now.Sub(epoch)) })
	}
	if w.readingSince != nil {
		cfg.Readers = readersFunc(func(since, now time.Time) bool { return w.readingSince(since.Sub(epoch), now.Sub(epoch)) })
	}
	s := schedule{cfg: cfg, pending: true}
	var starts []time.Duration
	t := time.Duration(0)
	// The events in time order; at the same time, triggers first.
	type source struct {
		at    []time.Duration
		event func()
	}
	sources := []*source{{w.triggers, s.triggered}, {w.urgent, s.triggeredNow},
		{w.retries, func() { s.retryNow = s.failures > 0 }}}
	// nextEvent returns the earliest event not later than by, and
	// consumes it.
	nextEvent := func(by time.Duration) (time.Duration, func(), bool) {
		var first *source
		for _, src := range sources {
			if len(src.at) > 0 && src.at[0] <= by && (first == nil || src.at[0] < first.at[0]) {
				first = src
			}
		}
		if first == nil {
			return 0, nil, false
		}
		at := first.at[0]
		first.at = first.at[1:]
		return at, first.event, true
	}
	for n := 1; ; n++ {
		var start time.Duration
		for {
			due, ok := s.next(epoch.Add(t))
			by := time.Duration(1<<62 - 1)
			if ok {
				by = max(t, due.Sub(epoch))
			}
			if at, event, ok := nextEvent(by); ok {
				t = max(t, at)
				event()
				continue
			}
			if !ok {
				return starts
			}
			if by <= w.until && s.waitsForReaders(epoch.Add(by)) {
				t = by
				continue
			}
			start = by
			break
		}
		if start > w.until {
			return starts
		}
		starts = append(starts, start)
		s.started(epoch.Add(start))
		t = start + w.takes
		var err error
		if (w.fails != nil && w.fails(n)) || (w.failAt != nil && w.failAt(start)) {
			err = errors.New("refused")
		}
		s.finished(epoch.Add(t), err)
	}
}

func TestSchedule(t *testing.T) {
	s := time.Second
	tests := []struct {
		name string
		cfg  Config
		w    world
		want []time.Duration
	}{
		{
			name: "first sync at once, then periodic",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s},
			w:    world{until: 100 * s},
			want: []time.Duration{0, 30 * s, 60 * s, 90 * s},
		},
		{
			name: "a burst of triggers makes one sync, MinInterval after the last",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s},
			w:    world{triggers: every(100*ms, 100*ms, 900*ms), until: 40 * s},
			want: []time.Duration{0, s, 31 * s},
		},
		{
			name: "a trigger during a sync makes one more, MinInterval after its end",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s},
			w:    world{triggers: []time.Duration{200 * ms}, takes: 500 * ms, until: 40 * s},
			want: []time.Duration{0, 1500 * ms, 32 * s},
		},
		{
			name: "MinInterval counts from the end of a sync",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s},
			w:    world{triggers: every(100*ms, 100*ms, 10*s), takes: 2 * s, until: 10 * s},
			want: []time.Duration{0, 3 * s, 6 * s, 9 * s},
		},
		{
			name: "MinInterval 0: every trigger syncs at once",
			cfg:  Config{MaxInterval: 30 * s},
			w:    world{triggers: []time.Duration{s, 2 * s, 2 * s}, until: 10 * s},
			want: []time.Duration{0, s, 2 * s},
		},
		{
			name: "no periodic sync: wait for a trigger",
			cfg:  Config{MinInterval: s},
			w:    world{triggers: []time.Duration{10 * s}, until: 100 * s},
			want: []time.Duration{0, 10 * s},
		},
		{
			// kubernetes-style churn while the kernel refuses: triggers every
			// 50 ms must neither postpone the retries nor hurry them.
			name: "retries keep their backoff whatever triggers arrive",
			cfg:  Config{MaxInterval: 30 * s, RetryMin: 100 * ms, RetryMax: s},
			w: world{triggers: every(50*ms, 50*ms, 1200*ms), until: 40 * s,
				fails: func(n int) bool { return n <= 4 }},
			want: []time.Duration{0, 100 * ms, 300 * ms, 700 * ms, 1500 * ms, 31500 * ms},
		},
		{
			name: "a retry still waits MinInterval",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s, RetryMin: 100 * ms},
			w:    world{until: 40 * s, fails: func(n int) bool { return n == 1 }},
			want: []time.Duration{0, s, 31 * s},
		},
		{
			name: "the backoff doubles up to RetryMax",
			cfg:  Config{MaxInterval: 60 * s, RetryMin: s, RetryMax: 4 * s},
			w:    world{until: 100 * s, fails: func(n int) bool { return n <= 6 }},
			want: []time.Duration{0, s, 3 * s, 7 * s, 11 * s, 15 * s, 19 * s, 79 * s},
		},
		{
			name: "a success resets the backoff",
			cfg:  Config{MaxInterval: 60 * s, RetryMin: s, RetryMax: 4 * s},
			w:    world{until: 70 * s, fails: func(n int) bool { return n == 1 || n == 2 || n == 4 }},
			want: []time.Duration{0, s, 3 * s, 63 * s, 64 * s},
		},
		{
			name: "the first success after an obstacle is gone is within one backoff step",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s, RetryMin: 100 * ms, RetryMax: 10 * s},
			w: world{triggers: every(50*ms, 50*ms, 20*s), until: 21 * s,
				failAt: func(t time.Duration) bool { return t < 12*s }},
			// 0, then retries 1 s (MinInterval), 2, 3, 4 (backoff 800 ms < 1 s),
			// 5.6 (1.6 s), 8.8 (3.2 s), 15.2 (6.4 s, after the obstacle went at
			// 12 s: succeeds), then the triggers: one sync per MinInterval.
			want: []time.Duration{0, s, 2 * s, 3 * s, 4 * s, 5600 * ms, 8800 * ms, 15200 * ms,
				16200 * ms, 17200 * ms, 18200 * ms, 19200 * ms, 20200 * ms},
		},
		{
			name: "TriggerNow syncs at once, at most once per MinInterval",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s},
			w:    world{urgent: []time.Duration{200 * ms, 500 * ms, 3 * s}, until: 40 * s},
			want: []time.Duration{0, 200 * ms, 1200 * ms, 3 * s, 33 * s},
		},
		{
			name: "TriggerNow does not wait for a pending trigger's MinInterval",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s},
			w: world{triggers: []time.Duration{100 * ms}, urgent: []time.Duration{300 * ms},
				until: 40 * s},
			want: []time.Duration{0, 300 * ms, 30300 * ms},
		},
		{
			name: "BusyShare: the wait after a sync is in proportion to its cost",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1},
			w:    world{triggers: every(5*ms, 5*ms, 300*ms), takes: 10 * ms, until: 10 * s},
			// Each sync takes 10 ms, so the next waits 90 ms: syncing
			// takes a tenth of the time.
			want: []time.Duration{0, 100 * ms, 200 * ms, 300 * ms},
		},
		{
			name: "BusyShare: a cheap sync lets the next change through almost at once",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1},
			w:    world{triggers: []time.Duration{50 * ms, 51 * ms}, takes: ms, until: 10 * s},
			want: []time.Duration{0, 50 * ms, 60 * ms},
		},
		{
			name: "BusyCap bounds the wait after a slow sync",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1, BusyCap: s},
			w:    world{triggers: []time.Duration{100 * ms}, takes: 500 * ms, until: 10 * s},
			want: []time.Duration{0, 1500 * ms},
		},
		{
			name: "a MinInterval set wins over BusyShare",
			cfg:  Config{MinInterval: s, MaxInterval: 30 * s, BusyShare: 0.1},
			w:    world{triggers: every(100*ms, 100*ms, 1500*ms), takes: 10 * ms, until: 10 * s},
			want: []time.Duration{0, 1010 * ms, 2020 * ms},
		},
		{
			name: "BusyShare: TriggerNow at most once per gap",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.5},
			w:    world{urgent: []time.Duration{100 * ms, 110 * ms}, takes: 20 * ms, until: 10 * s},
			// 100 ms ends at 120; the gap after a 20 ms sync is 20 ms.
			want: []time.Duration{0, 100 * ms, 140 * ms},
		},
		{
			name: "a change waits while another process reads, then goes",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1, MaxReaderWait: 10 * s},
			w: world{triggers: every(50*ms, 50*ms, 2*s), takes: ms, until: 10 * s,
				reading: func(t time.Duration) bool { return t >= 500*ms && t < 1200*ms }},
			// Looked at every 10 ms (ReaderPoll) from 500 ms: free at 1200.
			want: slices.Concat(every(50*ms, 0, 450*ms), []time.Duration{1200 * ms}, every(50*ms, 1250*ms, 2*s)),
		},
		{
			name: "a wait for readers ends at MaxReaderWait",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1, MaxReaderWait: s},
			w: world{triggers: every(50*ms, 50*ms, 3*s), takes: ms, until: 4 * s,
				reading: func(t time.Duration) bool { return t >= 500*ms }},
			want: slices.Concat(every(50*ms, 0, 450*ms), []time.Duration{1500 * ms, 2550 * ms, 3600 * ms}),
		},
		{
			name: "a change after a quiet spell goes at once, reader or not",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1, MaxReaderWait: s},
			w: world{triggers: []time.Duration{5 * s, 10 * s, 10100 * ms}, takes: ms, until: 12 * s,
				reading: func(time.Duration) bool { return true }},
			// 10.1 s follows 10 s: it waits, for MaxReaderWait.
			want: []time.Duration{0, 5 * s, 10 * s, 11100 * ms},
		},
		{
			name: "a repair does not wait for readers",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1, MaxReaderWait: 10 * s},
			w: world{urgent: []time.Duration{s, 1100 * ms}, takes: ms, until: 3 * s,
				reading: func(time.Duration) bool { return true }},
			want: []time.Duration{0, s, 1100 * ms},
		},
		{
			name: "a repair ends a wait under way",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1, MaxReaderWait: 10 * s},
			w: world{triggers: []time.Duration{s, 1100 * ms}, urgent: []time.Duration{1500 * ms}, takes: ms, until: 3 * s,
				reading: func(time.Duration) bool { return true }},
			// 1 s follows 0 by less than MaxReaderWait: it waits, until
			// the repair at 1.5 s.
			want: []time.Duration{0, 1500 * ms},
		},
		{
			name: "the first sync does not wait for readers",
			cfg:  Config{MaxInterval: 30 * s, MaxReaderWait: 10 * s},
			w:    world{until: 3 * s, reading: func(time.Duration) bool { return true }},
			want: []time.Duration{0},
		},
		{
			// Readers see since: a read that starts during a wait does not
			// hold it, a read under way when the next wait begins does.
			name: "each wait is for the reads under way when it began",
			cfg:  Config{MaxInterval: 30 * s, BusyShare: 0.1, MaxReaderWait: 10 * s},
			w: world{triggers: every(100*ms, 100*ms, 3*s), takes: ms, until: 3 * s,
				readingSince: func(since, t time.Duration) bool {
					// reader A from 500 to 1500; reader B from 1000 to 2000
					a := since >= 500*ms && since < 1500*ms && t < 1500*ms
					b := since >= 1000*ms && since < 2000*ms && t < 2000*ms
					return a || b
				}},
			// The wait from 500 ends with A at 1500 (B began during it);
			// the sync at 1600 waits for B until 2000.
			want: slices.Concat(every(100*ms, 0, 400*ms), []time.Duration{1500 * ms, 2000 * ms}, every(100*ms, 2100*ms, 3*s)),
		},
		{
			name: "a retry waits for readers too",
			cfg:  Config{MaxInterval: 30 * s, RetryMin: 100 * ms, MaxReaderWait: 10 * s},
			w: world{until: 40 * s, fails: func(n int) bool { return n == 1 },
				reading: func(t time.Duration) bool { return t >= 50*ms && t < 330*ms }},
			want: []time.Duration{0, 330 * ms, 30330 * ms},
		},
		{
			name: "RetryNow retries at once; a cause that stays is still backed off",
			cfg:  Config{MaxInterval: 30 * s, RetryMin: s, RetryMax: 30 * s},
			w: world{retries: []time.Duration{4500 * ms}, until: 20 * s,
				failAt: func(t time.Duration) bool { return t < 5*s }},
			// 0, 1, 3 fail; 4.5 at once (fails: the fourth, so 8 s), 12.5.
			want: []time.Duration{0, s, 3 * s, 4500 * ms, 12500 * ms},
		},
		{
			name: "RetryNow: the first success follows the obstacle's end",
			cfg:  Config{MaxInterval: 30 * s, RetryMin: s, RetryMax: 30 * s},
			w: world{retries: []time.Duration{4 * s}, until: 40 * s,
				failAt: func(t time.Duration) bool { return t < 4*s }},
			want: []time.Duration{0, s, 3 * s, 4 * s, 34 * s},
		},
		{
			name: "RetryNow without a failure changes nothing",
			cfg:  Config{MaxInterval: 30 * s},
			w:    world{retries: []time.Duration{2 * s}, until: 40 * s},
			want: []time.Duration{0, 30 * s},
		},
		{
			name: "TriggerNow does not hurry a retry",
			cfg:  Config{MaxInterval: 30 * s, RetryMin: s},
			w: world{urgent: []time.Duration{100 * ms}, until: 40 * s,
				fails: func(n int) bool { return n == 1 }},
			want: []time.Duration{0, s, 31 * s},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := New(tt.cfg, nil).sched.cfg // the defaults New applies
			if got := simulate(cfg, tt.w); !slices.Equal(got, tt.want) {
				t.Errorf("syncs started at\n %v\nwant\n %v", got, tt.want)
			}
		})
	}
}

// driver runs a Runner on a fake clock. The runner tells the test each time
// it waits (and for when); the test then moves time or triggers.
type driver struct {
	t       *testing.T
	clock   *clocktesting.FakeClock
	r       *Runner
	waits   chan time.Time
	synced  chan time.Time
	results chan error
	cancel  context.CancelFunc
	done    chan struct{}
}

func newDriver(t *testing.T, cfg Config) *driver {
	d := &driver{t: t, clock: clocktesting.NewFakeClock(epoch), waits: make(chan time.Time),
		synced: make(chan time.Time), results: make(chan error), done: make(chan struct{})}
	cfg.Clock = d.clock
	d.r = New(cfg, func(context.Context) error {
		d.synced <- d.clock.Now()
		return <-d.results
	})
	d.r.waiting = func(due time.Time) { d.waits <- due }
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() { d.r.Run(ctx); close(d.done) }()
	t.Cleanup(func() {
		cancel()
		go func() { // let a runner stuck reporting a wait see ctx
			for range d.waits {
			}
		}()
		<-d.done
	})
	return d
}

// waiting expects the runner to wait for a sync due at want (zero: none).
func (d *driver) waiting(want time.Time) {
	d.t.Helper()
	if due := <-d.waits; !due.Equal(want) {
		d.t.Fatalf("runner waits for a sync at %v, want %v", due.Sub(epoch), want.Sub(epoch))
	}
}

// syncs moves the clock to at, expects a sync to start then and ends it
// with err.
func (d *driver) syncs(at time.Time, err error) {
	d.t.Helper()
	d.clock.SetTime(at)
	if got := <-d.synced; !got.Equal(at) {
		d.t.Fatalf("sync at %v, want %v", got.Sub(epoch), at.Sub(epoch))
	}
	d.results <- err
}

func TestRunFollowsTheSchedule(t *testing.T) {
	d := newDriver(t, Config{MinInterval: time.Second, MaxInterval: 30 * time.Second})
	d.waiting(epoch)
	d.syncs(epoch, nil)

	d.waiting(epoch.Add(30 * time.Second)) // periodic
	d.r.Trigger()
	d.waiting(epoch.Add(time.Second)) // triggered: MinInterval after the end
	d.syncs(epoch.Add(time.Second), errors.New("refused"))

	d.waiting(epoch.Add(2 * time.Second)) // retry: max(RetryMin, MinInterval)
	d.r.Trigger()
	d.waiting(epoch.Add(2 * time.Second)) // a trigger does not move the retry
	d.syncs(epoch.Add(2*time.Second), nil)

	d.waiting(epoch.Add(32 * time.Second))
	d.cancel()
	<-d.done
}

func TestRunWithoutPeriodicSyncWaitsForATrigger(t *testing.T) {
	d := newDriver(t, Config{})
	d.waiting(epoch)
	d.syncs(epoch, nil)
	d.waiting(time.Time{})
	d.clock.Step(time.Hour)
	d.r.Trigger()
	d.waiting(epoch) // MinInterval (0) after the last sync ended: due already
	d.syncs(epoch.Add(time.Hour), nil)
	d.waiting(time.Time{})
}

// fakeReaders is a Readers the test sets; it records the since of every
// question.
type fakeReaders struct {
	mu      sync.Mutex
	reading bool
	since   []time.Duration
}

func (f *fakeReaders) Reading(since, _ time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.since = append(f.since, since.Sub(epoch))
	return f.reading
}

func (f *fakeReaders) set(reading bool) {
	f.mu.Lock()
	f.reading = reading
	f.mu.Unlock()
}

// asked returns the sinces asked about since the last call.
func (f *fakeReaders) asked() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.since
	f.since = nil
	return out
}

// waited is what Config.Waited was told.
type waited struct {
	took time.Duration
	end  WaitEnd
}

// TestRunWaitsForReaders drives Run's wait for readers on the fake clock:
// it looks again every ReaderPoll with the same since, lets the sync go
// when the reads end, cuts the wait at MaxReaderWait, and lets a repair
// through at once.
func TestRunWaitsForReaders(t *testing.T) {
	rd := &fakeReaders{reading: true}
	waits := make(chan waited, 10)
	d := newDriver(t, Config{MaxInterval: 30 * time.Second, MaxReaderWait: time.Second, ReaderPoll: 10 * ms,
		Readers: rd, Waited: func(took time.Duration, end WaitEnd) { waits <- waited{took, end} }})
	d.waiting(epoch)
	d.syncs(epoch, nil)
	if got := rd.asked(); len(got) != 0 {
		t.Fatalf("the first sync asked the readers (since %v)", got)
	}

	// A change 100 ms later waits; the runner looks every 10 ms.
	d.waiting(epoch.Add(30 * time.Second))
	d.r.Trigger()
	d.waiting(epoch)
	for _, at := range []time.Duration{100 * ms, 110 * ms, 120 * ms} {
		d.clock.SetTime(epoch.Add(at))
		d.waiting(epoch.Add(at + 10*ms))
	}
	rd.set(false)
	d.syncs(epoch.Add(130*ms), nil)
	if got, want := rd.asked(), []time.Duration{100 * ms, 100 * ms, 100 * ms, 100 * ms}; !slices.Equal(got, want) {
		t.Errorf("the wait asked about reads under way at %v, want %v", got, want)
	}
	if w := <-waits; w != (waited{30 * ms, WaitEnded}) {
		t.Errorf("Waited(%v, %v), want 30ms and WaitEnded", w.took, w.end)
	}

	// A reader that does not end: the wait is cut at MaxReaderWait.
	rd.set(true)
	d.waiting(epoch.Add(30130 * ms))
	d.r.Trigger()
	d.waiting(epoch.Add(130 * ms))
	at := 200 * ms
	d.clock.SetTime(epoch.Add(at))
	for at < 1200*ms {
		at += 10 * ms
		d.waiting(epoch.Add(at))
		if at < 1200*ms {
			d.clock.SetTime(epoch.Add(at))
		}
	}
	d.syncs(epoch.Add(1200*ms), nil)
	if w := <-waits; w != (waited{time.Second, WaitCut}) {
		t.Errorf("Waited(%v, %v), want 1s and WaitCut", w.took, w.end)
	}
	rd.asked()

	// A repair while a change waits: the sync goes at once.
	d.waiting(epoch.Add(31200 * ms))
	d.r.Trigger()
	d.waiting(epoch.Add(1200 * ms))
	d.clock.SetTime(epoch.Add(1300 * ms))
	d.waiting(epoch.Add(1310 * ms))
	d.r.TriggerNow()
	d.waiting(epoch.Add(1200 * ms)) // due since the last sync ended
	d.syncs(epoch.Add(1300*ms), nil)
	if w := <-waits; w != (waited{0, WaitRepair}) {
		t.Errorf("Waited(%v, %v), want 0s and WaitRepair", w.took, w.end)
	}
	if got := rd.asked(); !slices.Equal(got, []time.Duration{1300 * ms}) {
		t.Errorf("the repair asked the readers: since %v, want only the wait's first look", got)
	}
}
