package runner

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestCoalescesBurstsAndRespectsMinInterval(t *testing.T) {
	var calls atomic.Int32
	r := New(Config{MinInterval: 200 * time.Millisecond}, func(context.Context) error { calls.Add(1); return nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	time.Sleep(50 * time.Millisecond) // first sync done
	for i := 0; i < 100; i++ {
		r.Trigger()
	}
	time.Sleep(100 * time.Millisecond)
	if n := calls.Load(); n != 1 {
		t.Fatalf("sync ran %d times within MinInterval, want 1", n)
	}
	time.Sleep(250 * time.Millisecond)
	if n := calls.Load(); n != 2 {
		t.Fatalf("burst of 100 triggers gave %d syncs after MinInterval, want 2 in all", n)
	}
}

func TestRetriesWithBackoff(t *testing.T) {
	var calls atomic.Int32
	r := New(Config{RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond},
		func(context.Context) error {
			if calls.Add(1) < 4 {
				return errors.New("kernel said no")
			}
			return nil
		})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r.Run(ctx)
	if n := calls.Load(); n != 4 {
		t.Fatalf("want 3 failures then 1 success and no more syncs, got %d calls", n)
	}
}

func TestPeriodicSync(t *testing.T) {
	var calls atomic.Int32
	r := New(Config{MaxInterval: 30 * time.Millisecond}, func(context.Context) error { calls.Add(1); return nil })
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r.Run(ctx)
	if n := calls.Load(); n < 3 {
		t.Fatalf("want periodic syncs every 30ms, got %d in 200ms", n)
	}
}
