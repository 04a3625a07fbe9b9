package watch

import (
	"context"
	"fmt"
	"reflect"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nftproxy/nftproxy/proxier/changes"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Trackers are where the watchers record what they see.
type Trackers struct {
	Services *changes.Tracker[model.ServiceName, *model.Service]
	Slices   *changes.Tracker[model.SliceKey, *model.EndpointSlice]
}

// NewTrackers returns empty trackers that drop no-op changes. The slices'
// tracker stamps every update with the slice's trigger time, if it is
// after since (the network programming latency of a change made before
// the proxy started is not the proxy's: counted, the age of every slice
// its first sync finds would put every restart in the latency's 99th
// percentile; kube-proxy leaves them out alike).
func NewTrackers(since time.Time) Trackers {
	return Trackers{
		Services: changes.New[model.ServiceName](same[model.Service]),
		Slices: changes.NewStamped[model.SliceKey](same[model.EndpointSlice], func(es *model.EndpointSlice) time.Time {
			if es.TriggerTime.After(since) {
				return es.TriggerTime
			}
			return time.Time{}
		}),
	}
}

// same reports whether two model values are equal. Most comparisons (a
// relist of unchanged objects, whose values the tracker keeps) are of a
// value with itself: the pointers tell at once.
func same[V any](a, b *V) bool { return a == b || reflect.DeepEqual(a, b) }

// Hooks are the watcher's calls out: all optional.
type Hooks struct {
	// Changed is called after an event changed what is pending.
	Changed func()
	// Event is called for every API event, of a kind of Kinds, whether or
	// not it changed anything.
	Event func(kind string)
	// Updated is called with the number of updates of tracked Services
	// or EndpointSlices (kind) just recorded: every add, update and
	// delete event of an object the proxy tracks, changed or not, and
	// each object a relist added, changed or deleted (kube-proxy's
	// sync_proxy_rules_*_changes_total count the same events).
	Updated func(kind string, n int)
	// Invalid is called for every problem found in an object.
	Invalid func(Problem)
	// Node is called with this node's object on every change.
	Node func(*v1.Node)
	// Log receives the line logged for each problem; by default klog's
	// global logger. (Tests capture it here rather than swap the global
	// logger under informers that are still running.)
	Log klog.Logger
}

// Watcher runs the informers. Their List and Watch calls go through a
// gate that holds them while the API server is unreachable and lets them
// go as soon as it is ready again (see reconnect.go).
type Watcher struct {
	client     kubernetes.Interface
	clock      clock.Clock
	resync     time.Duration
	gate       *gate
	reflectors []*cache.Reflector          // Services, EndpointSlices; started by Start
	informers  []cache.SharedIndexInformer // this Node; started by Start
	synced     []cache.InformerSynced
	cidrs      *serviceCIDRs // nil: ServiceCIDRs not watched
}

// API is how the watcher reaches the API server.
type API struct {
	Client kubernetes.Interface
	// Config, if set, is Client's configuration: Services and
	// EndpointSlices are then watched through clients of their own, whose
	// protobuf decoder yields converted values (decode.go).
	Config *rest.Config
}

// New sets up reflectors of Services and EndpointSlices that record into
// t, and an informer of this node. resync is the Node informer's resync period (0: none).
func New(api API, nodeName string, resync time.Duration, t Trackers, h Hooks) (*Watcher, error) {
	return newWatcher(api, clock.RealClock{}, readyzProbe(api.Client), nodeName, resync, t, h)
}

func newWatcher(api API, clk clock.Clock, probe func(context.Context) probeResult,
	nodeName string, resync time.Duration, t Trackers, h Hooks) (*Watcher, error) {
	h = h.withDefaults()
	client := api.Client
	w := &Watcher{client: client, clock: clk, resync: resync, gate: newGate(clk, probe)}
	proxied := func(o *metav1.ListOptions) { o.LabelSelector = ProxyLabelSelector }
	proxiedServices := func(o *metav1.ListOptions) { proxied(o); o.FieldSelector = ServiceFieldSelector }
	watchServices := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return client.CoreV1().Services("").Watch(ctx, o)
	}
	watchSlices := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return client.DiscoveryV1().EndpointSlices("").Watch(ctx, o)
	}
	if api.Config != nil {
		var err error
		if watchServices, err = convertingWatch(api.Config, v1.SchemeGroupVersion, "/api", "services"); err != nil {
			return nil, err
		}
		if watchSlices, err = convertingWatch(api.Config, discovery.SchemeGroupVersion, "/apis", "endpointslices"); err != nil {
			return nil, err
		}
	}
	svcs := newTrackingStore(h, KindService, t.Services,
		func(ns, name string) model.ServiceName { return model.ServiceName{Namespace: ns, Name: name} })
	w.reflector("*v1.Service", "services", svcs,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			proxiedServices(&o)
			return client.CoreV1().Services("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			proxiedServices(&o)
			return watchServices(ctx, o)
		})
	slices := newTrackingStore(h, KindEndpointSlice, t.Slices,
		func(ns, name string) model.SliceKey { return model.SliceKey{Namespace: ns, Name: name} })
	w.reflector("*v1.EndpointSlice", "endpointslices", slices,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			proxied(&o)
			return client.DiscoveryV1().EndpointSlices("").List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			proxied(&o)
			return watchSlices(ctx, o)
		})
	nodeReg, err := w.nodeInformer(nodeName, h)
	if err != nil {
		return nil, err
	}
	// The Node's registration's HasSynced, not its informer's: an
	// informer's store is synced before its handlers have seen every
	// initial object. Without the Node, the first sync would leave out the
	// NodePorts on its addresses.
	w.synced = []cache.InformerSynced{svcs.hasSynced, slices.hasSynced, nodeReg.HasSynced}
	return w, nil
}

// nodeInformer watches this node's Node object.
func (w *Watcher) nodeInformer(nodeName string, h Hooks) (cache.ResourceEventHandlerRegistration, error) {
	thisNode := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}
	inf := w.informer(&v1.Node{}, "node "+nodeName,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			thisNode(&o)
			return w.client.CoreV1().Nodes().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			thisNode(&o)
			return w.client.CoreV1().Nodes().Watch(ctx, o)
		})
	reg, err := inf.AddEventHandler(handler(h, KindNode, func(obj any) { h.Node(obj.(*v1.Node)) },
		func(string, string) { h.Node(nil) }))
	if err != nil {
		return nil, fmt.Errorf("node informer: %w", err)
	}
	w.informers = append(w.informers, inf)
	return reg, nil
}

// reflector sets up a reflector of objects of type typ, listed and
// watched through the gate, that writes into store. It checks no type:
// a watch yields the API's objects or, through decode.go, converted ones,
// and the store takes both.
func (w *Watcher) reflector(typ, what string, store cache.ReflectorStore,
	list cache.ListWithContextFunc, watchFn cache.WatchFuncWithContext) {
	r := cache.NewReflectorWithOptions(newGatedLW(w.gate, what, w.client, list, watchFn), nil, store,
		cache.ReflectorOptions{Name: what, TypeDescription: typ})
	w.reflectors = append(w.reflectors, r)
}

// informer returns an informer of objects like obj, listed and watched
// through the gate.
func (w *Watcher) informer(obj runtime.Object, what string,
	list cache.ListWithContextFunc, watchFn cache.WatchFuncWithContext) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformerWithOptions(newGatedLW(w.gate, what, w.client, list, watchFn), obj,
		cache.SharedIndexInformerOptions{ResyncPeriod: w.resync})
	return inf
}

// Start starts the informers and waits until they are synced (and, if
// the API serves them, the ServiceCIDRs): before that, the proxy must not
// program anything (a partial view after a restart would drop traffic to
// Services not seen yet). While the API server is unreachable, it waits.
func (w *Watcher) Start(ctx context.Context) error {
	w.gate.start(ctx)
	for _, r := range w.reflectors {
		go r.RunWithContext(ctx)
	}
	for _, inf := range w.informers {
		go inf.RunWithContext(ctx)
	}
	synced := w.synced
	if w.cidrs != nil {
		cidrsSynced, err := w.cidrs.start(ctx)
		if err != nil {
			return fmt.Errorf("ServiceCIDR discovery: %w", err)
		}
		if cidrsSynced != nil {
			synced = append(synced, cidrsSynced)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informers did not sync: %w", ctx.Err())
	}
	return nil
}

func (h Hooks) withDefaults() Hooks {
	if h.Changed == nil {
		h.Changed = func() {}
	}
	if h.Event == nil {
		h.Event = func(string) {}
	}
	if h.Updated == nil {
		h.Updated = func(string, int) {}
	}
	if h.Invalid == nil {
		h.Invalid = func(Problem) {}
	}
	if h.Node == nil {
		h.Node = func(*v1.Node) {}
	}
	if h.Log.GetSink() == nil {
		h.Log = klog.Background()
	}
	return h
}

func report(h Hooks, problems []Problem) {
	for _, p := range problems {
		h.Log.Error(nil, "Skipping invalid part of object", "kind", p.Kind, "object", p.Object, "reason", p.Reason, "detail", p.Detail)
		h.Invalid(p)
	}
}

func recordDelete[K comparable, V any](h Hooks, kind string, t *changes.Tracker[K, V], k K) {
	if t.Delete(k) {
		h.Updated(kind, 1)
		h.Changed()
	}
}

// converted is a Service or EndpointSlice as the proxy keeps it: the
// object's key and version (objectMeta), its model value, which the
// tracker shares, and the problems found converting it. The API object
// itself is dropped as soon as it arrives: the proxy reads nothing else,
// and keeping whole objects while the first list streams in was a large
// part of the proxy's memory (docs/profiles.md).
type converted[V any] struct {
	objectMeta
	value    *V // nil: an object the proxy ignores
	problems []Problem
}

func (c *converted[V]) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies c; the model value is immutable and shared.
func (c *converted[V]) DeepCopyObject() runtime.Object { cp := *c; return &cp }

func newConverted[O metav1.Object, V any](o O, convert func(O) (*V, []Problem)) *converted[V] {
	v, problems := convert(o)
	return &converted[V]{objectMeta: objectMeta{namespace: o.GetNamespace(), name: o.GetName(),
		resourceVersion:  o.GetResourceVersion(),
		initialEventsEnd: o.GetAnnotations()[metav1.InitialEventsAnnotationKey] == "true"},
		value: v, problems: problems}
}

// convertForCache converts Services and EndpointSlices once, on arrival,
// into what the proxy keeps (converted). Anything else, including objects
// converted already (the watch-list reflector's store converts its initial
// objects before they reach trackingStore), passes unchanged.
func convertForCache(obj any) (any, error) {
	switch o := obj.(type) {
	case *v1.Service:
		return newConverted(o, ConvertService), nil
	case *discovery.EndpointSlice:
		return newConverted(o, ConvertEndpointSlice), nil
	}
	return obj, nil
}

// handler adapts add/update/delete callbacks; deletes are given the object's
// namespace and name (tombstones included).
func handler(h Hooks, kind string, upsert func(obj any), del func(ns, name string)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { h.Event(kind); upsert(obj) },
		UpdateFunc: func(_, obj any) { h.Event(kind); upsert(obj) },
		DeleteFunc: func(obj any) {
			h.Event(kind)
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if m, err := meta.Accessor(obj); err == nil {
				del(m.GetNamespace(), m.GetName())
			}
		},
	}
}
