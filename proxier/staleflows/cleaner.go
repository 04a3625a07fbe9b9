package staleflows

import (
	"context"
	"net/netip"
	"sync"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/nft"
)

// Cleaner runs the jobs of the syncs, one at a time, in a goroutine of its
// own (Run). Jobs that pile up while one runs are merged, per family, into
// one: the frontends any of them had before (a frontend that came and went
// between two cleanups is still looked for) and each Service's frontends
// as of its latest sync.
//
// The cleanup runs outside the sync loop because a dump of a large
// conntrack table is slow, and a change to another Service must not wait
// for it. Deleting flows late is safe: until then, a stale flow keeps
// sending to its old endpoint, which is what it did before the sync too.
type Cleaner struct {
	conntrack conntrack.Interface
	wake      chan struct{}

	mu         sync.Mutex
	pending    map[nft.Family]*Job
	committing map[nft.Family]*Job // of a sync between its Apply and its Enqueue
	running    bool                // a job is under way (Idle)
}

// New returns a Cleaner that deletes flows through ct.
func New(ct conntrack.Interface) *Cleaner {
	return &Cleaner{conntrack: ct, wake: make(chan struct{}, 1), pending: map[nft.Family]*Job{},
		committing: map[nft.Family]*Job{}}
}

// Enqueue queues job j of family f, merged into the one queued, if any;
// isNodePortAddr tells the addresses NodePorts answer on as of the sync.
// j is the Cleaner's from then on.
func (c *Cleaner) Enqueue(f nft.Family, j *Job, isNodePortAddr func(netip.Addr) bool) {
	j.isNodePortAddr = isNodePortAddr
	c.mu.Lock()
	delete(c.committing, f)
	if q := c.pending[f]; q == nil {
		c.pending[f] = j
	} else {
		q.merge(j)
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Committing records, before family f's sync applies its transaction, the
// frontends its rules will have (j), or forgets them (nil: the transaction
// failed); Enqueue forgets them too. A flow those rules make may be dumped
// by a job that runs before the sync enqueues its own: that job judges it
// by them, not as stale. The sync does not change j from then on.
func (c *Cleaner) Committing(f nft.Family, j *Job) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if j == nil {
		delete(c.committing, f)
	} else {
		c.committing[f] = j
	}
}

// Run runs the jobs until ctx is done.
func (c *Cleaner) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		c.mu.Lock()
		work := c.pending
		c.pending = map[nft.Family]*Job{}
		c.running = len(work) > 0
		c.mu.Unlock()
		for f, j := range work {
			c.clean(ctx, f, j)
		}
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}
}

// Handed reports whether every sync that announced its frontends
// (Committing) has since enqueued its job or withdrawn them: a sync whose
// rules are seen in the kernel may not have handed its job over yet.
func (c *Cleaner) Handed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.committing) == 0
}

// Idle reports whether no job is queued or running.
func (c *Cleaner) Idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) == 0 && !c.running
}

func (c *Cleaner) clean(ctx context.Context, f nft.Family, j *Job) {
	opened := frontendSet(j.opened)
	current := func() conntrack.Frontends { return c.current(f, j, opened) }
	// The metrics are the backend's to observe (conntrack.Netlink does).
	res, err := c.conntrack.Reconcile(ctx, conntrack.Family(f), j.previous, current, j.isNodePortAddr)
	if err != nil {
		if ctx.Err() != nil {
			return // stopping
		}
		// The rules are right; only old flows linger. Log and go on: the
		// next change of these Services tries again.
		klog.ErrorS(err, "Conntrack cleanup failed", "ipFamily", f.IPFamily(), "deleted", res.Deleted)
		return
	}
	klog.V(2).InfoS("Conntrack cleaned", "ipFamily", f.IPFamily(), "services", len(j.current), "openedTCP", len(j.opened),
		"dumped", res.Dumped, "deleted", res.Deleted, "elapsed", res.Elapsed)
}

// current returns the frontends the flows are judged by: job j's (opened
// are its TCP frontends, as a set), and
// those of the syncs of family f that committed since it was taken
// (queued for the next job, or still returning from their Apply). A flow
// to an endpoint that serves again in a newer sync may have been created
// by its rules: the next job judges it.
func (c *Cleaner) current(f nft.Family, j *Job, opened conntrack.Frontends) conntrack.Frontends {
	parts := []conntrack.Frontends{opened}
	for _, fes := range j.current {
		parts = append(parts, fes)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	newer := false
	for _, n := range []*Job{c.pending[f], c.committing[f]} {
		if n == nil {
			continue
		}
		newer = true
		parts = append(parts, frontendSet(n.opened))
		for _, fes := range n.current {
			parts = append(parts, fes)
		}
	}
	// A pending job is still merged into after the lock is released: the
	// union is a copy then.
	return union(parts, newer)
}

// frontendSet returns the frontends, without endpoints.
func frontendSet(fes []conntrack.Frontend) conntrack.Frontends {
	out := make(conntrack.Frontends, len(fes))
	for _, fe := range fes {
		out[fe] = nil
	}
	return out
}

// union returns the frontends of all parts: unless mustCopy, the only
// non-empty part itself (at a first sync, the TCP frontends of every
// Service: no copy of them), else a merged copy.
func union(parts []conntrack.Frontends, mustCopy bool) conntrack.Frontends {
	var only conntrack.Frontends
	n := 0
	for _, p := range parts {
		if len(p) > 0 {
			only = p
			n++
		}
	}
	if n <= 1 && !mustCopy {
		return only
	}
	out := conntrack.Frontends{}
	for _, p := range parts {
		mergeFrontends(out, p)
	}
	return out
}

// mergeFrontends adds src's frontends and their endpoints to dst.
func mergeFrontends(dst, src conntrack.Frontends) {
	for fe, eps := range src {
		dst[fe] = append(dst[fe], eps...)
	}
}
