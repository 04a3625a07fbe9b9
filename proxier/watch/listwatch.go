package watch

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
)

// gatedLW is an informer's ListerWatcher whose calls wait at the gate
// while the API server is unreachable.
//
// A List or a Watch that finds the server unreachable waits and tries
// again once it is ready: the reflector never sees the failure, so it
// never backs off. A Watch tried again asks for the same resource version:
// a server back from a restart resumes it where it can, at no cost to
// anyone, and answers 410 Gone where it cannot (its watch cache starts at
// etcd's revision, and a watch of quiet objects holds the version of its
// last event or bookmark: any write since, a node's Lease, puts it behind;
// in docs/scale.md almost every watch resumed after an outage, and every
// one relisted after a restart), and only then does the reflector relist.
// Failing the Watch instead, as this did before, made every watcher of
// every node relist after every outage, at the moment the server became
// ready.
type gatedLW struct {
	inner cache.ListerWatcherWithContext
	gate  *gate
	what  string // the resource, for logs
	// noWatchList: the client cannot stream lists (fakes); see
	// watchlist.DoesClientNotSupportWatchListSemantics.
	noWatchList bool
}

func newGatedLW(g *gate, what string, client any, list cache.ListWithContextFunc, watchFn cache.WatchFuncWithContext) *gatedLW {
	return &gatedLW{inner: &cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn}, gate: g, what: what,
		noWatchList: watchlist.DoesClientNotSupportWatchListSemantics(client)}
}

func (l *gatedLW) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	var obj runtime.Object
	err := l.gate.do(ctx, "list "+l.what, true, func() error {
		var err error
		obj, err = l.inner.ListWithContext(ctx, opts)
		return err
	})
	return obj, err
}

func (l *gatedLW) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	var w watch.Interface
	err := l.gate.do(ctx, "watch "+l.what, relists(opts), func() error {
		var err error
		w, err = l.inner.WatchWithContext(ctx, opts)
		return err
	})
	return w, err
}

// relists reports whether a Watch with opts streams the objects first (a
// watch-list, or a watch from no resource version), as a List would.
func relists(opts metav1.ListOptions) bool {
	return opts.SendInitialEvents != nil && *opts.SendInitialEvents ||
		opts.ResourceVersion == "" || opts.ResourceVersion == "0"
}

// List and Watch make gatedLW a cache.ListerWatcher; the reflector calls
// the context-aware methods.
func (l *gatedLW) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

func (l *gatedLW) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// IsWatchListSemanticsUnSupported tells the reflector whether it may
// stream the initial list (watchlist.DoesClientNotSupportWatchListSemantics).
func (l *gatedLW) IsWatchListSemanticsUnSupported() bool { return l.noWatchList }
