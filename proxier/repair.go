package proxier

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftnl"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// Repairs. When another process commits a change to one of our tables (the
// Monitor reports it), that family's next sync is a full one: the table is
// read back, diffed against what nftproxy wants there, and the difference
// is applied in one transaction. The sync is asked for at once
// (Runner.TriggerNow), so a tampered table is repaired before the next
// minimum sync interval is over.

// Monitor reports commits other processes make to the tables (nftnl.Monitor).
type Monitor interface {
	Run(ctx context.Context, report func(nftnl.Commit)) error
	// Pause and Committed: see nftnl.Monitor.
	Pause() (resume func())
	Committed(gen uint32)
}

// pauseMonitorChanges is the size of a transaction (objects changed) from
// which the monitor is paused while it commits: with a listener, the kernel
// builds a notification per object changed.
const pauseMonitorChanges = 1000

// lostKind is the repair kind of a check after notifications were lost.
const lostKind = "unknown"

// repairKinds are every kind label of nftproxy_repairs_total: the kinds
// of object a change names, and lostKind.
func repairKinds() []string {
	out := []string{lostKind}
	for _, k := range nftnl.ObjectKinds {
		out = append(out, string(k))
	}
	return out
}

// repair is why a family's table is to be checked against the kernel.
type repair struct {
	reported time.Time       // the first report
	kinds    map[string]bool // kinds of the objects changed, or lostKind
}

// foreignCommit handles a report of the Monitor.
func (p *Proxier) foreignCommit(c nftnl.Commit) {
	families := c.Families()
	if c.Lost {
		families = slices.Collect(maps.Keys(p.deps.NFT))
		klog.InfoS("Notifications of nftables changes were lost; checking the tables against the kernel")
	} else {
		klog.InfoS("Another process changed nftproxy's table; repairing it", "process", c.Process, "pid", c.PID,
			"changes", describeChanges(c.Changes))
	}
	now := time.Now()
	p.mu.Lock()
	for _, f := range families {
		if _, ours := p.deps.NFT[f]; !ours {
			continue
		}
		r := p.repairs[f]
		if r == nil {
			r = &repair{reported: now, kinds: map[string]bool{}}
			p.repairs[f] = r
		}
		if c.Lost {
			r.kinds[lostKind] = true
		}
		for _, ch := range c.Changes {
			if ch.Family == f {
				r.kinds[string(ch.Kind)] = true
			}
		}
	}
	p.mu.Unlock()
	p.runner.TriggerNow()
	// The change may have removed what made the last sync fail (the
	// owner of the table deleted it): no need to wait out the backoff.
	p.runner.RetryNow()
}

// describeChanges lists at most a few changes, for a log line.
func describeChanges(changes []nftnl.Change) []string {
	const most = 8
	var out []string
	for i, ch := range changes {
		if i == most {
			out = append(out, fmt.Sprintf("and %d more", len(changes)-most))
			break
		}
		out = append(out, ch.String())
	}
	return out
}

// takeRepair returns and forgets the pending repair of family f.
func (p *Proxier) takeRepair(f nft.Family) *repair {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.repairs[f]
	delete(p.repairs, f)
	return r
}

// requeueRepair puts back a repair whose sync failed, merged with any
// reported since.
func (p *Proxier) requeueRepair(f nft.Family, r *repair) {
	if r == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if newer := p.repairs[f]; newer != nil {
		maps.Copy(r.kinds, newer.kinds)
	}
	p.repairs[f] = r
}

// repaired records a successful repair.
func repaired(f nft.Family, r *repair, ops int) {
	fam := f.IPFamily()
	for kind := range r.kinds {
		metrics.RepairsTotal.WithLabelValues(fam, kind).Inc()
	}
	klog.InfoS("Repaired the table", "ipFamily", fam, "kinds", slices.Sorted(maps.Keys(r.kinds)),
		"ops", ops, "sinceReported", time.Since(r.reported))
}

// pauseMonitor pauses the monitor for a large transaction; the returned
// function resumes it.
func (p *Proxier) pauseMonitor(tx *nft.Transaction) (resume func()) {
	if p.deps.Monitor == nil || tx.Changes() < pauseMonitorChanges {
		return func() {}
	}
	return p.deps.Monitor.Pause()
}

// committed tells the monitor about a transaction of ours that backend
// committed, with the generation it made.
func (p *Proxier) committed(backend nft.Backend) {
	if p.deps.Monitor != nil {
		p.deps.Monitor.Committed(backend.LastCommit().GenID)
	}
}

// logOwnership says once whether family f's table is owned, and if not
// though it was asked for, why; it returns whether it logged.
func logOwnership(f nft.Family, backend nft.Backend) bool {
	switch owning, err := backend.Owning(); {
	case owning:
		klog.InfoS("The table is owned by nftproxy: no other process can change it", "ipFamily", f.IPFamily())
	case err != nil:
		klog.InfoS("The table is not owned: the kernel cannot keep an owned table after nftproxy exits",
			"ipFamily", f.IPFamily(), "err", err)
	}
	return true
}

// watchTables runs the monitor until ctx is done.
func (p *Proxier) watchTables(ctx context.Context) {
	if p.deps.Monitor == nil {
		return
	}
	if err := p.deps.Monitor.Run(ctx, p.foreignCommit); err != nil {
		klog.ErrorS(err, "Stopped watching for nftables changes by other processes; only the periodic full sync finds them")
	}
}
