// Package runner drives a sync function: at most once per MinInterval, at
// least once per MaxInterval, as soon as allowed after a Trigger, and again
// after a failure with exponential backoff. Triggers that arrive while a sync
// runs are coalesced into one following sync.
package runner

import (
	"context"
	"time"
)

// Config tunes a Runner.
type Config struct {
	MinInterval time.Duration // shortest time between the starts of two syncs
	MaxInterval time.Duration // longest time without a sync (0: no periodic sync)
	// RetryMin and RetryMax bound the backoff after failures.
	RetryMin, RetryMax time.Duration
}

// Runner calls a sync function according to Config.
type Runner struct {
	cfg     Config
	sync    func(ctx context.Context) error
	trigger chan struct{}
	now     func() time.Time
}

// New returns a runner for sync.
func New(cfg Config, sync func(ctx context.Context) error) *Runner {
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 100 * time.Millisecond
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = 30 * time.Second
	}
	return &Runner{cfg: cfg, sync: sync, trigger: make(chan struct{}, 1), now: time.Now}
}

// Trigger asks for a sync as soon as MinInterval allows. It never blocks.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Run syncs once at start, then as triggered, until ctx is done.
func (r *Runner) Run(ctx context.Context) {
	var last time.Time
	backoff := time.Duration(0)
	pending := true // the first sync
	for {
		var wait time.Duration
		switch {
		case backoff > 0:
			wait = backoff
		case pending:
			wait = r.cfg.MinInterval - r.now().Sub(last)
		case r.cfg.MaxInterval > 0:
			wait = r.cfg.MaxInterval - r.now().Sub(last)
		default:
			wait = time.Hour
		}
		if wait < 0 {
			wait = 0
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-r.trigger:
			timer.Stop()
			pending = true
			continue
		case <-timer.C:
		}
		last = r.now()
		pending = false
		if err := r.sync(ctx); err != nil {
			if backoff == 0 {
				backoff = r.cfg.RetryMin
			} else if backoff *= 2; backoff > r.cfg.RetryMax {
				backoff = r.cfg.RetryMax
			}
			continue
		}
		backoff = 0
	}
}
