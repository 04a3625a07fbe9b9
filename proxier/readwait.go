package proxier

import (
	"context"
	"errors"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/runner"
)

// Other processes on the node. A commit makes their reads of the ruleset
// start over, so the runner waits for them (Deps.Readers); and a process
// that owns nftproxy's table makes every transaction fail until its socket
// closes, which Deps.Readers sees too.

// ownerPoll is how often the sockets are listed while a process that owns
// the table is waited for: the first success follows its exit by at most
// this.
const ownerPoll = 200 * time.Millisecond

// waitedForReaders reports a sync that waited for other processes' reads
// (runner.Config.Waited).
func (p *Proxier) waitedForReaders(waited time.Duration, end runner.WaitEnd) {
	metrics.ReaderWaitSeconds.Observe(waited.Seconds())
	switch end {
	case runner.WaitCut:
		metrics.ReaderWaitsTotal.WithLabelValues(metrics.ReaderWaitTimedOut).Inc()
		klog.InfoS("Committing although other processes are still reading the ruleset: their reads start over",
			"waited", waited, "maxReaderWait", p.cfg.MaxReaderWait, "readers", p.deps.Readers.Describe())
	case runner.WaitRepair:
		metrics.ReaderWaitsTotal.WithLabelValues(metrics.ReaderWaitRepair).Inc()
		klog.V(2).InfoS("Repairing the tables without waiting any longer for other processes' reads of the ruleset",
			"waited", waited, "readers", p.deps.Readers.Describe())
	default:
		metrics.ReaderWaitsTotal.WithLabelValues(metrics.ReaderWaitEnded).Inc()
		klog.V(2).InfoS("Waited for other processes to read the ruleset before committing", "waited", waited,
			"readers", p.deps.Readers.Describe())
	}
}

// syncOrWatchOwner syncs; if the kernel refused because another process
// owns a table, it waits (in the background) for that process's socket to
// close, and then has the runner retry at once rather than at the end of
// its backoff.
func (p *Proxier) syncOrWatchOwner(ctx context.Context) error {
	err := p.sync(ctx)
	var owned *nft.TableOwnedError
	if err == nil || p.deps.Readers == nil || !errors.As(err, &owned) || owned.Owner == 0 {
		return err
	}
	p.mu.Lock()
	watching := p.ownerWatched
	p.ownerWatched = true
	p.mu.Unlock()
	if !watching {
		go p.watchOwner(ctx, owned)
	}
	return err
}

func (p *Proxier) watchOwner(ctx context.Context, owned *nft.TableOwnedError) {
	defer func() {
		p.mu.Lock()
		p.ownerWatched = false
		p.mu.Unlock()
	}()
	klog.InfoS("Another process owns the table; retrying as soon as it lets go", "ipFamily", owned.Family.IPFamily(),
		"owner", int32(owned.Owner))
	if p.deps.Readers.WaitGone(ctx, clock.RealClock{}, owned.Owner, ownerPoll) {
		klog.InfoS("The process that owned the table is gone; retrying now", "ipFamily", owned.Family.IPFamily())
		p.runner.RetryNow()
	}
}
