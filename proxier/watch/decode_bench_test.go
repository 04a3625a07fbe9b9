package watch

import (
	"bytes"
	"fmt"
	"io"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/types"
	kwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
)

// benchObjects are the Services and EndpointSlices of e2e/cmd/bench
// (benchstate) as the API server stores them.
func benchObjects(sz benchstate.Size) []runtime.Object {
	var out []runtime.Object
	yes := true
	for i := 0; i < sz.Services; i++ {
		name := fmt.Sprintf("svc-%d", i)
		meta := func(name string, labels map[string]string) metav1.ObjectMeta {
			return metav1.ObjectMeta{Namespace: "bench", Name: name, Labels: labels,
				UID:               types.UID(fmt.Sprintf("6f1c2a4e-0000-4000-8000-%012d", i)),
				ResourceVersion:   fmt.Sprint(100000 + i),
				CreationTimestamp: metav1.NewTime(time.Unix(1_800_000_000, 0))}
		}
		ip := benchstate.ClusterIP(i).String()
		single, cluster := v1.IPFamilyPolicySingleStack, v1.ServiceInternalTrafficPolicyCluster
		svc := &v1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: meta(name, nil),
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
				IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
				SessionAffinity: v1.ServiceAffinityNone,
				Ports:           []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
		pname, port, proto := "http", int32(8080), v1.ProtocolTCP
		es := &discovery.EndpointSlice{TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta:  meta(name+"-1", map[string]string{discovery.LabelServiceName: name}),
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}}}
		for j := 0; j < sz.Endpoints; j++ {
			node := fmt.Sprintf("node-%d", (i*sz.Endpoints+j)%100)
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{
				Addresses: []string{benchstate.Endpoint(sz, i, j, 0).String()}, NodeName: &node,
				Conditions: discovery.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: new(bool)}})
		}
		out = append(out, svc, es)
	}
	return out
}

// watchStream is objs as a protobuf watch response body, one ADDED event each.
func watchStream(tb testing.TB, objs []runtime.Object) []byte {
	var buf bytes.Buffer
	enc := streaming.NewEncoder(protobufInfo.StreamSerializer.Framer.NewFrameWriter(&buf), protobufInfo.StreamSerializer.Serializer)
	for _, o := range objs {
		ev := &metav1.WatchEvent{Type: string(kwatch.Added), Object: runtime.RawExtension{Raw: encodeProto(tb, o)}}
		if err := enc.Encode(ev); err != nil {
			tb.Fatal(err)
		}
	}
	return buf.Bytes()
}

// BenchmarkDecodeWatch reads a watch stream of Services and EndpointSlices
// as a reflector's watch does (client-go's frame reader and event decoder)
// and converts each object as the tracking store does: with client-go's
// codecs (API objects, then convertForCache) or the converting ones.
//
//	go test ./proxier/watch -run '^$' -bench DecodeWatch -benchtime 5x
func BenchmarkDecodeWatch(b *testing.B) {
	sz := benchstate.Size{Services: 20000, Endpoints: 10}
	objs := benchObjects(sz)
	data := watchStream(b, objs)
	for _, c := range []struct {
		name   string
		codecs runtime.NegotiatedSerializer
	}{{"client-go", scheme.Codecs.WithoutConversion()}, {"converting", newConvertingCodecs()}} {
		b.Run(sz.String()+"/"+c.name, func(b *testing.B) {
			info, _ := runtime.SerializerInfoForMediaType(c.codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
			b.ReportAllocs()
			for b.Loop() {
				frames := info.StreamSerializer.Framer.NewFrameReader(io.NopCloser(bytes.NewReader(data)))
				d := restclientwatch.NewDecoder(streaming.NewDecoder(frames, info.StreamSerializer.Serializer),
					c.codecs.DecoderToVersion(info.Serializer, nil))
				n := 0
				for ; ; n++ {
					_, obj, err := d.Decode()
					if err == io.EOF {
						break
					} else if err != nil {
						b.Fatal(err)
					}
					if _, err := convertForCache(obj); err != nil {
						b.Fatal(err)
					}
				}
				if n != len(objs) {
					b.Fatalf("%d objects of %d", n, len(objs))
				}
			}
		})
	}
}
