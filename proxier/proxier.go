package proxier

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/healthz"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/runner"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// Deps are the proxier's connections to the world.
type Deps struct {
	Client kubernetes.Interface
	// NFT has one backend per family to program.
	NFT map[nft.Family]nft.Interface
	// Health, if set, is told about queued and applied updates.
	Health *healthz.ProxyHealth
}

// Proxier keeps this node's nftables in line with the API.
type Proxier struct {
	cfg      Config
	deps     Deps
	trackers watch.Trackers
	runner   *runner.Runner

	mu                 sync.Mutex
	apiServiceCIDRs    []netip.Prefix // from ServiceCIDR objects; nil: not known
	haveAPIServiceCIDR bool

	// Owned by the sync loop.
	committed map[nft.Family]*nft.Ruleset // nil: unknown, next sync is full
	lastFull  map[nft.Family]time.Time
}

// New returns a Proxier; Run starts it.
func New(cfg Config, deps Deps) (*Proxier, error) {
	if len(deps.NFT) == 0 {
		return nil, errors.New("no IP family to program")
	}
	if cfg.MasqueradeBit < 0 || cfg.MasqueradeBit > 31 {
		return nil, fmt.Errorf("masquerade bit %d out of range 0-31", cfg.MasqueradeBit)
	}
	p := &Proxier{cfg: cfg, deps: deps, trackers: watch.NewTrackers(),
		committed: map[nft.Family]*nft.Ruleset{}, lastFull: map[nft.Family]time.Time{}}
	p.runner = runner.New(runner.Config{MinInterval: cfg.MinSyncPeriod, MaxInterval: cfg.SyncPeriod,
		RetryMin: 100 * time.Millisecond, RetryMax: cfg.SyncPeriod}, p.sync)
	return p, nil
}

// Run watches the API and syncs until ctx is done. No rule is written
// before the Service and EndpointSlice informers have synced.
func (p *Proxier) Run(ctx context.Context) error {
	hooks := watch.Hooks{
		Changed: p.queued,
		Event:   func(kind string) { metrics.APIEventsTotal.WithLabelValues(kind).Inc() },
		Invalid: func(pr watch.Problem) { metrics.InvalidObjectsTotal.WithLabelValues(pr.Kind, pr.Reason).Inc() },
		Node: func(n *v1.Node) {
			if p.deps.Health != nil {
				p.deps.Health.SyncNode(n)
			}
		},
	}
	w, err := watch.New(p.deps.Client, p.cfg.NodeName, p.cfg.ResyncPeriod, p.trackers, hooks)
	if err != nil {
		return err
	}
	if watch.ServiceCIDRsAvailable(ctx, p.deps.Client) {
		if err := w.WatchServiceCIDRs(p.deps.Client, hooks, p.setAPIServiceCIDRs); err != nil {
			return err
		}
	}
	klog.InfoS("Waiting for informers to sync")
	if err := w.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before the first sync
		}
		return err
	}
	klog.InfoS("Informers synced, starting sync loop", "services", len(p.trackers.Services.Checkout().Current))
	p.runner.Run(ctx)
	return nil
}

// queued records that a change is waiting and asks for a sync.
func (p *Proxier) queued() {
	now := time.Now()
	for f := range p.deps.NFT {
		metrics.SyncProxyRulesLastQueuedTimestamp.WithLabelValues(familyLabel(f)).Set(float64(now.Unix()))
		if p.deps.Health != nil {
			p.deps.Health.QueuedUpdate(f)
		}
	}
	p.runner.Trigger()
}

func (p *Proxier) setAPIServiceCIDRs(cidrs []netip.Prefix) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.apiServiceCIDRs, p.haveAPIServiceCIDR = cidrs, true
}

// sync brings every family in line with one snapshot of the trackers. The
// snapshot is marked applied only if every family succeeded, so a failure
// loses no change.
func (p *Proxier) sync(ctx context.Context) error {
	svcs := p.trackers.Services.Checkout()
	slices := p.trackers.Slices.Checkout()
	metrics.ServiceChangesPending.Set(float64(len(svcs.Changed)))
	metrics.EndpointChangesPending.Set(float64(len(slices.Changed)))
	var errs []error
	for f, backend := range p.deps.NFT {
		if err := p.syncFamily(ctx, f, backend, svcs.Current, slices.Current); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	p.trackers.Services.Applied(svcs)
	p.trackers.Slices.Applied(slices)
	observeProgrammingLatency(slices.Changed)
	metrics.ServiceChangesTotal.Add(float64(len(svcs.Changed)))
	metrics.EndpointChangesTotal.Add(float64(len(slices.Changed)))
	metrics.ServiceChangesPending.Set(float64(p.trackers.Services.Pending()))
	metrics.EndpointChangesPending.Set(float64(p.trackers.Slices.Pending()))
	return nil
}

// observeProgrammingLatency records, for every EndpointSlice change now in
// the kernel, the time since the change that caused it.
func observeProgrammingLatency(changed map[model.SliceKey]*model.EndpointSlice) {
	now := time.Now()
	for _, es := range changed {
		if es != nil && !es.TriggerTime.IsZero() {
			metrics.NetworkProgrammingLatency.WithLabelValues(familyLabel(es.Family)).Observe(now.Sub(es.TriggerTime).Seconds())
		}
	}
}

// syncFamily builds, diffs and applies one family. After a failure the
// committed state is forgotten, so the next sync rewrites the table whole.
func (p *Proxier) syncFamily(ctx context.Context, f nft.Family, backend nft.Interface,
	services map[model.ServiceName]*model.Service, slices map[model.SliceKey]*model.EndpointSlice) error {
	start := time.Now()
	fam := familyLabel(f)
	committed := p.committed[f]
	full := committed == nil || (p.cfg.FullSyncPeriod > 0 && start.Sub(p.lastFull[f]) >= p.cfg.FullSyncPeriod)
	if full {
		committed = nil
	}
	st := model.Build(f, services, slices)
	desired := ruleset.Build(p.rulesetConfig(f), st)
	tx := nft.Diff(committed, desired)
	if !tx.Empty() {
		if err := backend.Apply(ctx, tx); err != nil {
			p.committed[f] = nil
			metrics.NFTablesSyncFailuresTotal.WithLabelValues(fam).Inc()
			metrics.SyncsTotal.WithLabelValues(fam, metrics.ResultFailure).Inc()
			klog.ErrorS(err, "Sync failed; the next sync rewrites the table", "ipFamily", fam, "ops", len(tx.Ops))
			return fmt.Errorf("sync %s: %w", fam, err)
		}
	}
	p.committed[f] = desired
	if full {
		p.lastFull[f] = start
	}
	elapsed := time.Since(start)
	metrics.SyncProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	if full {
		metrics.SyncFullProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	} else {
		metrics.SyncPartialProxyRulesLatency.WithLabelValues(fam).Observe(elapsed.Seconds())
	}
	metrics.SyncProxyRulesLastTimestamp.WithLabelValues(fam).Set(float64(time.Now().Unix()))
	metrics.SyncKernelOperations.WithLabelValues(fam).Observe(float64(len(tx.Ops)))
	// No traffic policy is Local yet, so no Service lacks local endpoints;
	// set the gauges so dashboards show 0 rather than no data.
	metrics.SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues(metrics.TrafficPolicyInternal, fam).Set(0)
	metrics.SyncProxyRulesNoLocalEndpointsTotal.WithLabelValues(metrics.TrafficPolicyExternal, fam).Set(0)
	metrics.SyncsTotal.WithLabelValues(fam, metrics.ResultSuccess).Inc()
	if p.deps.Health != nil {
		p.deps.Health.Updated(f)
	}
	klog.V(2).InfoS("Synced", "ipFamily", fam, "full", full, "servicePorts", len(st.ServicePorts),
		"ops", len(tx.Ops), "changes", tx.Changes(), "elapsed", elapsed)
	return nil
}

func (p *Proxier) rulesetConfig(f nft.Family) ruleset.Config {
	p.mu.Lock()
	serviceCIDRs := p.cfg.ServiceCIDRs
	if p.haveAPIServiceCIDR && len(p.apiServiceCIDRs) > 0 {
		serviceCIDRs = p.apiServiceCIDRs
	}
	p.mu.Unlock()
	return ruleset.Config{
		ClusterCIDRs:   ofFamily(f, p.cfg.ClusterCIDRs),
		ServiceCIDRs:   ofFamily(f, serviceCIDRs),
		MasqueradeMark: 1 << p.cfg.MasqueradeBit,
		MasqueradeAll:  p.cfg.MasqueradeAll,
	}
}

func ofFamily(f nft.Family, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if f.Contains(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}

func familyLabel(f nft.Family) string {
	if f == nft.IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Cleanup deletes nftproxy's tables (--cleanup).
func Cleanup(ctx context.Context, backends map[nft.Family]nft.Interface) error {
	var errs []error
	for f, b := range backends {
		if err := b.Apply(ctx, &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}); err != nil {
			metrics.NFTablesCleanupFailuresTotal.WithLabelValues(familyLabel(f)).Inc()
			errs = append(errs, fmt.Errorf("delete table %s %s: %w", f, nft.TableName, err))
		}
	}
	return errors.Join(errs...)
}
