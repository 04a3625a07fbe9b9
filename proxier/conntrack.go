package proxier

import (
	"context"
	"net/netip"
	"sync"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// cleanup is the conntrack cleanup of one family: the UDP and SCTP flows to
// a frontend of a changed Service that point at an endpoint that no longer
// serves it (or at no endpoint, created while it had none), flows to
// frontends that are gone, and TCP connection attempts that went past a
// frontend before this sync installed its rules (see conntrack.Stale). A
// sync collects one as it goes through the changed Services (add); the
// cleaner merges those that queue up.
type cleanup struct {
	previous conntrack.Frontends                       // the frontends before
	current  map[model.ServiceName]conntrack.Frontends // each Service's, as of its latest sync
	// opened are the TCP frontends whose rules a sync installed: at a
	// first sync, every one (a slice: 40 bytes each, half what a map
	// costs, while the sync's batch is being applied).
	opened         []conntrack.Frontend
	isNodePortAddr func(netip.Addr) bool
}

func newCleanup() *cleanup {
	return &cleanup{previous: conntrack.Frontends{}, current: map[model.ServiceName]conntrack.Frontends{}}
}

// add records that Service name's ports went from old to now: its UDP and
// SCTP frontends before and after, if it has any, and its TCP frontends
// that old did not have.
func (w *cleanup) add(name model.ServiceName, old, now []model.ServicePortState) {
	w.opened = addOpened(w.opened, old, now)
	if !hasDatagramPort(old) && !hasDatagramPort(now) {
		return
	}
	addFrontends(w.previous, old)
	cur := conntrack.Frontends{}
	addFrontends(cur, now)
	w.current[name] = cur
}

// empty reports whether the cleanup has nothing to look for.
func (w *cleanup) empty() bool { return len(w.current) == 0 && len(w.opened) == 0 }

// cleanConntrack hands the conntrack cleanup of a sync to the cleaner. It
// does nothing (not even a dump) when no UDP or SCTP port changed and no
// TCP frontend was added.
//
// The cleanup runs outside the sync loop (conntrackCleaner): a dump of a
// large table takes a quarter of a second at 100,000 flows, and a change
// to another Service must not wait for it. Deleting flows late is safe:
// until then, a stale flow keeps sending to its old endpoint, which is
// what it did before the sync too.
func (p *Proxier) cleanConntrack(f nft.Family, fs *familyState, w *cleanup) {
	if p.cleaner == nil || w.empty() {
		return
	}
	w.isNodePortAddr = nodePortAddrMatcher(fs)
	p.cleaner.enqueue(f, w)
}

// committing tells the cleaner, before a sync applies its transaction,
// the frontends its rules will have (w; nil when the transaction failed).
// A flow those rules make may be dumped by a cleanup that runs before the
// sync hands over its own (cleanConntrack, which ends this): that cleanup
// judges it by them, not as stale.
func (p *Proxier) committing(f nft.Family, w *cleanup) {
	if p.cleaner != nil && (w == nil || !w.empty()) {
		p.cleaner.setCommitting(f, w)
	}
}

// conntrackCleaner runs the conntrack cleanups of the syncs, one at a
// time, in a goroutine of its own. Cleanups that pile up while one runs
// are merged, per family, into one: the frontends any of them had before
// (a frontend that came and went between two cleanups is still looked
// for) and each Service's frontends as of its latest sync.
type conntrackCleaner struct {
	ct   conntrack.Interface
	wake chan struct{}

	mu         sync.Mutex
	pending    map[nft.Family]*cleanup
	committing map[nft.Family]*cleanup // of a sync between its Apply and its enqueue
	running    bool                    // a cleanup is under way (for tests: idle)
}

func newConntrackCleaner(ct conntrack.Interface) *conntrackCleaner {
	return &conntrackCleaner{ct: ct, wake: make(chan struct{}, 1), pending: map[nft.Family]*cleanup{},
		committing: map[nft.Family]*cleanup{}}
}

// enqueue queues cleanup w of family f, merged into the one queued, if any.
// w is the cleaner's from then on.
func (c *conntrackCleaner) enqueue(f nft.Family, w *cleanup) {
	c.mu.Lock()
	delete(c.committing, f)
	if q := c.pending[f]; q == nil {
		c.pending[f] = w
	} else {
		mergeFrontends(q.previous, w.previous)
		q.opened = append(q.opened, w.opened...)
		for name, fes := range w.current {
			q.current[name] = fes
		}
		q.isNodePortAddr = w.isNodePortAddr
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// setCommitting records (or, with nil, forgets) the cleanup of family f's
// sync that is applying its transaction; enqueue forgets it too. The sync
// does not change w from then on.
func (c *conntrackCleaner) setCommitting(f nft.Family, w *cleanup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if w == nil {
		delete(c.committing, f)
	} else {
		c.committing[f] = w
	}
}

// run does the cleanups until ctx is done.
func (c *conntrackCleaner) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		c.mu.Lock()
		work := c.pending
		c.pending = map[nft.Family]*cleanup{}
		c.running = len(work) > 0
		c.mu.Unlock()
		for f, w := range work {
			c.clean(ctx, f, w)
		}
		c.mu.Lock()
		c.running = false
		c.mu.Unlock()
	}
}

func (c *conntrackCleaner) clean(ctx context.Context, f nft.Family, w *cleanup) {
	// The frontends the flows are judged by: the cleanup's, and those of
	// the syncs that committed since it was taken (queued for the next
	// cleanup, or still returning from their Apply). A flow to an endpoint
	// that serves again in a newer sync may have been created by its
	// rules: the next cleanup judges it.
	opened := frontendSet(w.opened)
	current := func() conntrack.Frontends {
		parts := []conntrack.Frontends{opened}
		for _, fes := range w.current {
			parts = append(parts, fes)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		newer := false
		for _, n := range []*cleanup{c.pending[f], c.committing[f]} {
			if n == nil {
				continue
			}
			newer = true
			parts = append(parts, frontendSet(n.opened))
			for _, fes := range n.current {
				parts = append(parts, fes)
			}
		}
		// A pending cleanup is still merged into after the lock is
		// released: the union is a copy then.
		return union(parts, newer)
	}
	// The metrics are the backend's to observe (conntrack.Netlink does).
	res, err := c.ct.Reconcile(ctx, conntrack.Family(f), w.previous, current, w.isNodePortAddr)
	if err != nil {
		if ctx.Err() != nil {
			return // stopping
		}
		// The rules are right; only old flows linger. Log and go on: the
		// next change of these Services tries again.
		klog.ErrorS(err, "Conntrack cleanup failed", "ipFamily", f.IPFamily(), "deleted", res.Deleted)
		return
	}
	klog.V(2).InfoS("Conntrack cleaned", "ipFamily", f.IPFamily(), "services", len(w.current), "openedTCP", len(w.opened),
		"dumped", res.Dumped, "deleted", res.Deleted, "elapsed", res.Elapsed)
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

// idle reports whether no cleanup is queued or running.
func (c *conntrackCleaner) idle() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending) == 0 && !c.running
}

func hasDatagramPort(ports []model.ServicePortState) bool {
	for _, sp := range ports {
		if sp.Name.Protocol == nft.ProtoUDP || sp.Name.Protocol == nft.ProtoSCTP {
			return true
		}
	}
	return false
}

// addFrontends adds the UDP and SCTP frontends of the ports, each with
// every endpoint a flow to it may legitimately be DNATed to (cluster-wide
// and local ones: which applies depends on the client).
func addFrontends(out conntrack.Frontends, ports []model.ServicePortState) {
	for _, sp := range ports {
		if sp.Name.Protocol != nft.ProtoUDP && sp.Name.Protocol != nft.ProtoSCTP {
			continue
		}
		eps := append(append([]netip.AddrPort(nil), sp.Endpoints...), sp.LocalEndpoints...)
		eachFrontend(sp, func(fe conntrack.Frontend) { out[fe] = append(out[fe], eps...) })
	}
}

// addOpened appends to out the TCP frontends of now that old does not have
// (conntrack.Stale ignores a TCP frontend's endpoints).
func addOpened(out []conntrack.Frontend, old, now []model.ServicePortState) []conntrack.Frontend {
	var had map[conntrack.Frontend]bool
	for _, sp := range now {
		if sp.Name.Protocol != nft.ProtoTCP {
			continue
		}
		if had == nil && len(old) > 0 {
			had = map[conntrack.Frontend]bool{}
			for _, o := range old {
				if o.Name.Protocol == nft.ProtoTCP {
					eachFrontend(o, func(fe conntrack.Frontend) { had[fe] = true })
				}
			}
		}
		eachFrontend(sp, func(fe conntrack.Frontend) {
			if !had[fe] {
				out = append(out, fe)
			}
		})
	}
	return out
}

// eachFrontend calls fn with each frontend of the port: ClusterIP,
// external IPs, load balancer IPs and NodePort.
func eachFrontend(sp model.ServicePortState, fn func(conntrack.Frontend)) {
	proto := sp.Name.Protocol
	fn(conntrack.Frontend{Proto: proto, Addr: sp.ClusterIP, Port: sp.Port})
	for _, a := range sp.ExternalIPs {
		fn(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
	}
	for _, a := range sp.LoadBalancerIPs {
		fn(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
	}
	if sp.NodePort != 0 {
		fn(conntrack.Frontend{Proto: proto, Port: sp.NodePort})
	}
}

// nodePortAddrMatcher tells whether a flow's original destination is one of
// the addresses NodePorts answer on in this family.
func nodePortAddrMatcher(fs *familyState) func(netip.Addr) bool {
	np := fs.cfg.NodePorts
	return func(a netip.Addr) bool {
		if a.IsLoopback() {
			return false
		}
		for _, x := range np.Addresses {
			if x == a {
				return true
			}
		}
		for _, c := range np.CIDRs {
			if c.Contains(a) {
				return true
			}
		}
		return false
	}
}
