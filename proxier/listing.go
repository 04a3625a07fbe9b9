package proxier

import (
	"context"
	"reflect"
	"time"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// The first full sync begins while the informers list. The trackers record
// each Service and EndpointSlice as it arrives (watch.Hooks.Arrived), and
// a loop checks them out and builds them, as a sync would, into each
// family's editor; a table that is not in the kernel yet goes in in pieces
// meanwhile. The first sync after the list ends that full sync with what
// the list brought since: the time the list takes and the time the table
// takes overlap instead of adding up.
//
// What a node sees while the list streams stays what it saw before the
// proxy started. A table written in pieces holds its base dormant (no
// hooked chain, ruleset.Dormant) until the first sync's last transaction,
// which adds the hooked chains with the Services the pieces could not
// hold: no packet reaches a Service of the table before every Service of
// the list is in it, so a Service never answers with part of its
// endpoints. A table that is there (a restart) is not written before the
// first sync, whose one transaction is the difference between the table
// and the whole list.
//
// A Service is built once both it and an EndpointSlice of it have
// arrived: they come on two streams, and building it before its endpoints
// would build it twice. Services with none are built by the first sync. A Service that
// changes after a piece began (its second slice arrived, say) cannot be
// changed by a piece, which only adds: it is built again by the first
// sync's last transaction.

// buildWhileListing runs the loop that builds the first full sync while
// the informers list, once ready reports that what every rule depends on
// has synced (watch.Watcher.ConfigSynced). stop ends it, after the step
// under way: call it once the informers have synced, before the first sync.
func (p *Proxier) buildWhileListing(ctx context.Context, ready func() bool) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-p.arrived:
			}
			if ready() {
				p.listingStep(ctx)
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		if ctx.Err() != nil {
			p.abandonBuilding()
		}
	}
}

// wakeListing tells the loop of buildWhileListing that something arrived.
// It never blocks: what arrives during a step is built by the next one.
func (p *Proxier) wakeListing() {
	select {
	case p.arrived <- struct{}{}:
	default:
	}
}

// listingStep checks the changes out and builds them into every family
// whose first full sync has begun, beginning it in a family whose table is
// read (or found absent) by now.
func (p *Proxier) listingStep(ctx context.Context) {
	affected := p.checkout()
	p.eachFamily(func(f nft.Family, backend nft.Backend) error {
		fs := p.families[f]
		if b := fs.building; b != nil {
			p.buildListed(f, fs, b, affected, false)
			return nil
		}
		if r := fs.ahead; r != nil && !closed(r.done) {
			return nil // its first full sync diffs against the reading, still under way
		}
		fst := p.startFull(ctx, f, backend)
		if fst == nil {
			return nil
		}
		b := p.beginBuild(ctx, f, fs, backend, fst, true)
		fs.building = b
		p.buildListed(f, fs, b, p.objects.names(f, 0), false)
		return nil
	})
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// buildListed builds the Services named in family f's full sync begun
// while listing. Until the list has ended (last false), a Service without
// an EndpointSlice waits.
func (p *Proxier) buildListed(f nft.Family, fs *familyState, b *build, names map[model.ServiceName]bool, last bool) {
	start := time.Now()
	n := 0
	for name := range names {
		if !last && (p.objects.service(name) == nil || !p.objects.hasSlices(name)) {
			continue
		}
		if b.built[name] && b.pw != nil {
			b.late[name] = true
			continue
		}
		b.built[name] = true
		p.buildService(f, fs, b, name)
		n++
		if b.pw == nil && !last && b.fst.absent && p.pieceServices > 0 && len(b.built) >= p.pieceServices {
			b.pw = p.newPiecewise(context.Background(), f, fs, p.deps.NFT[f], p.pieceServices, b.ctJob)
		}
	}
	if n > 0 && klog.V(4).Enabled() {
		klog.InfoS("Built Services while listing", "ipFamily", f.IPFamily(), "services", n, "built", len(b.built),
			"late", len(b.late), "elapsed", time.Since(start))
	}
}

// listedTodo returns what the first sync builds to end family f's full
// sync begun while listing: the Services affected since the last step, and
// every Service of the family not built yet. When the node or the
// configuration derived from the API changed since the sync began, it
// returns every Service built too, and the sync builds them again.
func (p *Proxier) listedTodo(f nft.Family, fs *familyState, b *build, affected map[model.ServiceName]bool) map[model.ServiceName]bool {
	todo := make(map[model.ServiceName]bool, len(affected))
	for name := range affected {
		todo[name] = true
	}
	for name := range p.objects.each(f) {
		if !b.built[name] {
			todo[name] = true
		}
	}
	if cfg, node := p.rulesetConfig(f); !reflect.DeepEqual(cfg, fs.cfg) || !reflect.DeepEqual(node, fs.node) {
		b.oldCfg, b.oldNode = fs.cfg, fs.node
		fs.cfg, fs.node = cfg, node
		b.base = ruleset.Base(cfg, f)
		for name := range b.built {
			todo[name] = true
		}
	}
	return todo
}

// abandonBuilding stops the pieces of full syncs begun while listing, when
// the proxier stops before its first sync.
func (p *Proxier) abandonBuilding() {
	for _, fs := range p.families {
		if b := fs.building; b != nil && b.pw != nil {
			b.pw.abandon()
		}
		fs.building = nil
	}
}
