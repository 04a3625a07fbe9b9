package main

import (
	"context"
	"slices"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// triggerTimeAnnotation is the EndpointSlice controller's trigger time.
const triggerTimeAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"

// deliveries times the churn's EndpointSlice updates from their trigger
// time to their arrival at a watcher of the bench's own (normal priority,
// no proxy behind it): the part of a network programming latency that the
// kubelet, the EndpointSlice controller and the API server take on this
// machine, before any proxy sees the change.
type deliveries struct {
	mu   sync.Mutex
	took []float64 // seconds
	// stale are the ages of the trigger times of updates that kept the one
	// they had: the proxies record those too (kube-proxy's semantics), from
	// that older time.
	stale []float64
	stop  context.CancelFunc
}

// watchDeliveries starts timing the churn namespace's EndpointSlice
// updates that carry a new trigger time.
func (cl *cluster) watchDeliveries() *deliveries {
	client, err := kubernetes.NewForConfig(cl.bed.RESTConfig())
	if err != nil {
		cl.tb.Fatal(err)
	}
	d := &deliveries{}
	ctx, cancel := context.WithCancel(context.Background())
	d.stop = cancel
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(churnNS))
	inf := factory.Discovery().V1().EndpointSlices().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, obj any) {
			at := time.Now()
			prev := old.(*discoveryv1.EndpointSlice).Annotations[triggerTimeAnnotation]
			cur := obj.(*discoveryv1.EndpointSlice).Annotations[triggerTimeAnnotation]
			t, err := time.Parse(time.RFC3339Nano, cur)
			if cur == "" || err != nil {
				return
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if cur == prev {
				d.stale = append(d.stale, at.Sub(t).Seconds())
			} else {
				d.took = append(d.took, at.Sub(t).Seconds())
			}
		}}); err != nil {
		cl.tb.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cl.tb.Fatal("clusterbench: the EndpointSlice watcher did not sync")
	}
	return d
}

// end stops the watcher and returns the count and quantiles of the
// delivery times, and of the ages of the trigger times updates kept.
func (d *deliveries) end() (delivered, stale sli) {
	d.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	return sorted(d.took), sorted(d.stale)
}

func sorted(vs []float64) sli {
	if len(vs) == 0 {
		return sli{} // no NaN: the result is written as JSON
	}
	slices.Sort(vs)
	return sli{Samples: float64(len(vs)), P50: rank(vs, 0.5), P90: rank(vs, 0.9), P99: rank(vs, 0.99)}
}
