package watch

import (
	"context"
	"net/netip"
	"slices"
	"time"

	networking "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ServiceCIDR objects (networking.k8s.io/v1, GA in Kubernetes 1.33) name
// the service ranges in use; the proxy drops traffic to unallocated
// addresses in them. Whether the API serves them is decided by discovery
// and a 404, never by a failure to reach the server: that decides
// nothing, and the watcher waits at the gate for the server.
const (
	// defaultRecheck is how often to look again for the ServiceCIDR API
	// when it is not served and the informers have no resync period.
	defaultRecheck = 15 * time.Minute
	// discoveryRetryMin and Max bound the delay before asking again after
	// discovery was answered with an error other than a 404.
	discoveryRetryMin = time.Second
	discoveryRetryMax = 30 * time.Second
)

// serviceCIDRs decides whether the API serves ServiceCIDRs and, once it
// does, watches them.
type serviceCIDRs struct {
	w       *Watcher
	h       Hooks
	set     func([]netip.Prefix)
	recheck time.Duration
}

// WatchServiceCIDRs makes the watcher follow the ServiceCIDR objects: set
// is called with the CIDRs of all of them, sorted, after each change.
// Start asks discovery whether the API serves them: if it does, the first
// sync waits for them as for Services, so that it has the DROP for
// unallocated addresses; if not, the proxy goes on with --service-cidr and
// the watcher looks again every resync period (15 min without one), so an
// upgraded control plane is picked up.
func (w *Watcher) WatchServiceCIDRs(h Hooks, set func([]netip.Prefix)) {
	recheck := w.resync
	if recheck <= 0 {
		recheck = defaultRecheck
	}
	w.cidrs = &serviceCIDRs{w: w, h: h.withDefaults(), set: set, recheck: recheck}
}

// start returns the ServiceCIDR informer's HasSynced if the API serves
// them, else nil (and keeps looking in the background). It returns an
// error only when ctx ends first.
func (s *serviceCIDRs) start(ctx context.Context) (cache.InformerSynced, error) {
	served, err := s.served(ctx)
	if err != nil {
		return nil, err
	}
	if served {
		return s.watch(ctx)
	}
	klog.InfoS("The API server does not serve ServiceCIDRs; using --service-cidr", "lookingAgainIn", s.recheck)
	go s.lookAgain(ctx)
	return nil, nil
}

// lookAgain asks discovery every recheck period until the API serves
// ServiceCIDRs, then watches them.
func (s *serviceCIDRs) lookAgain(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.w.clock.After(s.recheck):
		}
		served, err := s.served(ctx)
		if err != nil {
			return
		}
		if served {
			klog.InfoS("The API server serves ServiceCIDRs now; watching them")
			if _, err := s.watch(ctx); err != nil {
				klog.ErrorS(err, "Cannot watch ServiceCIDRs; using --service-cidr")
			}
			return
		}
	}
}

// served asks until it has an answer: whether the API serves ServiceCIDRs
// to us. Its error is ctx's.
func (s *serviceCIDRs) served(ctx context.Context) (bool, error) {
	delay := discoveryRetryMin
	for {
		served, err := s.discover(ctx)
		if err == nil {
			return served, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		klog.ErrorS(err, "ServiceCIDR discovery failed; asking again", "in", delay)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-s.w.clock.After(delay):
		}
		delay = min(2*delay, discoveryRetryMax)
	}
}

// discover asks once, through the gate: served, not served, or an error
// that decides nothing.
func (s *serviceCIDRs) discover(ctx context.Context) (bool, error) {
	var resources *metav1.APIResourceList
	err := s.w.gate.do(ctx, "discover "+networking.SchemeGroupVersion.String(), false, func() error {
		var err error
		resources, err = s.w.client.Discovery().ServerResourcesForGroupVersion(networking.SchemeGroupVersion.String())
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	case !slices.ContainsFunc(resources.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" }):
		return false, nil
	}
	// Served. ClusterRole system:node-proxier may list and watch them; a
	// role of one's own may not, and an informer that is refused would
	// never sync.
	err = s.w.gate.do(ctx, "list servicecidrs", false, func() error { // one object: no relist
		_, err := s.w.client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
		return err
	})
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case apierrors.IsForbidden(err):
		klog.ErrorS(err, "Not allowed to list ServiceCIDRs; using --service-cidr (the proxy's role needs list and watch of servicecidrs)")
		return false, nil
	}
	return err == nil, err
}

// watch starts the ServiceCIDR informer and returns its HasSynced.
func (s *serviceCIDRs) watch(ctx context.Context) (cache.InformerSynced, error) {
	client := s.w.client
	inf := s.w.informer(&networking.ServiceCIDR{}, "servicecidrs",
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.NetworkingV1().ServiceCIDRs().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.NetworkingV1().ServiceCIDRs().Watch(ctx, o)
		})
	update := func() {
		var objs []*networking.ServiceCIDR
		for _, obj := range inf.GetStore().List() {
			objs = append(objs, obj.(*networking.ServiceCIDR))
		}
		cidrs, problems := ConvertServiceCIDRs(objs)
		report(s.h, problems)
		s.set(cidrs)
		s.h.Changed()
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.h.Event(KindServiceCIDR); update() },
		UpdateFunc: func(any, any) { s.h.Event(KindServiceCIDR); update() },
		DeleteFunc: func(any) { s.h.Event(KindServiceCIDR); update() },
	})
	if err != nil {
		return nil, err
	}
	go inf.RunWithContext(ctx)
	return reg.HasSynced, nil
}
