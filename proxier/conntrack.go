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
// serves it (or at no endpoint, created while it had none), and flows to
// frontends that are gone. A sync collects one as it goes through the
// changed Services (add); the cleaner merges those that queue up.
type cleanup struct {
	previous       conntrack.Frontends                       // the frontends before
	current        map[model.ServiceName]conntrack.Frontends // each Service's, as of its latest sync
	isNodePortAddr func(netip.Addr) bool
}

func newCleanup() *cleanup {
	return &cleanup{previous: conntrack.Frontends{}, current: map[model.ServiceName]conntrack.Frontends{}}
}

// add records that Service name's ports went from old to now. Only
// Services with a UDP or SCTP port before or after count.
func (w *cleanup) add(name model.ServiceName, old, now []model.ServicePortState) {
	if !hasDatagramPort(old) && !hasDatagramPort(now) {
		return
	}
	addFrontends(w.previous, old)
	cur := conntrack.Frontends{}
	addFrontends(cur, now)
	w.current[name] = cur
}

// cleanConntrack hands the conntrack cleanup of a sync to the cleaner. It
// does nothing (not even a dump) when no UDP or SCTP port changed.
//
// The cleanup runs outside the sync loop (conntrackCleaner): a dump of a
// large table takes a quarter of a second at 100,000 flows, and a change
// to another Service must not wait for it. Deleting flows late is safe:
// until then, a stale flow keeps sending to its old endpoint, which is
// what it did before the sync too.
func (p *Proxier) cleanConntrack(f nft.Family, fs *familyState, w *cleanup) {
	if p.cleaner == nil || len(w.current) == 0 {
		return
	}
	w.isNodePortAddr = nodePortAddrMatcher(fs)
	p.cleaner.enqueue(f, w)
}

// conntrackCleaner runs the conntrack cleanups of the syncs, one at a
// time, in a goroutine of its own. Cleanups that pile up while one runs
// are merged, per family, into one: the frontends any of them had before
// (a frontend that came and went between two cleanups is still looked
// for) and each Service's frontends as of its latest sync.
type conntrackCleaner struct {
	ct   conntrack.Interface
	wake chan struct{}

	mu      sync.Mutex
	pending map[nft.Family]*cleanup
	running bool // a cleanup is under way (for tests: idle)
}

func newConntrackCleaner(ct conntrack.Interface) *conntrackCleaner {
	return &conntrackCleaner{ct: ct, wake: make(chan struct{}, 1), pending: map[nft.Family]*cleanup{}}
}

// enqueue queues cleanup w of family f, merged into the one queued, if any.
// w is the cleaner's from then on.
func (c *conntrackCleaner) enqueue(f nft.Family, w *cleanup) {
	c.mu.Lock()
	if q := c.pending[f]; q == nil {
		c.pending[f] = w
	} else {
		mergeFrontends(q.previous, w.previous)
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
	// cleanup). A flow to an endpoint that serves again in a newer sync
	// may have been created by its rules: the next cleanup judges it.
	current := func() conntrack.Frontends {
		out := conntrack.Frontends{}
		for _, fes := range w.current {
			mergeFrontends(out, fes)
		}
		c.mu.Lock()
		if newer := c.pending[f]; newer != nil {
			for _, fes := range newer.current {
				mergeFrontends(out, fes)
			}
		}
		c.mu.Unlock()
		return out
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
	klog.V(2).InfoS("Conntrack cleaned", "ipFamily", f.IPFamily(), "services", len(w.current),
		"dumped", res.Dumped, "deleted", res.Deleted, "elapsed", res.Elapsed)
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

// addFrontends adds the UDP and SCTP frontends of the ports: ClusterIP,
// external IPs, load balancer IPs and NodePort, each with every endpoint a
// flow to it may legitimately be DNATed to (cluster-wide and local ones:
// which applies depends on the client).
func addFrontends(out conntrack.Frontends, ports []model.ServicePortState) {
	for _, sp := range ports {
		proto := sp.Name.Protocol
		if proto != nft.ProtoUDP && proto != nft.ProtoSCTP {
			continue
		}
		eps := append(append([]netip.AddrPort(nil), sp.Endpoints...), sp.LocalEndpoints...)
		add := func(fe conntrack.Frontend) { out[fe] = append(out[fe], eps...) }
		add(conntrack.Frontend{Proto: proto, Addr: sp.ClusterIP, Port: sp.Port})
		for _, a := range sp.ExternalIPs {
			add(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
		}
		for _, a := range sp.LoadBalancerIPs {
			add(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
		}
		if sp.NodePort != 0 {
			add(conntrack.Frontend{Proto: proto, Port: sp.NodePort})
		}
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
