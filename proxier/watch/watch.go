package watch

import (
	"context"
	"fmt"
	"reflect"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/proxier/changes"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Trackers are where the watchers record what they see.
type Trackers struct {
	Services *changes.Tracker[model.ServiceName, *model.Service]
	Slices   *changes.Tracker[model.SliceKey, *model.EndpointSlice]
}

// ServiceChanges and SliceChanges are checked-out tracker snapshots.
type (
	ServiceChanges = changes.Snapshot[model.ServiceName, *model.Service]
	SliceChanges   = changes.Snapshot[model.SliceKey, *model.EndpointSlice]
)

// NewTrackers returns empty trackers that drop no-op changes.
func NewTrackers() Trackers {
	return Trackers{
		Services: changes.New[model.ServiceName, *model.Service](func(a, b *model.Service) bool { return reflect.DeepEqual(a, b) }),
		Slices:   changes.New[model.SliceKey, *model.EndpointSlice](func(a, b *model.EndpointSlice) bool { return reflect.DeepEqual(a, b) }),
	}
}

// Hooks are the watcher's calls out: all optional.
type Hooks struct {
	// Changed is called after an event changed what is pending.
	Changed func()
	// Event is called for every API event, kind "Service", "EndpointSlice"
	// or "Node", whether or not it changed anything.
	Event func(kind string)
	// Invalid is called for every problem found in an object.
	Invalid func(Problem)
	// Node is called with this node's object on every change.
	Node func(*v1.Node)
}

// Watcher runs the informers.
type Watcher struct {
	factory     informers.SharedInformerFactory
	nodeFactory informers.SharedInformerFactory
	extra       []informers.SharedInformerFactory
	synced      []cache.InformerSynced
}

// New sets up informers for Services, EndpointSlices and this node that
// record into t. resync is the informers' resync period (0: none).
func New(client kubernetes.Interface, nodeName string, resync time.Duration, t Trackers, h Hooks) (*Watcher, error) {
	h = h.withDefaults()
	factory := informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = ProxyLabelSelector }),
		informers.WithTransform(dropManagedFields))
	nodeFactory := informers.NewSharedInformerFactoryWithOptions(client, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
		}))
	w := &Watcher{factory: factory, nodeFactory: nodeFactory}

	svcInf := factory.Core().V1().Services().Informer()
	svcReg, err := svcInf.AddEventHandler(tracking(h, "Service", t.Services,
		func(ns, name string) model.ServiceName { return model.ServiceName{Namespace: ns, Name: name} },
		ConvertService))
	if err != nil {
		return nil, fmt.Errorf("service informer: %w", err)
	}
	sliceInf := factory.Discovery().V1().EndpointSlices().Informer()
	sliceReg, err := sliceInf.AddEventHandler(tracking(h, "EndpointSlice", t.Slices,
		func(ns, name string) model.SliceKey { return model.SliceKey{Namespace: ns, Name: name} },
		ConvertEndpointSlice))
	if err != nil {
		return nil, fmt.Errorf("endpointslice informer: %w", err)
	}
	nodeInf := nodeFactory.Core().V1().Nodes().Informer()
	if _, err := nodeInf.AddEventHandler(handler(h, "Node", func(obj any) { h.Node(obj.(*v1.Node)) },
		func(string, string) { h.Node(nil) })); err != nil {
		return nil, fmt.Errorf("node informer: %w", err)
	}
	// The registrations' HasSynced, not the informers': an informer's store
	// is synced before its handlers have seen every initial object, and a
	// sync then would program a partial view.
	w.synced = []cache.InformerSynced{svcReg.HasSynced, sliceReg.HasSynced}
	return w, nil
}

// Start starts the informers and waits until Services and EndpointSlices
// are synced: before that, the proxy must not program anything (a partial
// view after a restart would drop traffic to Services not seen yet).
func (w *Watcher) Start(ctx context.Context) error {
	w.factory.Start(ctx.Done())
	w.nodeFactory.Start(ctx.Done())
	for _, f := range w.extra {
		f.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), w.synced...) {
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
	if h.Invalid == nil {
		h.Invalid = func(Problem) {}
	}
	if h.Node == nil {
		h.Node = func(*v1.Node) {}
	}
	return h
}

func report(h Hooks, problems []Problem) {
	for _, p := range problems {
		klog.ErrorS(nil, "Skipping invalid part of object", "kind", p.Kind, "object", p.Object, "reason", p.Reason, "detail", p.Detail)
		h.Invalid(p)
	}
}

func recordDelete[K comparable, V any](h Hooks, t *changes.Tracker[K, V], k K) {
	if t.Delete(k) {
		h.Changed()
	}
}

// dropManagedFields removes the server-side-apply bookkeeping from objects
// before the informer caches them: the proxy never reads it, and it is often
// the largest part of an object (at 10,000 Services it is tens of MB).
func dropManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// tracking returns the event handler that converts objects of type O and
// records them in t: an object the proxy ignores (converted to nil) counts
// as deleted.
func tracking[O metav1.Object, K comparable, V any](h Hooks, kind string, t *changes.Tracker[K, *V],
	key func(ns, name string) K, convert func(O) (*V, []Problem)) cache.ResourceEventHandler {
	del := func(ns, name string) { recordDelete(h, t, key(ns, name)) }
	return handler(h, kind, func(obj any) {
		o := obj.(O)
		m, problems := convert(o)
		report(h, problems)
		if m == nil {
			del(o.GetNamespace(), o.GetName())
		} else if t.Set(key(o.GetNamespace(), o.GetName()), m) {
			h.Changed()
		}
	}, del)
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
			if m, ok := obj.(metav1.Object); ok {
				del(m.GetNamespace(), m.GetName())
			}
		},
	}
}
