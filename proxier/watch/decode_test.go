package watch

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	kwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/randfill"

	"github.com/nftproxy/nftproxy/proxier/model"
)

// The property decode.go must keep: for every object the API server can
// send, convertingSerializer yields what client-go's decoder followed by
// convertForCache yields.

// protobufInfo is client-go's protobuf serializer.
var protobufInfo, _ = runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)

// encodeProto serializes obj as the API server does, envelope included.
func encodeProto(t testing.TB, obj runtime.Object) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := protobufInfo.Serializer.Encode(obj, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// referenceDecode is what the proxy did before decode.go: client-go's
// decoder, then the conversion.
func referenceDecode(data []byte) (any, error) {
	obj, _, err := protobufInfo.Serializer.Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	return convertForCache(obj)
}

// pool is what the filler draws strings from: addresses valid and not,
// names, every enumerated value the conversions test for, the labels and
// annotations they read, and some that are none of these.
var pool = append([]string{
	"", "10.96.0.1", "10.1.2.3", "fd00::1", "::ffff:10.1.1.1", "0.0.0.0", "127.0.0.1", "224.0.0.1",
	"fe80::1%eth0", "10.0.0.0/8", "1.2.3.4/32, 5.6.7.0/24", "fd00::/64", "None", "junk",
	"a", "web", "kube-system", "node-1", "Bad_Name", "http", "x\n", "true", "false", "2026-11-27T12:00:00.5Z",
	"TCP", "UDP", "SCTP", "ICMP", "ClusterIP", "NodePort", "LoadBalancer", "ExternalName", "ClientIP",
	"Local", "Cluster", "VIP", "Proxy", "IPv4", "IPv6", "FQDN", "v1", "Service",
}, keptKeys...)

func pickString[T ~string](s *T, c randfill.Continue) { *s = T(pool[c.Intn(len(pool))]) }

func pickInt32(i *int32, c randfill.Continue) {
	*i = []int32{0, 1, 80, 8080, 30080, 65535, 65536, -1, 1 << 30}[c.Intn(9)]
}

func newFiller(seed int64) *randfill.Filler {
	return randfill.NewWithSeed(seed).NilChance(0.3).NumElements(0, 3).Funcs(
		pickString[string], pickString[v1.Protocol], pickString[v1.ServiceType], pickString[v1.ServiceAffinity],
		pickString[v1.ServiceExternalTrafficPolicy], pickString[v1.ServiceInternalTrafficPolicy],
		pickString[v1.LoadBalancerIPMode], pickString[discovery.AddressType], pickInt32,
		// Fields the conversions never read, left alone: they only slow
		// the test down.
		func(*[]metav1.ManagedFieldsEntry, randfill.Continue) {},
		func(*[]metav1.OwnerReference, randfill.Continue) {},
	)
}

// randomObjects are Services and EndpointSlices filled at random from
// pool; two in three are then given what the conversions need to keep
// them (a valid name, a ClusterIP, a Service label, an address type), as
// most objects of a cluster have.
func randomObjects(n int, seed int64) []runtime.Object {
	f := newFiller(seed)
	var out []runtime.Object
	for i := 0; i < n; i++ {
		svc := &v1.Service{}
		f.Fill(svc)
		svc.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}
		es := &discovery.EndpointSlice{}
		f.Fill(es)
		es.TypeMeta = metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"}
		if i%3 != 0 {
			svc.Namespace, svc.Name, es.Namespace, es.Name = "ns", "web", "ns", "web-1"
			svc.Spec.ClusterIPs = append([]string{"10.96.0.1"}, svc.Spec.ClusterIPs...)
			delete(svc.Labels, LabelServiceProxyName)
			delete(svc.Labels, LabelHeadless)
			if i%7 == 4 { // for another proxy, or headless
				svc.Labels = map[string]string{[]string{LabelServiceProxyName, LabelHeadless}[i%2]: "x"}
			}
			if svc.Spec.Type == v1.ServiceTypeExternalName {
				svc.Spec.Type = v1.ServiceTypeLoadBalancer
			}
			if es.Labels == nil {
				es.Labels = map[string]string{}
			}
			es.Labels[discovery.LabelServiceName] = "web"
			es.AddressType = []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6}[i%2]
			// The annotations read, each in some objects.
			annotate(&svc.ObjectMeta, i%4 == 1, v1.AnnotationLoadBalancerSourceRangesKey, "10.0.0.0/8, 1.2.3.4/32")
			annotate(&es.ObjectMeta, i%4 == 2, v1.EndpointsLastChangeTriggerTime, "2026-11-27T12:00:00.5Z")
			annotate(&es.ObjectMeta, i%5 == 3, metav1.InitialEventsAnnotationKey, "true")
		}
		out = append(out, svc, es)
	}
	return out
}

func annotate(m *metav1.ObjectMeta, do bool, key, value string) {
	if !do {
		return
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[key] = value
}

func TestDecodeMatchesClientGo(t *testing.T) {
	objs := randomObjects(2000, 1)
	s := &convertingSerializer{Serializer: protobufInfo.Serializer}
	// Every object is decoded before any is compared: a conversion that
	// kept part of the decoder's reused objects would see it overwritten.
	got := make([]any, len(objs))
	data := make([][]byte, len(objs))
	for i, obj := range objs {
		data[i] = encodeProto(t, obj)
		o, _, err := s.Decode(data[i], nil, nil)
		if err != nil {
			t.Fatalf("object %d: %v", i, err)
		}
		got[i] = o
	}
	var values, problems int
	for i := range objs {
		want, err := referenceDecode(data[i])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[i], want) {
			t.Fatalf("object %d (%#v):\ngot  %#v\nwant %#v", i, objs[i], got[i], want)
		}
		switch c := want.(type) {
		case *converted[model.Service]:
			values, problems = values+count(c.value != nil), problems+len(c.problems)
		case *converted[model.EndpointSlice]:
			values, problems = values+count(c.value != nil), problems+len(c.problems)
		}
	}
	// The objects must exercise the conversions, not only their refusals.
	if values < len(objs)/10 || problems == 0 {
		t.Errorf("%d of %d objects converted to a value, %d problems: the filler does not exercise the conversions",
			values, len(objs), problems)
	}
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}

// envelope wraps raw as the protobuf serializer does.
func envelope(apiVersion, kind string, raw []byte) []byte {
	var tm []byte
	tm = protowire.AppendTag(tm, 1, protowire.BytesType)
	tm = protowire.AppendString(tm, apiVersion)
	tm = protowire.AppendTag(tm, 2, protowire.BytesType)
	tm = protowire.AppendString(tm, kind)
	out := append([]byte{}, protobufMagic...)
	out = protowire.AppendTag(out, 1, protowire.BytesType)
	out = protowire.AppendBytes(out, tm)
	out = protowire.AppendTag(out, 2, protowire.BytesType)
	return protowire.AppendBytes(out, raw)
}

// sameDecoding checks one input against both decoders: they fail alike,
// or succeed with the same result.
func sameDecoding(t *testing.T, s *convertingSerializer, data []byte) {
	t.Helper()
	want, wantErr := referenceDecode(data)
	got, _, err := s.Decode(data, nil, nil)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Errorf("%x: error %v, client-go's %v", data, err, wantErr)
	case err == nil && !reflect.DeepEqual(got, want):
		t.Errorf("%x:\ngot  %#v\nwant %#v", data, got, want)
	}
}

func TestDecodeWire(t *testing.T) {
	s := &convertingSerializer{Serializer: protobufInfo.Serializer}
	objs := randomObjects(3, 2)
	svc, es := objs[2].(*v1.Service), objs[3].(*discovery.EndpointSlice) // the first pair is not tidied
	svcRaw, err := svc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	esRaw, err := es.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("every truncation", func(t *testing.T) {
		for _, data := range [][]byte{envelope("v1", "Service", svcRaw), envelope("discovery.k8s.io/v1", "EndpointSlice", esRaw)} {
			for n := len(protobufMagic); n <= len(data); n++ {
				sameDecoding(t, s, data[:n])
			}
		}
	})
	t.Run("unknown fields of every wire type are skipped", func(t *testing.T) {
		var unknown []byte
		unknown = protowire.AppendTag(unknown, 900, protowire.VarintType)
		unknown = protowire.AppendVarint(unknown, 1<<40)
		unknown = protowire.AppendTag(unknown, 901, protowire.Fixed32Type)
		unknown = protowire.AppendFixed32(unknown, 7)
		unknown = protowire.AppendTag(unknown, 902, protowire.Fixed64Type)
		unknown = protowire.AppendFixed64(unknown, 7)
		unknown = protowire.AppendTag(unknown, 903, protowire.BytesType)
		unknown = protowire.AppendString(unknown, "skipped")
		unknown = protowire.AppendTag(unknown, 904, protowire.StartGroupType)
		unknown = protowire.AppendTag(unknown, 1, protowire.VarintType)
		unknown = protowire.AppendVarint(unknown, 3)
		unknown = protowire.AppendTag(unknown, 904, protowire.EndGroupType)
		data := envelope("v1", "Service", append(append([]byte{}, unknown...), svcRaw...))
		sameDecoding(t, s, data)
		if _, _, err := s.Decode(data, nil, nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("refused alike", func(t *testing.T) {
		for name, prefix := range map[string][]byte{
			"field number 0":   protowire.AppendVarint(nil, 0<<3|uint64(protowire.VarintType)),
			"stray end group":  protowire.AppendTag(nil, 5, protowire.EndGroupType),
			"wire type 6":      protowire.AppendVarint(nil, 5<<3|6),
			"varint too long":  append(protowire.AppendTag(nil, 900, protowire.VarintType), bytes.Repeat([]byte{0xff}, 11)...),
			"length past end":  append(protowire.AppendTag(nil, 903, protowire.BytesType), 0x7f),
			"name as a varint": append(protowire.AppendTag(nil, 1, protowire.VarintType), 1),
		} {
			t.Run(name, func(t *testing.T) {
				data := envelope("v1", "Service", append(append([]byte{}, prefix...), svcRaw...))
				if _, _, err := s.Decode(data, nil, nil); err == nil {
					t.Fatal("decoded")
				}
				sameDecoding(t, s, data)
			})
		}
	})
	t.Run("a repeated message field adds to the first", func(t *testing.T) {
		var meta []byte
		meta = protowire.AppendTag(meta, 3, protowire.BytesType)
		meta = protowire.AppendString(meta, "other")
		raw := append(append([]byte{}, svcRaw...), protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), meta)...)
		sameDecoding(t, s, envelope("v1", "Service", raw))
	})
	t.Run("other kinds and lists go to client-go", func(t *testing.T) {
		list := &v1.ServiceList{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceList"}, Items: []v1.Service{*svc}}
		got, _, err := s.Decode(encodeProto(t, list), nil, nil)
		if _, ok := got.(*v1.ServiceList); !ok || err != nil {
			t.Fatalf("got %T, %v", got, err)
		}
		into := &v1.Service{}
		if got, _, err := s.Decode(envelope("v1", "Service", svcRaw), nil, into); got != into || err != nil {
			t.Fatalf("decoded into %T, %v", got, err)
		}
	})
}

// FuzzDecode: whatever the bytes, the decoder does not panic, and when
// both it and client-go's accept them, they agree. (Strictly valid input
// is TestDecodeMatchesClientGo's: there the decoder must accept all.)
func FuzzDecode(f *testing.F) {
	for _, obj := range randomObjects(3, 3) {
		f.Add(encodeProto(f, obj))
	}
	s := &convertingSerializer{Serializer: protobufInfo.Serializer}
	f.Fuzz(func(t *testing.T, data []byte) {
		obj, _, err := s.Decode(data, nil, nil)
		var got any
		if err == nil {
			// What the decoder leaves to client-go, the store converts.
			got, err = convertForCache(obj)
		}
		want, wantErr := referenceDecode(data)
		if err == nil && wantErr == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("got  %#v\nwant %#v", got, want)
		}
	})
}

// TestConvertingWatch runs a watch through convertingWatch's client
// against a server that streams protobuf as the API server does: objects
// arrive converted, a bookmark carries its resource version and whether
// it ends the initial events, and an error event is client-go's Status.
func TestConvertingWatch(t *testing.T) {
	svc := &v1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", ResourceVersion: "11"},
		Spec:       v1.ServiceSpec{ClusterIPs: []string{"10.96.0.1"}, Ports: []v1.ServicePort{{Name: "http", Port: 80}}}}
	bookmark := &v1.Service{TypeMeta: svc.TypeMeta, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "12",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	gone := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Status: metav1.StatusFailure,
		Code: 410, Reason: metav1.StatusReasonExpired, Message: "too old"}
	var stream bytes.Buffer
	enc := streaming.NewEncoder(protobufInfo.StreamSerializer.Framer.NewFrameWriter(&stream), protobufInfo.StreamSerializer.Serializer)
	for _, ev := range []struct {
		typ kwatch.EventType
		obj runtime.Object
	}{{kwatch.Added, svc}, {kwatch.Bookmark, bookmark}, {kwatch.Error, gone}} {
		if err := enc.Encode(&metav1.WatchEvent{Type: string(ev.typ), Object: runtime.RawExtension{Raw: encodeProto(t, ev.obj)}}); err != nil {
			t.Fatal(err)
		}
	}
	var query url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.Query()
		if r.URL.Path != "/api/v1/services" || !strings.Contains(r.Header.Get("Accept"), runtime.ContentTypeProtobuf) {
			http.Error(w, "unexpected "+r.URL.Path+" accepting "+r.Header.Get("Accept"), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
		_, _ = w.Write(stream.Bytes())
	}))
	defer srv.Close()
	watchFn, err := convertingWatch(&rest.Config{Host: srv.URL}, v1.SchemeGroupVersion, "/api", "services")
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchFn(context.Background(), metav1.ListOptions{LabelSelector: ProxyLabelSelector, ResourceVersion: "10"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var events []kwatch.Event
	for ev := range w.ResultChan() {
		events = append(events, ev)
	}
	if query.Get("watch") != "true" || query.Get("labelSelector") != ProxyLabelSelector || query.Get("resourceVersion") != "10" {
		t.Errorf("query %v", query)
	}
	if len(events) != 3 {
		t.Fatalf("%d events: %v", len(events), events)
	}
	want, err := referenceDecode(encodeProto(t, svc))
	if err != nil {
		t.Fatal(err)
	}
	if events[0].Type != kwatch.Added || !reflect.DeepEqual(events[0].Object, want) {
		t.Errorf("first event %v %#v, want %#v", events[0].Type, events[0].Object, want)
	}
	m, err := apimeta.Accessor(events[1].Object)
	if err != nil || events[1].Type != kwatch.Bookmark || m.GetResourceVersion() != "12" ||
		m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("bookmark %v %#v (%v)", events[1].Type, events[1].Object, err)
	}
	if status, ok := events[2].Object.(*metav1.Status); events[2].Type != kwatch.Error || !ok || status.Code != 410 {
		t.Errorf("error event %v %#v", events[2].Type, events[2].Object)
	}
}

// TestEventSerializerMatchesClientGo: a watch's frames decode to the same
// events as with client-go's stream serializer, every truncation of one
// included.
func TestEventSerializerMatchesClientGo(t *testing.T) {
	codecs := newConvertingCodecs()
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	ours, theirs := info.StreamSerializer.Serializer, protobufInfo.StreamSerializer.Serializer
	decode := func(s runtime.Decoder, frame []byte) (metav1.WatchEvent, error) {
		var ev metav1.WatchEvent
		_, _, err := s.Decode(frame, nil, &ev)
		return ev, err
	}
	for i, obj := range randomObjects(20, 4) {
		typ := []kwatch.EventType{kwatch.Added, kwatch.Modified, kwatch.Deleted, kwatch.Bookmark, "other"}[i%5]
		frame, err := (&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: encodeProto(t, obj)}}).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		for n := 0; n <= len(frame); n++ {
			got, err := decode(ours, frame[:n])
			want, wantErr := decode(theirs, frame[:n])
			if (err == nil) != (wantErr == nil) || err == nil && (got.Type != want.Type || !bytes.Equal(got.Object.Raw, want.Object.Raw)) {
				t.Fatalf("frame %d cut at %d of %d: got %q %x (%v), want %q %x (%v)", i, n, len(frame),
					got.Type, got.Object.Raw, err, want.Type, want.Object.Raw, wantErr)
			}
		}
	}
}
