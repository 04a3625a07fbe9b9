package watch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
)

// List lists, once, what the watchers would watch for node nodeName: the
// Services and EndpointSlices with the informers' selectors, the Node
// and the ServiceCIDRs. A missing Node is no error (the proxier, too, goes
// on without one), nor are ServiceCIDRs the API does not serve or does
// not let us list (the proxier then uses --service-cidr).
func List(ctx context.Context, client kubernetes.Interface, nodeName string) (Objects, error) {
	var objs Objects
	proxied := metav1.ListOptions{LabelSelector: ProxyLabelSelector}
	svcs, err := client.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: ProxyLabelSelector,
		FieldSelector: ServiceFieldSelector})
	if err != nil {
		return objs, fmt.Errorf("list Services: %w", err)
	}
	for i := range svcs.Items {
		objs.Services = append(objs.Services, &svcs.Items[i])
	}
	slices, err := client.DiscoveryV1().EndpointSlices("").List(ctx, proxied)
	if err != nil {
		return objs, fmt.Errorf("list EndpointSlices: %w", err)
	}
	for i := range slices.Items {
		objs.Slices = append(objs.Slices, &slices.Items[i])
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err): // the caller sees that Objects holds no Node
	case err != nil:
		return objs, fmt.Errorf("get Node %s: %w", nodeName, err)
	default:
		objs.Nodes = append(objs.Nodes, node)
	}
	cidrs, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		klog.InfoS("Cannot list ServiceCIDRs; using --service-cidr", "err", err)
	case err != nil:
		return objs, fmt.Errorf("list ServiceCIDRs: %w", err)
	default:
		for i := range cidrs.Items {
			objs.ServiceCIDRs = append(objs.ServiceCIDRs, &cidrs.Items[i])
		}
	}
	return objs, nil
}

// Decode reads API objects from r, YAML or JSON: one object, a stream of
// YAML documents, or a List of them (what `kubectl get
// svc,endpointslices,nodes,servicecidrs -A -o yaml` prints), into objs.
// Objects of other kinds are skipped; their count is returned. Every object
// must say its apiVersion and kind, as kubectl's output does.
func Decode(r io.Reader, objs *Objects) (skipped int, err error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	for doc := 1; ; doc++ {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			return skipped, nil
		} else if err != nil {
			return skipped, fmt.Errorf("document %d: %w", doc, err)
		}
		if len(bytes.TrimSpace(raw.Raw)) == 0 || string(bytes.TrimSpace(raw.Raw)) == "null" {
			continue // an empty document
		}
		n, err := decodeObject(raw.Raw, objs)
		if err != nil {
			return skipped, fmt.Errorf("document %d: %w", doc, err)
		}
		skipped += n
	}
}

// decodeObject decodes one object (JSON), or each item of a List.
func decodeObject(data []byte, objs *Objects) (skipped int, err error) {
	obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if runtime.IsNotRegisteredError(err) {
		return 1, nil
	}
	if err != nil {
		return 0, err
	}
	list, ok := obj.(*v1.List)
	if !ok {
		if !objs.Add(obj) {
			klog.V(2).InfoS("Skipping an object of another kind", "kind", gvk.String())
			return 1, nil
		}
		return 0, nil
	}
	for i, item := range list.Items {
		n, err := decodeObject(item.Raw, objs)
		if err != nil {
			return skipped, fmt.Errorf("item %d: %w", i, err)
		}
		skipped += n
	}
	return skipped, nil
}
