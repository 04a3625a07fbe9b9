package proxier

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"reflect"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/changes"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/proxyhealth"
	"github.com/nftproxy/nftproxy/proxier/readers"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/runner"
	"github.com/nftproxy/nftproxy/proxier/servicehealth"
	"github.com/nftproxy/nftproxy/proxier/staleflows"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// Deps are the proxier's connections to the world.
type Deps struct {
	Client kubernetes.Interface
	// ClientConfig, if set, is Client's configuration: the watchers then
	// decode Services and EndpointSlices themselves (watch.API).
	ClientConfig *rest.Config
	// NFT has one backend per family to program.
	NFT map[nft.Family]nft.Backend
	// Health, if set, is told about queued and applied updates.
	Health *proxyhealth.Health
	// ServiceHealth, if set, serves the health check ports of
	// externalTrafficPolicy: Local Services, one server per family.
	ServiceHealth map[nft.Family]ServiceHealthServer
	// LocalhostNodePorts, if set, serves TCP NodePorts on the loopback
	// address of the families Config.LocalhostProxied names, one proxy
	// per family.
	LocalhostNodePorts map[nft.Family]LocalhostNodePortProxy
	// Conntrack, if set, deletes stale UDP and SCTP flows after syncs.
	Conntrack conntrack.Interface
	// Monitor, if set, reports changes other processes make to the
	// tables, which are then repaired at once.
	Monitor Monitor
	// Readers, if set, sees other processes reading the ruleset: with
	// Config.MaxReaderWait, a sync waits for their reads (see
	// proxier/runner), and a sync refused because another process owns
	// the table is retried as soon as that process's socket is gone.
	Readers *readers.Gate
	// FirstSync, if set, is called once per family, right after that
	// family's first successful sync, when its rules are in the kernel
	// (cmd/nftproxy deletes kube-proxy's tables there).
	FirstSync func(ctx context.Context, f nft.Family)
	// Listed, if set, is called once the informers have synced, before
	// the first sync (cmd/nftproxy lowers the GC percentage there).
	Listed func()
	// Trackers, if set, are where the watchers record what they see, for
	// a caller that reads them too (the cluster bench's hollow proxies
	// read when an object arrived); they must be new (watch.NewTrackers,
	// from the moment the proxier is created). Nil: the proxier's own.
	Trackers *watch.Trackers
}

// Proxier keeps this node's nftables in line with the API.
type Proxier struct {
	cfg      Config
	deps     Deps
	trackers watch.Trackers
	runner   *runner.Runner
	cleaner  *staleflows.Cleaner // nil without Deps.Conntrack
	// started is when the proxier was created: the network programming
	// latency of changes made before it is not the proxy's (see
	// observeProgrammingLatency).
	started time.Time

	mu              sync.Mutex
	apiServiceCIDRs []netip.Prefix // from ServiceCIDR objects; none: use Config.ServiceCIDRs
	node            model.Node     // this node, from its Node object
	repairs         map[nft.Family]*repair
	ownerWatched    bool // watchOwner runs

	// Owned by the sync loop: the objects as of the last checkout, and per
	// family what was programmed.
	objects  objectStore
	families map[nft.Family]*familyState
	// unobserved holds, per family, the trigger times of the EndpointSlice
	// updates checked out and not yet programmed: the next successful sync
	// of the family observes them (observeProgrammingLatency), so a failed
	// sync's updates are observed by the retry that programs them.
	unobserved map[nft.Family][]time.Time
	// pieceServices is the fewest Services a piece of a table written
	// from nothing holds (minPieceServices; tests lower it).
	pieceServices int
}

// familyState is what the proxier programmed in one family's table.
type familyState struct {
	// mode is what the state knows of the table; it says whether the
	// next sync is full and whether that sync reads the table back.
	mode   syncMode
	editor *nft.Editor // nil while mode does not know the table
	base   *nft.Fragment
	picks  *nft.Fragment // the pick maps' chains (ruleset.Slots.PickChains)
	// cfg is what base and every programmed Service's fragment were built
	// with: a Service's old fragment is rebuilt from it (see programmed).
	// A change of cfg rebuilds every Service in the same sync.
	cfg      ruleset.Config
	node     model.Node // what the programmed service ports were derived with
	services map[model.ServiceName]programmed
	ports    int            // service ports programmed
	slots    *ruleset.Slots // endpoints-map slots of the programmed chains
	// repairing is the repair the sync under way makes (nil: none).
	repairing *repair
	// ownershipLogged: whether the table is owned was logged.
	ownershipLogged bool
	// reserve: the sizes the last full sync from scratch reserved room for
	// (zero after one from the table read back).
	reserve  ruleset.Counts
	lastFull time.Time

	// synced: a sync of this family succeeded (Deps.FirstSync was called).
	synced bool
	// ahead is the table read back while the informers listed, until the
	// first full sync takes it (nil: none was read ahead).
	ahead *tableReading

	// Health check ports and local ready endpoints of the Services with
	// externalTrafficPolicy: Local.
	healthPorts map[servicehealth.ServiceName]uint16
	healthLocal map[servicehealth.ServiceName]int
	// Services with a Local traffic policy and no endpoint on this node.
	noLocalInternal, noLocalExternal map[model.ServiceName]bool
	// TCP NodePorts of the Services, for the userspace proxy of localhost
	// NodePorts (Deps.LocalhostNodePorts); localhostChanged: since they
	// were last handed to it.
	localhostPorts   map[model.ServiceName][]localhostPort
	localhostChanged bool

	// frag and oldFrag are the memory a sync builds each Service's new and
	// old fragment in (the editor copies the elements it keeps).
	frag, oldFrag nft.Fragment
}

// New returns a Proxier; Run starts it.
func New(cfg Config, deps Deps) (*Proxier, error) {
	if len(deps.NFT) == 0 {
		return nil, errors.New("no IP family to program")
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masquerade bit %d out of range 0-31", cfg.MasqueradeBit)
	}
	started := time.Now()
	trackers := watch.NewTrackers(started)
	if deps.Trackers != nil {
		trackers = *deps.Trackers
	}
	p := &Proxier{cfg: cfg, deps: deps, trackers: trackers,
		objects:    newObjectStore(),
		families:   map[nft.Family]*familyState{},
		repairs:    map[nft.Family]*repair{},
		unobserved: map[nft.Family][]time.Time{},
		started:    started, pieceServices: minPieceServices}
	for f := range deps.NFT {
		p.families[f] = &familyState{}
	}
	initMetrics(maps.Keys(deps.NFT))
	if deps.Conntrack != nil {
		p.cleaner = staleflows.New(deps.Conntrack)
	}
	if limit := MaxReaderWaitLimit(cfg); cfg.MaxReaderWait > limit {
		return nil, fmt.Errorf("MaxReaderWait %v: at most %v with SyncPeriod %v (MaxReaderWaitLimit)", cfg.MaxReaderWait, limit, cfg.SyncPeriod)
	}
	rc := runner.Config{MinInterval: cfg.MinSyncPeriod, BusyShare: cfg.SyncBusyShare, BusyCap: syncBusyCap,
		MaxInterval: cfg.SyncPeriod, RetryMin: 100 * time.Millisecond, RetryMax: cfg.SyncPeriod}
	if deps.Readers != nil && cfg.MaxReaderWait > 0 {
		rc.Readers, rc.MaxReaderWait, rc.Waited = deps.Readers, cfg.MaxReaderWait, p.waitedForReaders
	}
	p.runner = runner.New(rc, p.syncOrWatchOwner)
	return p, nil
}

// Run watches the API and syncs until ctx is done. No rule is written
// before the informers have synced (Services, EndpointSlices, this Node
// and, when the API serves them, ServiceCIDRs); while the API server is
// unreachable, Run waits for it.
func (p *Proxier) Run(ctx context.Context) error {
	hooks := watch.Hooks{
		Changed: p.queued,
		Event:   func(kind string) { metrics.APIEventsTotal.WithLabelValues(kind).Inc() },
		Updated: countUpdates,
		Invalid: func(pr watch.Problem) { metrics.InvalidObjectsTotal.WithLabelValues(pr.Kind, pr.Reason).Inc() },
		Node: func(n *v1.Node) {
			if p.deps.Health != nil {
				p.deps.Health.SyncNode(n)
			}
			if n != nil {
				p.setNode(watch.ConvertNode(n))
			}
		},
	}
	w, err := watch.New(watch.API{Client: p.deps.Client, Config: p.deps.ClientConfig}, p.cfg.NodeName, p.cfg.ResyncPeriod, p.trackers, hooks)
	if err != nil {
		return err
	}
	go p.watchTables(ctx)
	p.readTablesAhead(ctx)
	w.WatchServiceCIDRs(hooks, p.setAPIServiceCIDRs)
	klog.InfoS("Waiting for informers to sync")
	if err := w.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the first sync
		}
		return err
	}
	klog.InfoS("Informers synced, starting sync loop", "services", p.trackers.Services.Pending())
	if p.deps.Listed != nil {
		p.deps.Listed()
	}
	if p.cleaner != nil {
		go p.cleaner.Run(ctx)
	}
	p.runner.Run(ctx)
	return nil
}

// queued records that a change is waiting and asks for a sync.
func (p *Proxier) queued() {
	now := time.Now()
	for f := range p.deps.NFT {
		metrics.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(f.IPFamily()).Set(float64(now.Unix()))
		if p.deps.Health != nil {
			p.deps.Health.QueuedUpdate(f)
		}
	}
	p.runner.Trigger()
}

func (p *Proxier) setAPIServiceCIDRs(cidrs []netip.Prefix) {
	p.mu.Lock()
	p.apiServiceCIDRs = cidrs
	p.mu.Unlock()
	p.queued()
}

// setNode records this node's object; a change that matters to the rules
// (addresses, pod CIDRs, zone) is picked up by the next sync.
func (p *Proxier) setNode(n model.Node) {
	p.mu.Lock()
	changed := !reflect.DeepEqual(p.node, n)
	p.node = n
	p.mu.Unlock()
	if changed {
		p.queued()
	}
}

// sync brings every family in line with the pending changes. They are
// checked out into p.objects first, once: a family whose sync fails
// rebuilds its whole table from p.objects at its next sync (apply), so a
// failure loses no change.
//
// The families sync at once, each in a goroutine of its own (their
// states, tables and backends are apart; what they share, the recorded
// objects, is only read): one family's building overlaps the other's
// commit, which the kernel runs one at a time per network namespace. A
// dual-stack node is programmed in the time of its larger family, not of
// both. Every table a full sync reads back is read before any family
// commits: a commit moves the ruleset's generation, which a reading
// checks, and would make the other family's reading start over.
func (p *Proxier) sync(ctx context.Context) error {
	affected := p.checkout()
	full := map[nft.Family]*fullStart{}
	var mu sync.Mutex
	p.eachFamily(func(f nft.Family, backend nft.Backend) error {
		fst := p.startFull(ctx, f, backend)
		mu.Lock()
		full[f] = fst
		mu.Unlock()
		return nil
	})
	var synced []nft.Family
	err := p.eachFamily(func(f nft.Family, backend nft.Backend) error {
		if err := p.syncFamily(ctx, f, backend, affected, full[f]); err != nil {
			return err
		}
		observeProgrammingLatency(f, p.unobserved[f], time.Now())
		mu.Lock()
		synced = append(synced, f)
		mu.Unlock()
		return nil
	})
	for _, f := range synced {
		delete(p.unobserved, f)
	}
	if err != nil {
		return err
	}
	metrics.ServiceChangesPending.Set(float64(p.trackers.Services.Pending()))
	metrics.EndpointChangesPending.Set(float64(p.trackers.Slices.Pending()))
	return nil
}

// checkout records the trackers' pending changes in p.objects, and the
// trigger times of the EndpointSlice updates since the last checkout in
// p.unobserved. It returns the Services the changes affect (nil when every
// family's sync is full).
func (p *Proxier) checkout() (affected map[model.ServiceName]bool) {
	svcs, slices := p.trackers.Services.Pending(), p.trackers.Slices.Pending()
	p.objects.presize(svcs, slices)
	// A family that does not know its table syncs in full, building every
	// Service (startFull): when none knows its table (the first sync, or
	// after every family failed), the affected Services matter to none.
	for _, fs := range p.families {
		if fs.mode.knowsTable() {
			affected = make(map[model.ServiceName]bool, svcs+slices)
			break
		}
	}
	nSvcs, _ := p.trackers.Services.Checkout(func(k model.ServiceName, c changes.Change[*model.Service]) {
		p.objects.recordService(k, c, affected)
	})
	nSlices, stamps := p.trackers.Slices.Checkout(func(k model.SliceKey, c changes.Change[*model.EndpointSlice]) {
		p.objects.recordSlice(k, c, affected)
	})
	for _, s := range stamps {
		if f := s.Value.Family; p.families[f] != nil { // a family this proxy programs
			p.unobserved[f] = append(p.unobserved[f], s.At)
		}
	}
	// The changes being synced are pending until the sync ends.
	metrics.ServiceChangesPending.Set(float64(nSvcs))
	metrics.EndpointChangesPending.Set(float64(nSlices))
	return affected
}

// programmed is what one Service contributes to a family's table: the
// objects its service ports were derived from (with familyState.node).
// Neither the ports nor the fragment are kept, to save memory at scale
// (docs/code-figures.md): model.ServicePorts and ruleset.ServiceFragment are
// deterministic, so both are derived again from these objects, the node
// and familyState.cfg when the Editor must release the fragment. The
// objects are the ones the trackers hold as applied, shared.
type programmed struct {
	svc    *model.Service
	slices []*model.EndpointSlice // the Service's EndpointSlices of the family
}

// programmedPorts returns the service ports fs programmed for Service
// name, derived again with node, the node they were derived with.
func (fs *familyState) programmedPorts(f nft.Family, name model.ServiceName, node model.Node) []model.ServicePortState {
	pr, ok := fs.services[name]
	if !ok {
		return nil
	}
	return model.ServicePorts(f, node, pr.svc, pr.slices)
}

// syncFamily updates one family's table for the affected Services: their
// fragments are rebuilt and the editor turns the difference into a
// transaction sized by the change. A full sync (fst, from startFull)
// rebuilds every Service and diffs it against the table read back from the
// kernel: a restart with unchanged state writes nothing and never disturbs
// traffic, and the periodic full sync repairs whatever changed the table
// behind our back without resetting it (session affinity entries
// survive). When reading is not possible, or a diffed transaction failed,
// it rewrites the table. A change of the node or of the configuration
// derived from the API (which every fragment depends on) rebuilds every
// Service without a rewrite.
func (p *Proxier) syncFamily(ctx context.Context, f nft.Family, backend nft.Backend, affected map[model.ServiceName]bool,
	fst *fullStart) error {
	start := time.Now()
	fam := f.IPFamily()
	fs := p.families[f]
	cfg, node := p.rulesetConfig(f)
	full := fst != nil
	if full {
		start = start.Add(-fst.took) // the sync's time includes its reading
	}
	todo, n := p.toBuild(f, fs, affected, fst, !reflect.DeepEqual(cfg, fs.cfg) || !reflect.DeepEqual(node, fs.node))
	oldCfg, oldNode := fs.cfg, fs.node // what the programmed fragments were built with
	fs.cfg, fs.node = cfg, node
	base := ruleset.Base(cfg, f)
	fs.editor.Replace(fs.base, base)
	fs.base = base
	changed, ctJob := 0, staleflows.NewJob()
	var pw *piecewise
	if full && fst.absent {
		pw = p.startPiecewise(ctx, f, fs, backend, n, ctJob)
	}
	for name := range todo {
		old := fs.programmedPorts(f, name, oldNode)
		now := p.syncService(f, fs, name, oldCfg, old)
		if !reflect.DeepEqual(old, now) {
			changed++
			ctJob.Add(name, old, now)
		}
		if pw != nil {
			pw.serviceBuilt(f, fs)
		}
	}
	if full {
		fs.slots.ReleaseUnclaimed()
	}
	var sent txSize
	written := false
	if pw != nil {
		sent, written = pw.finish(f, fs)
	}
	if !written {
		fs.picks = fs.slots.UpdatePicks(f, fs.editor, fs.picks)
		tx := fs.editor.Transaction()
		if err := p.apply(ctx, f, fs, backend, tx, ctJob); err != nil {
			return err
		}
		sent = sizeOf(tx)
	}
	fs.editor.Commit()
	fs.slots.Commit()
	fromKernel := fs.mode == modeFromKernel
	fs.mode = fs.mode.next(eventCommitted)
	if full {
		fs.lastFull = fst.at
	}
	if fs.repairing != nil {
		repaired(f, fs.repairing, sent.ops)
		fs.repairing = nil
	}
	if !fs.ownershipLogged {
		fs.ownershipLogged = logOwnership(f, backend)
	}
	metrics.ServiceRuleChangesTotal.WithLabelValues(fam).Add(float64(changed))
	p.recordSync(f, fs, full, time.Since(start), sent)
	if klog.V(2).Enabled() {
		logSynced(f, fs, backend, sent, time.Since(start), full, fromKernel, fst != nil && fst.repair)
	}
	p.firstSync(ctx, f, fs)
	p.cleanConntrack(f, fs, ctJob)
	p.syncHealthChecks(f, fs)
	p.syncLocalhostNodePorts(f, fs)
	return nil
}

// toBuild returns the Services a family's sync builds, and how many. A
// full sync (fst not nil) builds every Service of the family, straight
// from the store (startFull emptied fs.services and the editor). A change of the
// configuration or of the node rebuilds every Service of the family and
// every one programmed. Otherwise the sync builds the affected Services.
func (p *Proxier) toBuild(f nft.Family, fs *familyState, affected map[model.ServiceName]bool, fst *fullStart, rebuild bool) (
	iter.Seq[model.ServiceName], int) {
	switch {
	case fst != nil:
		return p.objects.each(f), fst.services
	case rebuild:
		affected = p.objects.names(f, len(fs.services))
		for name := range fs.services {
			affected[name] = true
		}
	}
	return maps.Keys(affected), len(affected)
}

// apply sends tx, unless it is empty. When the kernel refuses it, the
// family's pending repair is queued again and its next sync rewrites the
// table: a transaction diffed against what was read back failed, so the
// next one must not build on a reading.
func (p *Proxier) apply(ctx context.Context, f nft.Family, fs *familyState, backend nft.Backend,
	tx *nft.Transaction, ctJob *staleflows.Job) error {
	if tx.Empty() {
		return nil
	}
	p.committing(f, ctJob)
	resume := p.pauseMonitor(tx)
	err := backend.Apply(ctx, tx)
	if err == nil {
		p.committed(backend)
	}
	resume()
	if err == nil {
		return nil
	}
	fam := f.IPFamily()
	p.committing(f, nil)
	p.requeueRepair(f, fs.repairing)
	fs.repairing = nil
	fs.editor, fs.mode = nil, fs.mode.next(eventRefused)
	metrics.NFTablesSyncFailuresTotal.WithLabelValues(fam).Inc()
	metrics.SyncsTotal.WithLabelValues(fam, metrics.ResultFailure).Inc()
	klog.ErrorS(err, "Sync failed; the next sync is full", "ipFamily", fam, "ops", len(tx.Ops),
		"readsTableBack", fs.mode.readsTable())
	return fmt.Errorf("sync %s: %w", fam, err)
}

// firstSync calls Deps.FirstSync after the family's first successful sync.
func (p *Proxier) firstSync(ctx context.Context, f nft.Family, fs *familyState) {
	if fs.synced {
		return
	}
	fs.synced = true
	if p.deps.FirstSync != nil {
		p.deps.FirstSync(ctx, f)
	}
}

// eachFamily runs fn for every family at once and returns their errors.
func (p *Proxier) eachFamily(fn func(f nft.Family, backend nft.Backend) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for f, backend := range p.deps.NFT {
		wg.Go(func() {
			if err := fn(f, backend); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fullStart is how a full sync of a family began.
type fullStart struct {
	at     time.Time     // when it began
	took   time.Duration // reading the table back and starting over
	repair bool          // it repairs a change by another process
	// absent: the table was read and is not in the kernel, so the sync
	// may write it in pieces (see piecewise).
	absent bool
	// services: how many Services of the family the store holds, every
	// one of which the sync builds.
	services int
}

// startFull starts a full sync of family f when one is due (at start,
// after a failure, every FullSyncPeriod, and when another process changed
// the table): the table is read back (loadTable) and the family's state
// starts over from it. It returns nil when the sync is not full.
func (p *Proxier) startFull(ctx context.Context, f nft.Family, backend nft.Backend) *fullStart {
	start := time.Now()
	fs := p.families[f]
	fs.repairing = p.takeRepair(f)
	periodDue := p.cfg.FullSyncPeriod > 0 && start.Sub(fs.lastFull) >= p.cfg.FullSyncPeriod
	if !fs.mode.fullSyncDue(fs.repairing != nil, periodDue) {
		return nil
	}
	var loaded *nft.Ruleset
	read := false // the table was read, or found absent
	if fs.mode.readsTable() {
		if loaded, read = takeReading(ctx, f, backend, fs); !read {
			loaded, read = p.loadTable(ctx, f, backend)
		}
	}
	if loaded != nil {
		fs.mode = fs.mode.next(eventRead)
	} else {
		fs.mode = fs.mode.next(eventNotRead)
	}
	services := p.objects.familyLen(f)
	fs.editor, fs.base, fs.services, fs.ports = nft.NewEditorFrom(f, loaded), nil, make(map[model.ServiceName]programmed, services), 0
	fs.picks = nil
	fs.slots = seedSlots(f, loaded)
	fs.healthPorts, fs.healthLocal = map[servicehealth.ServiceName]uint16{}, map[servicehealth.ServiceName]int{}
	fs.noLocalInternal, fs.noLocalExternal = map[model.ServiceName]bool{}, map[model.ServiceName]bool{}
	fs.localhostPorts, fs.localhostChanged = map[model.ServiceName][]localhostPort{}, true
	rcfg, _ := p.rulesetConfig(f) // Sets reads only what a run never changes
	for _, set := range ruleset.Sets(f, rcfg) {
		fs.editor.AddSet(set)
	}
	fs.reserve = ruleset.Counts{}
	if loaded == nil {
		fs.reserve = p.objects.counts(f, p.cfg.NodeName)
		ruleset.Reserve(fs.editor, fs.reserve)
	}
	return &fullStart{at: start, took: time.Since(start), repair: fs.repairing != nil, absent: read && loaded == nil,
		services: services}
}

// seedSlots returns the slot table of a full sync: the slots the chains
// read back from the kernel use, and the pick maps the ClusterIP ports
// there have elements in, so that they, their ranges and elements stay.
func seedSlots(f nft.Family, loaded *nft.Ruleset) *ruleset.Slots {
	slots := ruleset.NewSlots()
	if loaded == nil {
		return slots
	}
	names := make([]string, 0, len(loaded.Chains))
	for name, c := range loaded.Chains {
		if c.Loaded != nil && len(c.Loaded.Slots) == 1 {
			names = append(names, name)
		}
	}
	sort.Strings(names) // a conflict is settled the same way every time
	for _, name := range names {
		if !slots.Seed(name, loaded.Chains[name].Loaded.Slots[0]) {
			klog.V(2).InfoS("Chain read back holds an endpoints slot that cannot be kept", "ipFamily", f.IPFamily(),
				"chain", name, "slot", loaded.Chains[name].Loaded.Slots[0])
		}
	}
	slots.Settle()
	slots.SeedPicks(f, loaded)
	return slots
}

// tableReading is a family's table read back ahead of its first full sync.
type tableReading struct {
	done chan struct{} // closed once read
	rs   *nft.Ruleset  // nil: no table nftproxy can build on
	gen  uint32        // the ruleset generation rs stands for
	// checked: the table and the generation were read, so the reading can
	// be checked before it is built on.
	checked bool
}

// readTablesAhead reads every family's table back while the informers
// list: at a restart the first full sync diffs against it, and reading it
// needs nothing from the API, so its time overlaps the list's instead of
// adding to it. The first full sync builds on the reading only if the
// ruleset generation has not moved since (takeReading).
func (p *Proxier) readTablesAhead(ctx context.Context) {
	// A claim is a commit: every table is claimed before any is read, or
	// a later claim would make an earlier reading stale.
	for f, backend := range p.deps.NFT {
		if err := backend.Claim(ctx, f); err != nil {
			klog.V(2).InfoS("Cannot claim the table before reading it", "ipFamily", f.IPFamily(), "err", err)
		}
	}
	for f, backend := range p.deps.NFT {
		r := &tableReading{done: make(chan struct{})}
		p.families[f].ahead = r
		go func() {
			defer close(r.done)
			// The generation before the reading stands for a table that is
			// absent or one nftproxy cannot build on: that table is
			// written whole, over whatever the kernel holds by then, so it
			// is only read again if anyone committed since.
			gen, err := backend.Generation(ctx)
			if err == nil {
				r.rs, err = readTable(ctx, f, backend)
			}
			if err != nil {
				klog.V(2).InfoS("Cannot read the table back yet; the first sync reads it", "ipFamily", f.IPFamily(), "err", err)
				return
			}
			r.gen, r.checked = gen, true
			if r.rs != nil {
				r.gen = r.rs.Generation
			}
		}()
	}
}

// takeReading returns the table read ahead for family f, once it is read,
// and forgets it. ok is false when there is none to build on: none was
// read ahead, or another commit has moved the ruleset's generation since
// (the caller reads the table again).
func takeReading(ctx context.Context, f nft.Family, backend nft.Backend, fs *familyState) (rs *nft.Ruleset, ok bool) {
	r := fs.ahead
	if r == nil {
		return nil, false
	}
	fs.ahead = nil
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, false
	}
	if !r.checked {
		return nil, false
	}
	now, err := backend.Generation(ctx)
	if err != nil || now != r.gen {
		klog.InfoS("The ruleset changed since the table was read ahead; reading it again", "ipFamily", f.IPFamily(),
			"readAt", r.gen, "now", now, "err", err)
		return nil, false
	}
	return r.rs, true
}

// loadTable reads the family's table back from the kernel, for a full sync
// to diff against. A nil rs means write the table whole: there is none
// (read is true), or reading failed.
func (p *Proxier) loadTable(ctx context.Context, f nft.Family, backend nft.Backend) (rs *nft.Ruleset, read bool) {
	rs, err := readTable(ctx, f, backend)
	if err != nil {
		klog.ErrorS(err, "Cannot read the table back; rewriting it", "ipFamily", f.IPFamily())
		return nil, false
	}
	return rs, true
}

// readTable reads the family's table back and logs what it found.
func readTable(ctx context.Context, f nft.Family, l nft.Loader) (*nft.Ruleset, error) {
	start := time.Now()
	rs, err := l.Load(ctx, f)
	if err != nil {
		metrics.RulesetReadFailuresTotal.WithLabelValues(f.IPFamily(), metrics.ReaderTable).Inc()
		return nil, err
	}
	if rs == nil {
		klog.InfoS("No table to read back; writing it", "ipFamily", f.IPFamily(), "elapsed", time.Since(start))
		return nil, nil
	}
	klog.InfoS("Read the table back; the first sync writes only what differs", "ipFamily", f.IPFamily(),
		"chains", len(rs.Chains), "sets", len(rs.Sets), "elapsed", time.Since(start))
	return rs, nil
}

// syncService replaces the fragment of one Service in one family and
// returns its service ports. Its old fragment is rebuilt from old, the
// ports programmed, and oldCfg, the configuration they were built with.
func (p *Proxier) syncService(f nft.Family, fs *familyState, name model.ServiceName, oldCfg ruleset.Config,
	old []model.ServicePortState) []model.ServicePortState {
	var frag *nft.Fragment
	var ports []model.ServicePortState
	var slices []*model.EndpointSlice
	svc := p.objects.service(name)
	if svc != nil {
		slices = p.objects.slicesOf(f, name)
		if ports = model.ServicePorts(f, fs.node, svc, slices); len(ports) > 0 {
			frag = &fs.frag
			frag.Reset()
			ruleset.AddServiceFragment(frag, fs.cfg, ports, fs.slots)
			for _, m := range fs.slots.NewMaps(f) {
				fs.editor.AddSet(fs.cfg.Counters.EndpointsMap(m))
				fs.editor.Reserve(m.Name, fs.reserve.MapElements(m))
			}
		}
	}
	p.syncHealthCheck(fs, name, svc, ports)
	p.syncLocalhostPorts(f, fs, name, ports)
	delete(fs.noLocalInternal, name)
	delete(fs.noLocalExternal, name)
	for _, sp := range ports {
		if len(sp.LocalEndpoints) == 0 && len(sp.Endpoints) > 0 {
			if sp.InternalLocal {
				fs.noLocalInternal[name] = true
			}
			if sp.ExternalLocal {
				fs.noLocalExternal[name] = true
			}
		}
	}
	if len(old) == 0 && frag == nil {
		return ports
	}
	var oldFrag *nft.Fragment
	if len(old) > 0 {
		oldFrag = &fs.oldFrag
		oldFrag.Reset()
		ruleset.AddServiceFragment(oldFrag, oldCfg, old, fs.slots)
	}
	fs.slots.ReleaseGone(oldFrag, frag)
	fs.editor.Replace(oldFrag, frag)
	if frag == nil {
		delete(fs.services, name)
	} else {
		fs.services[name] = programmed{svc: svc, slices: slices}
	}
	fs.ports += len(ports) - len(old)
	return ports
}
