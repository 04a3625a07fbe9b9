package watch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/nftproxy/nftproxy/proxier/model"
)

// Decoding Services and EndpointSlices from the API's protobuf straight
// into what the proxy keeps.
//
// client-go decodes every object of a watch into a new API object: each
// field of it, each endpoint a struct with a dozen pointers, in slices
// grown by doubling, all garbage a moment later, once ConvertService or
// ConvertEndpointSlice has read the few fields it needs. While a large
// cluster is listed, that garbage is most of what the proxy allocates, and
// the collector and the kernel's zeroing of fresh heap pages cost as much
// as the decoding (docs/benchmarks.md). Here the fields the conversions read
// are decoded into API objects the decoder keeps and reuses, the rest of
// the message is skipped, and the conversion runs at once: the watch
// yields converted values. The conversions keep no slice, map or pointer
// of the object they are given (strings only), so reusing it is safe
// (TestDecodeMatchesClientGo decodes thousands of objects before it
// compares any).
//
// Anything else — another kind, a content encoding, a caller that decodes
// into an object of its own (a list) — goes to client-go's decoder.

// keptKeys are the only labels and annotations decoded: those the
// conversions and the reflector read. A key the conversions start reading
// must be added here (TestDecodeMatchesClientGo holds every one).
var keptKeys = []string{
	LabelServiceProxyName, LabelHeadless, v1.AnnotationLoadBalancerSourceRangesKey,
	discovery.LabelServiceName, v1.EndpointsLastChangeTriggerTime,
	metav1.InitialEventsAnnotationKey,
}

// keptKey returns k as one of keptKeys, if it is one.
func keptKey(k []byte) (string, bool) {
	for _, key := range keptKeys {
		if string(k) == key {
			return key, true
		}
	}
	return "", false
}

// protobufMagic starts every object the API's protobuf serializer writes,
// followed by a runtime.Unknown that holds the object.
var protobufMagic = []byte("k8s\x00")

var (
	serviceGVK              = v1.SchemeGroupVersion.WithKind("Service")
	endpointSliceGVK        = discovery.SchemeGroupVersion.WithKind("EndpointSlice")
	serviceAPIVersion       = serviceGVK.GroupVersion().String()
	endpointSliceAPIVersion = endpointSliceGVK.GroupVersion().String()
)

// convertingSerializer is a protobuf serializer whose Decode yields
// converted values for Services and EndpointSlices.
type convertingSerializer struct {
	runtime.Serializer // client-go's, for everything else
	scratch            sync.Pool
}

func (s *convertingSerializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (
	runtime.Object, *schema.GroupVersionKind, error) {
	if into != nil {
		return s.Serializer.Decode(data, defaults, into)
	}
	gvk, raw, ok := unwrap(data)
	if !ok || gvk != serviceGVK && gvk != endpointSliceGVK {
		return s.Serializer.Decode(data, defaults, into)
	}
	sc, _ := s.scratch.Get().(*scratch)
	if sc == nil {
		sc = &scratch{}
	}
	defer s.scratch.Put(sc)
	var obj runtime.Object
	var err error
	if gvk == serviceGVK {
		obj, err = sc.service(raw)
	} else {
		obj, err = sc.endpointSlice(raw)
	}
	if err != nil {
		return nil, nil, err
	}
	return obj, &gvk, nil
}

// unwrap reads the envelope of a protobuf-serialized object: its kind
// and the object's own bytes. ok is false for anything decode.go leaves
// to client-go (no envelope, or a content encoding).
func unwrap(data []byte) (gvk schema.GroupVersionKind, raw []byte, ok bool) {
	if !bytes.HasPrefix(data, protobufMagic) {
		return gvk, nil, false
	}
	var apiVersion []byte
	var encoded bool
	f := protoFields{b: data[len(protobufMagic):]}
	for f.next() {
		switch f.num {
		case 1: // typeMeta
			t := protoFields{b: f.bytes()}
			for t.next() {
				switch t.num {
				case 1:
					apiVersion = t.bytes()
				case 2:
					gvk.Kind = t.enum(serviceGVK.Kind, endpointSliceGVK.Kind)
				}
			}
			f.check(t.err)
		case 2:
			raw = f.bytes()
		case 3: // contentEncoding
			encoded = encoded || len(f.bytes()) > 0
		}
	}
	switch {
	case string(apiVersion) == serviceAPIVersion:
		gvk.Group, gvk.Version = serviceGVK.Group, serviceGVK.Version
	case string(apiVersion) == endpointSliceAPIVersion:
		gvk.Group, gvk.Version = endpointSliceGVK.Group, endpointSliceGVK.Version
	default:
		return gvk, nil, false
	}
	return gvk, raw, f.err == nil && !encoded
}

// scratch is one decoder's reused API objects, and arenas for the
// pointers their fields hold. It is reset for each object.
type scratch struct {
	svc                 v1.Service
	slice               discovery.EndpointSlice
	labels, annotations map[string]string
	strings             []string
	int32s              []int32
	yes, no             bool
}

// slot stores v in arena and returns where: the pointer stays valid (a
// grown arena leaves the old array to the pointers into it).
func slot[T any](arena *[]T, v T) *T {
	*arena = append(*arena, v)
	return &(*arena)[len(*arena)-1]
}

// reset readies sc for the next object and returns the metadata it
// starts from: labels and annotations in the scratch maps.
func (sc *scratch) reset() metav1.ObjectMeta {
	if sc.labels == nil {
		sc.labels, sc.annotations = map[string]string{}, map[string]string{}
	}
	clear(sc.labels)
	clear(sc.annotations)
	sc.strings, sc.int32s = sc.strings[:0], sc.int32s[:0]
	sc.yes, sc.no = true, false
	return metav1.ObjectMeta{Labels: sc.labels, Annotations: sc.annotations}
}

func (sc *scratch) boolPtr(b bool) *bool {
	if b {
		return &sc.yes
	}
	return &sc.no
}

// decodeMeta decodes into m the object metadata the proxy reads: name,
// namespace, resource version and the keptKeys among labels and
// annotations. Like gogo, a second occurrence of the field adds to the
// first.
func decodeMeta(b []byte, m *metav1.ObjectMeta) error {
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			m.Name = f.string()
		case 3:
			m.Namespace = f.string()
		case 6:
			m.ResourceVersion = f.string()
		case 11, 12:
			k, v, err := mapEntry(f.bytes())
			f.check(err)
			if key, ok := keptKey(k); ok {
				into := m.Labels
				if f.num == 12 {
					into = m.Annotations
				}
				into[key] = string(v)
			}
		}
	}
	return f.err
}

func (sc *scratch) service(b []byte) (*converted[model.Service], error) {
	s := &sc.svc
	*s = v1.Service{ObjectMeta: sc.reset(), Spec: v1.ServiceSpec{
		Ports:                    s.Spec.Ports[:0],
		ClusterIPs:               s.Spec.ClusterIPs[:0],
		ExternalIPs:              s.Spec.ExternalIPs[:0],
		LoadBalancerSourceRanges: s.Spec.LoadBalancerSourceRanges[:0],
	}, Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: s.Status.LoadBalancer.Ingress[:0]}}}
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			f.check(decodeMeta(f.bytes(), &s.ObjectMeta))
		case 2:
			f.check(sc.serviceSpec(f.bytes(), &s.Spec))
		case 3:
			f.check(sc.serviceStatus(f.bytes(), &s.Status))
		}
	}
	if f.err != nil {
		return nil, fmt.Errorf("decode Service: %w", f.err)
	}
	return newConverted(s, ConvertService), nil
}

func (sc *scratch) serviceSpec(b []byte, s *v1.ServiceSpec) error {
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			s.Ports = append(s.Ports, v1.ServicePort{})
			f.check(servicePort(f.bytes(), &s.Ports[len(s.Ports)-1]))
		case 3:
			s.ClusterIP = f.string()
		case 18:
			s.ClusterIPs = append(s.ClusterIPs, f.string())
		case 4:
			s.Type = v1.ServiceType(f.enum(string(v1.ServiceTypeClusterIP), string(v1.ServiceTypeNodePort),
				string(v1.ServiceTypeLoadBalancer), string(v1.ServiceTypeExternalName)))
		case 5:
			s.ExternalIPs = append(s.ExternalIPs, f.string())
		case 7:
			s.SessionAffinity = v1.ServiceAffinity(f.enum(string(v1.ServiceAffinityNone), string(v1.ServiceAffinityClientIP)))
		case 9:
			s.LoadBalancerSourceRanges = append(s.LoadBalancerSourceRanges, f.string())
		case 11:
			s.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicy(f.enum(
				string(v1.ServiceExternalTrafficPolicyCluster), string(v1.ServiceExternalTrafficPolicyLocal)))
		case 12:
			s.HealthCheckNodePort = f.int32()
		case 14:
			if s.SessionAffinityConfig == nil {
				s.SessionAffinityConfig = &v1.SessionAffinityConfig{}
			}
			f.check(sc.affinityConfig(f.bytes(), s.SessionAffinityConfig))
		case 22:
			p := f.enum(string(v1.ServiceInternalTrafficPolicyCluster), string(v1.ServiceInternalTrafficPolicyLocal))
			s.InternalTrafficPolicy = (*v1.ServiceInternalTrafficPolicy)(slot(&sc.strings, p))
		}
	}
	return f.err
}

func servicePort(b []byte, p *v1.ServicePort) error {
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			p.Name = f.string()
		case 2:
			p.Protocol = v1.Protocol(f.enum(string(v1.ProtocolTCP), string(v1.ProtocolUDP), string(v1.ProtocolSCTP)))
		case 3:
			p.Port = f.int32()
		case 5:
			p.NodePort = f.int32()
		}
	}
	return f.err
}

func (sc *scratch) affinityConfig(b []byte, c *v1.SessionAffinityConfig) error {
	f := protoFields{b: b}
	for f.next() {
		if f.num != 1 { // clientIP
			continue
		}
		if c.ClientIP == nil {
			c.ClientIP = &v1.ClientIPConfig{}
		}
		in := protoFields{b: f.bytes()}
		for in.next() {
			if in.num == 1 {
				c.ClientIP.TimeoutSeconds = slot(&sc.int32s, in.int32())
			}
		}
		f.check(in.err)
	}
	return f.err
}

func (sc *scratch) serviceStatus(b []byte, s *v1.ServiceStatus) error {
	f := protoFields{b: b}
	for f.next() {
		if f.num != 1 { // loadBalancer
			continue
		}
		lb := protoFields{b: f.bytes()}
		for lb.next() {
			if lb.num == 1 { // ingress
				ingress := &s.LoadBalancer.Ingress
				*ingress = append(*ingress, v1.LoadBalancerIngress{})
				lb.check(sc.ingress(lb.bytes(), &(*ingress)[len(*ingress)-1]))
			}
		}
		f.check(lb.err)
	}
	return f.err
}

func (sc *scratch) ingress(b []byte, ing *v1.LoadBalancerIngress) error {
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			ing.IP = f.string()
		case 3:
			m := f.enum(string(v1.LoadBalancerIPModeVIP), string(v1.LoadBalancerIPModeProxy))
			ing.IPMode = (*v1.LoadBalancerIPMode)(slot(&sc.strings, m))
		}
	}
	return f.err
}

func (sc *scratch) endpointSlice(b []byte) (*converted[model.EndpointSlice], error) {
	es := &sc.slice
	*es = discovery.EndpointSlice{ObjectMeta: sc.reset(), Endpoints: es.Endpoints[:0], Ports: es.Ports[:0]}
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			f.check(decodeMeta(f.bytes(), &es.ObjectMeta))
		case 4:
			es.AddressType = discovery.AddressType(f.enum(string(discovery.AddressTypeIPv4),
				string(discovery.AddressTypeIPv6), string(discovery.AddressTypeFQDN)))
		case 2:
			es.Endpoints = grow(es.Endpoints)
			e := &es.Endpoints[len(es.Endpoints)-1]
			*e = discovery.Endpoint{Addresses: e.Addresses[:0]}
			f.check(sc.endpoint(f.bytes(), e))
		case 3:
			es.Ports = append(es.Ports, discovery.EndpointPort{})
			f.check(sc.endpointPort(f.bytes(), &es.Ports[len(es.Ports)-1]))
		}
	}
	if f.err != nil {
		return nil, fmt.Errorf("decode EndpointSlice: %w", f.err)
	}
	return newConverted(es, ConvertEndpointSlice), nil
}

// grow lengthens s by one element, reusing what a previous object left in
// the backing array (the caller resets it).
func grow[T any](s []T) []T {
	if len(s) < cap(s) {
		return s[:len(s)+1]
	}
	var zero T
	return append(s, zero)
}

// endpoint decodes what ConvertEndpointSlice reads of an endpoint: its
// first address (it uses no other), conditions, node and hints.
func (sc *scratch) endpoint(b []byte, e *discovery.Endpoint) error {
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			a := f.bytes()
			if len(e.Addresses) == 0 && f.err == nil {
				e.Addresses = append(e.Addresses, string(a))
			}
		case 2:
			f.check(sc.conditions(f.bytes(), &e.Conditions))
		case 6:
			e.NodeName = slot(&sc.strings, f.string())
		case 8:
			if e.Hints == nil {
				e.Hints = &discovery.EndpointHints{}
			}
			f.check(hints(f.bytes(), e.Hints))
		}
	}
	return f.err
}

func (sc *scratch) conditions(b []byte, c *discovery.EndpointConditions) error {
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			c.Ready = sc.boolPtr(f.bool())
		case 2:
			c.Serving = sc.boolPtr(f.bool())
		case 3:
			c.Terminating = sc.boolPtr(f.bool())
		}
	}
	return f.err
}

func hints(b []byte, h *discovery.EndpointHints) error {
	f := protoFields{b: b}
	for f.next() {
		if f.num != 1 && f.num != 2 { // forZones, forNodes
			continue
		}
		var name string
		in := protoFields{b: f.bytes()}
		for in.next() {
			if in.num == 1 {
				name = in.string()
			}
		}
		f.check(in.err)
		if f.num == 1 {
			h.ForZones = append(h.ForZones, discovery.ForZone{Name: name})
		} else {
			h.ForNodes = append(h.ForNodes, discovery.ForNode{Name: name})
		}
	}
	return f.err
}

func (sc *scratch) endpointPort(b []byte, p *discovery.EndpointPort) error {
	f := protoFields{b: b}
	for f.next() {
		switch f.num {
		case 1:
			p.Name = slot(&sc.strings, f.string())
		case 2:
			proto := f.enum(string(v1.ProtocolTCP), string(v1.ProtocolUDP), string(v1.ProtocolSCTP))
			p.Protocol = (*v1.Protocol)(slot(&sc.strings, proto))
		case 3:
			p.Port = slot(&sc.int32s, f.int32())
		}
	}
	return f.err
}

// convertingCodecs are client-go's codecs (as its typed clients use them)
// with the protobuf serializer's Decode replaced by convertingSerializer's.
type convertingCodecs struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func newConvertingCodecs() convertingCodecs {
	base := scheme.Codecs.WithoutConversion()
	infos := slices.Clone(base.SupportedMediaTypes())
	for i, info := range infos {
		if info.MediaType == runtime.ContentTypeProtobuf {
			infos[i].Serializer = &convertingSerializer{Serializer: info.Serializer}
			stream := *info.StreamSerializer
			stream.Serializer = eventSerializer{stream.Serializer}
			infos[i].StreamSerializer = &stream
		}
	}
	return convertingCodecs{NegotiatedSerializer: base, infos: infos}
}

// eventSerializer decodes the frames of a protobuf watch, each a
// metav1.WatchEvent, leaving the event's object in the frame rather than
// copying it (client-go's copy was a large part of what a list
// allocates): client-go's watch decoder (rest/watch) decodes the object
// before it reads the next frame into the same buffer, and every object
// decoder copies what it keeps.
type eventSerializer struct{ runtime.Serializer }

var watchEventGVK = metav1.SchemeGroupVersion.WithKind("WatchEvent")

func (s eventSerializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (
	runtime.Object, *schema.GroupVersionKind, error) {
	ev, ok := into.(*metav1.WatchEvent)
	if !ok {
		return s.Serializer.Decode(data, defaults, into)
	}
	if len(data) == 0 {
		return nil, nil, errors.New("decode watch event: empty frame")
	}
	*ev = metav1.WatchEvent{}
	f := protoFields{b: data}
	for f.next() {
		switch f.num {
		case 1:
			ev.Type = f.enum(string(watch.Added), string(watch.Modified), string(watch.Deleted),
				string(watch.Bookmark), string(watch.Error))
		case 2: // a runtime.RawExtension
			o := protoFields{b: f.bytes()}
			for o.next() {
				if o.num == 1 {
					ev.Object.Raw = o.bytes()
				}
			}
			f.check(o.err)
		}
	}
	if f.err != nil {
		return nil, nil, fmt.Errorf("decode watch event: %w", f.err)
	}
	return ev, &watchEventGVK, nil
}

func (c convertingCodecs) SupportedMediaTypes() []runtime.SerializerInfo { return c.infos }

// convertingWatch returns a watch of resource (of group version gv, under
// apiPath) through a client of cfg whose protobuf decoder is
// convertingSerializer's. It asks for protobuf as client-go's typed
// clients do (unless cfg says otherwise: a JSON watch yields API objects).
func convertingWatch(cfg *rest.Config, gv schema.GroupVersion, apiPath, resource string) (
	func(context.Context, metav1.ListOptions) (watch.Interface, error), error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion, c.APIPath = &gv, apiPath
	c.NegotiatedSerializer = newConvertingCodecs()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("%s client: %w", resource, err)
	}
	return func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		var timeout time.Duration
		if o.TimeoutSeconds != nil {
			timeout = time.Duration(*o.TimeoutSeconds) * time.Second
		}
		o.Watch = true
		return rc.Get().UseProtobufAsDefaultIfPreferred(true).Resource(resource).
			VersionedParams(&o, scheme.ParameterCodec).Timeout(timeout).Watch(ctx)
	}, nil
}
