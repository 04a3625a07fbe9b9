package watch

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	kwatch "k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nftproxy/nftproxy/internal/testutil/liveheap"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
)

// listServer answers a Watcher's watch-list requests as the API server
// does: the initial events of each resource, protobuf-encoded ahead of
// time, then the bookmark that ends them; the watch then stays open.
type listServer struct {
	streams map[string][]byte // by path
}

func newListServer(tb testing.TB, objs []kruntime.Object) *listServer {
	byPath := map[string][]kruntime.Object{
		"/api/v1/nodes": {&v1.Node{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Node"},
			ObjectMeta: metav1.ObjectMeta{Name: "node-0", ResourceVersion: "1"}}},
	}
	for _, o := range objs {
		path := "/apis/discovery.k8s.io/v1/endpointslices"
		if _, ok := o.(*v1.Service); ok {
			path = "/api/v1/services"
		}
		byPath[path] = append(byPath[path], o)
	}
	s := &listServer{streams: map[string][]byte{}}
	for path, objs := range byPath {
		var buf bytes.Buffer
		enc := streaming.NewEncoder(protobufInfo.StreamSerializer.Framer.NewFrameWriter(&buf), protobufInfo.StreamSerializer.Serializer)
		bookmark := objs[0].DeepCopyObject()
		m := bookmark.(metav1.ObjectMetaAccessor).GetObjectMeta()
		m.SetName("")
		m.SetNamespace("")
		m.SetResourceVersion("999999999")
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		events := append(append([]kruntime.Object{}, objs...), bookmark)
		for i, o := range events {
			typ := kwatch.Added
			if i == len(events)-1 {
				typ = kwatch.Bookmark
			}
			if err := enc.Encode(&metav1.WatchEvent{Type: string(typ), Object: kruntime.RawExtension{Raw: encodeProto(tb, o)}}); err != nil {
				tb.Fatal(err)
			}
		}
		s.streams[path] = buf.Bytes()
	}
	return s
}

func (s *listServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/readyz" {
		_, _ = w.Write([]byte("ok"))
		return
	}
	stream, ok := s.streams[r.URL.Path]
	if !ok || r.URL.Query().Get("sendInitialEvents") != "true" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", kruntime.ContentTypeProtobuf+";stream=watch")
	_, _ = w.Write(stream)
	w.(http.Flusher).Flush()
	<-r.Context().Done()
}

// BenchmarkWatcherList times a Watcher from its start until it has synced:
// the Services and EndpointSlices of e2e/cmd/bench streamed to it as the
// API server streams them (watch-list, protobuf), decoded by client-go
// (an API object each, converted by the store) or by decode.go, through
// the reflectors into the trackers. It reports the process's CPU time
// (the server's part is only writing what it encoded ahead) and the live
// heap the list added (the trackers' objects). Its wall time is coarse:
// the Watcher sees its reflectors synced every 100 ms
// (cache.WaitForCacheSync).
//
//	go test ./proxier/watch -run '^$' -bench WatcherList -benchtime 3x
func BenchmarkWatcherList(b *testing.B) {
	sz := benchstate.Size{Services: 20000, Endpoints: 10}
	srv := httptest.NewServer(newListServer(b, benchObjects(sz)))
	defer srv.Close()
	for _, decoder := range []string{"client-go", "converting"} {
		b.Run(sz.String()+"/"+decoder, func(b *testing.B) {
			cfg := &rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: kruntime.ContentTypeProtobuf}}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				b.Fatal(err)
			}
			api := API{Client: client}
			if decoder == "converting" {
				api.Config = cfg
			}
			var grown, cpu float64
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				h0 := liveheap.Bytes()
				cpu0 := cpuSeconds(b)
				b.StartTimer()
				t := NewTrackers(time.Time{})
				w, err := New(api, "node-0", 0, t, Hooks{})
				if err != nil {
					b.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				if err := w.Start(ctx); err != nil {
					b.Fatal(err)
				}
				cancel()
				b.StopTimer()
				cpu += cpuSeconds(b) - cpu0
				if n := len(t.Slices.All()); n != sz.Services {
					b.Fatalf("%d EndpointSlices tracked, want %d", n, sz.Services)
				}
				grown = liveheap.MiB(liveheap.Bytes()) - liveheap.MiB(h0)
				runtime.KeepAlive(t)
				b.StartTimer()
			}
			b.ReportMetric(grown, "trackers-MiB")
			b.ReportMetric(cpu*1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// cpuSeconds is the CPU time the process used so far.
func cpuSeconds(tb testing.TB) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
