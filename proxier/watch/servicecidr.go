package watch

import (
	"context"
	"net/netip"

	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ServiceCIDRsAvailable reports whether the ServiceCIDR API
// (networking.k8s.io/v1, GA in Kubernetes 1.33) can be listed with our
// credentials. Without it, the proxy uses --service-cidr.
func ServiceCIDRsAvailable(ctx context.Context, client kubernetes.Interface) bool {
	_, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		klog.InfoS("ServiceCIDR API not usable, falling back to --service-cidr", "err", err)
		return false
	}
	return true
}

// WatchServiceCIDRs adds a ServiceCIDR informer to the watcher; set is
// called with every CIDR of every ServiceCIDR object after each change.
func (w *Watcher) WatchServiceCIDRs(client kubernetes.Interface, h Hooks, set func([]netip.Prefix)) error {
	h = h.withDefaults()
	inf := w.informer(&networking.ServiceCIDR{}, "servicecidrs", nil,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.NetworkingV1().ServiceCIDRs().List(ctx, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.NetworkingV1().ServiceCIDRs().Watch(ctx, o)
		})
	update := func() {
		var out []netip.Prefix
		for _, obj := range inf.GetStore().List() {
			sc := obj.(*networking.ServiceCIDR)
			for _, c := range sc.Spec.CIDRs {
				p, err := netip.ParsePrefix(c)
				if err != nil {
					report(h, []Problem{{Kind: "ServiceCIDR", Object: sc.Name, Reason: "invalid-cidr", Detail: c}})
					continue
				}
				out = append(out, p.Masked())
			}
		}
		set(out)
		h.Changed()
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { h.Event("ServiceCIDR"); update() },
		UpdateFunc: func(any, any) { h.Event("ServiceCIDR"); update() },
		DeleteFunc: func(any) { h.Event("ServiceCIDR"); update() },
	})
	if err != nil {
		return err
	}
	w.informers = append(w.informers, inf)
	w.synced = append(w.synced, reg.HasSynced)
	return nil
}
