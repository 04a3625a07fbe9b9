package main

import (
	"context"
	"fmt"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nftproxy/nftproxy/internal/testutil/liveheap"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// listFloor is what any proxy built on client-go pays before its first
// sync: a bare client lists every Service and EndpointSlice the proxies
// watch (their label selector, protobuf, the watch-list stream where the
// API server serves it) into informers that keep the objects as decoded
// and run no handler.
type listFloor struct {
	wall      time.Duration // until both informers have synced
	clientCPU float64       // seconds of this process's CPU meanwhile
	apiCPU    float64       // seconds of the API server's and etcd's CPU meanwhile
	heap      uint64        // bytes of live heap the informers' objects take
}

func (b *bench) measureListFloor() listFloor {
	b.settle()
	rc := b.bed.ProxyRESTConfig()
	rc.ContentType = runtime.ContentTypeProtobuf
	rc.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	client, err := kubernetes.NewForConfig(rc)
	must(b.tb, err)
	f := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = watch.ProxyLabelSelector }))
	synced := []cache.InformerSynced{f.Core().V1().Services().Informer().HasSynced,
		f.Discovery().V1().EndpointSlices().Informer().HasSynced}
	ctx, cancel := context.WithCancel(context.Background())
	defer f.Shutdown()
	defer cancel()

	heap0 := liveheap.Bytes()
	t0, cpu0, api0 := time.Now(), selfCPU(), b.controlPlaneCPU()
	f.Start(ctx.Done())
	for !synced[0]() || !synced[1]() {
		time.Sleep(5 * time.Millisecond)
	}
	fl := listFloor{wall: time.Since(t0), clientCPU: selfCPU() - cpu0, apiCPU: b.controlPlaneCPU() - api0}
	heap := liveheap.Bytes()
	fl.heap = heap - min(heap0, heap)
	fmt.Printf("API list floor: a bare client listed %d Services and their EndpointSlices in %v (client CPU %.2fs, API server and etcd CPU %.2fs; the objects as decoded: %.0f MB of live heap)\n",
		b.c.Services, fl.wall.Round(time.Millisecond), fl.clientCPU, fl.apiCPU, float64(fl.heap)/1e6)
	return fl
}

// selfCPU is this process's CPU time so far, in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}
