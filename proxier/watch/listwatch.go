package watch

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
)

// gatedLW is an informer's ListerWatcher whose calls wait at the gate
// while the API server is unreachable.
//
// A List that finds the server unreachable waits and tries again: the
// reflector never sees the failure, so it never backs off. A Watch that
// finds it unreachable fails with errHeldWatch instead: the server is
// likely restarting, and a new server's watch cache cannot resume a watch
// from before (410 Gone); the reflector would learn that only once the
// server is back, and then relist after its backoff delay. Failing now
// makes it take that delay during the outage, and relist (waiting at the
// gate) as soon as the server is ready.
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

// errHeldWatch is what a Watch that found the server unreachable returns.
// It does not wrap the cause: the reflector retries a refused connection
// itself, with its backoff.
type errHeldWatch struct{ cause string }

func (e errHeldWatch) Error() string {
	return fmt.Sprintf("API server unreachable (%s); relisting once it is ready", e.cause)
}

func (l *gatedLW) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	var obj runtime.Object
	err := l.gate.do(ctx, "list "+l.what, func() error {
		var err error
		obj, err = l.inner.ListWithContext(ctx, opts)
		return err
	})
	return obj, err
}

func (l *gatedLW) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if err := l.gate.wait(ctx); err != nil {
		return nil, err
	}
	w, err := l.inner.WatchWithContext(ctx, opts)
	if unreachable(ctx, err) {
		l.gate.shut("watch "+l.what, err)
		return nil, errHeldWatch{cause: err.Error()}
	}
	return w, err
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
