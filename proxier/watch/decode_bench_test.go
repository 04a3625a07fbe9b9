package watch

import (
	"bytes"
	"io"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	kwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
	"github.com/nftproxy/nftproxy/proxier/watch/benchapi"
)

// benchObjects are the Services and EndpointSlices of e2e/cmd/bench
// (benchapi) as the API server returns them.
func benchObjects(sz benchstate.Size) []runtime.Object {
	out := make([]runtime.Object, 0, 2*sz.Services)
	for i := 0; i < sz.Services; i++ {
		svc, es := benchapi.Objects(sz, i)
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
