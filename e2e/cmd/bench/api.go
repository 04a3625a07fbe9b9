package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// The API state: Services svc-0 … svc-(N-1), selector-less, port 80, each
// with one EndpointSlice svc-i-1 (target port 8080).
//   - svc-0 ("stable") has one endpoint, server pod srv-0: readiness and
//     first-packet latency are measured through it.
//   - svc-1 ("mover") has one endpoint, one of srv-1…srv-3; a single change
//     moves it to the next of them.
//   - every other Service has M endpoints in 10.128.0.0/9 (never sent
//     traffic); the churn writer moves their first endpoint to addresses in
//     10.200.0.0/14.

const (
	ns         = "bench"
	serverPort = 8080
	stableSvc  = 0
	moverSvc   = 1
	firstOther = 2 // the first Service that is neither stable nor mover
	nServers   = 4 // srv-0 for stable, srv-1..3 for the mover
)

// populate creates Services [from, to) and their EndpointSlices: through
// the API with 64 workers, or, with --populate etcd, the stable and mover
// Services through the API and the others in etcd (populateEtcd).
func (b *bench) populate(from, to int) {
	if b.c.populateEtcd() && to > firstOther {
		if from < firstOther {
			b.populateAPI(from, firstOther)
		}
		b.populateEtcd(max(from, firstOther), to)
		return
	}
	b.populateAPI(from, to)
}

// populateAPI creates Services [from, to) and their EndpointSlices through
// the API with 64 workers.
func (b *bench) populateAPI(from, to int) {
	t0 := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := b.createService(i); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	must(b.tb, firstErr)
	fmt.Printf("created Services and EndpointSlices %d..%d (%d endpoints each) in %v\n", from, to-1, b.c.Endpoints, time.Since(t0).Round(100*time.Millisecond))
}

func (b *bench) createService(i int) error {
	ctx := context.Background()
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName(i), Namespace: ns},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	got, err := b.client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	var es *discovery.EndpointSlice
	switch i {
	case stableSvc:
		b.stableAddr = got.Spec.ClusterIP + ":80"
		es = podSlice(i, b.servers[0])
	case moverSvc:
		b.moverAddr = got.Spec.ClusterIP + ":80"
		es = podSlice(i, b.servers[1])
	default:
		es = b.fakeSlice(i, 0)
	}
	_, err = b.client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
	return err
}

func svcName(i int) string { return fmt.Sprintf("svc-%d", i) }

func sliceMeta(i int) (metav1.ObjectMeta, []discovery.EndpointPort) {
	name, port, proto := "http", int32(serverPort), v1.ProtocolTCP
	return metav1.ObjectMeta{Name: svcName(i) + "-1", Namespace: ns,
			Labels: map[string]string{discovery.LabelServiceName: svcName(i)}},
		[]discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}}
}

// podSlice is Service i's EndpointSlice with one endpoint: pod.
func podSlice(i int, pod *testbed.Pod) *discovery.EndpointSlice {
	meta, ports := sliceMeta(i)
	node, ready := pod.Node.Name, true
	return &discovery.EndpointSlice{ObjectMeta: meta, AddressType: discovery.AddressTypeIPv4, Ports: ports,
		Endpoints: []discovery.Endpoint{{Addresses: []string{pod.IPv4.String()}, NodeName: &node,
			Conditions: discovery.EndpointConditions{Ready: &ready}}}}
}

// fakeSlice is Service i's EndpointSlice in generation gen: M addresses from
// 10.128.0.0/9; gen > 0 replaces the first with 10.200.0.0/14 + gen.
func (b *bench) fakeSlice(i, gen int) *discovery.EndpointSlice {
	meta, ports := sliceMeta(i)
	es := &discovery.EndpointSlice{ObjectMeta: meta, AddressType: discovery.AddressTypeIPv4, Ports: ports}
	base := uint32(10<<24|128<<16) + uint32(i*b.c.Endpoints)
	for j := 0; j < b.c.Endpoints; j++ {
		n := base + uint32(j)
		if j == 0 && gen > 0 {
			n = uint32(10<<24|200<<16) + uint32(gen%(1<<18))
		}
		addr := netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}).String()
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}})
	}
	return es
}

// move is one single change: the mover Service moves to the next server
// pod. It returns when that pod answers through the ClusterIP from the
// client (latency from just before the API write).
func (b *bench) move(cl *nsThread) (time.Duration, fails, error) {
	b.moves++
	pod := b.servers[1+b.moves%(nServers-1)]
	t0 := time.Now()
	_, err := b.client.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), podSlice(moverSvc, pod), metav1.UpdateOptions{})
	if err != nil {
		return 0, nil, err
	}
	lat, failures, err := cl.waitAnswer(b.moverAddr, pod.Name, t0, time.Second, time.Millisecond, 5*time.Minute)
	if err != nil {
		err = fmt.Errorf("%w\n%s", err, b.diagnose(cl, pod))
	}
	return lat, failures, err
}

// diagnose says what the client sees when a single change never shows in
// the data path: the pod directly, and the API's EndpointSlice.
func (b *bench) diagnose(cl *nsThread, pod *testbed.Pod) string {
	var sb strings.Builder
	cl.do(func() {
		name, d, err := dialOnce(fmt.Sprintf("%s:%d", pod.IPv4, serverPort), time.Second)
		fmt.Fprintf(&sb, "direct to %s: %q %v %v\n", pod.IPv4, name, d, err)
	})
	es, err := b.client.DiscoveryV1().EndpointSlices(ns).Get(context.Background(), svcName(moverSvc)+"-1", metav1.GetOptions{})
	if err != nil {
		fmt.Fprintf(&sb, "get EndpointSlice: %v\n", err)
	} else {
		fmt.Fprintf(&sb, "EndpointSlice %s (rv %s): %+v\n", es.Name, es.ResourceVersion, es.Endpoints)
	}
	return sb.String()
}

// churn writes EndpointSlice updates to the other Services at a fixed rate
// in the background.
type churn struct {
	stopc             chan struct{}
	wg                sync.WaitGroup
	start             time.Time
	updates, failures atomic.Int64
	missed            atomic.Int64 // ticks skipped because the writers were busy
}

func (b *bench) startChurn(rate float64) *churn {
	ch := &churn{stopc: make(chan struct{}), start: time.Now()}
	jobs := make(chan int, 64)
	others := b.c.Services - firstOther
	for w := 0; w < 8; w++ {
		ch.wg.Add(1)
		go func() {
			defer ch.wg.Done()
			for k := range jobs {
				i := firstOther + k%others
				gen := int(b.gen.Add(1))
				_, err := b.client.DiscoveryV1().EndpointSlices(ns).Update(context.Background(), b.fakeSlice(i, gen), metav1.UpdateOptions{})
				if err != nil {
					ch.failures.Add(1)
				} else {
					ch.updates.Add(1)
				}
			}
		}()
	}
	ch.wg.Add(1)
	go func() {
		defer ch.wg.Done()
		defer close(jobs)
		tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
		for k := b.churnNext; ; k++ {
			select {
			case <-ch.stopc:
				b.churnNext = k
				return
			case <-tick.C:
			}
			select {
			case jobs <- k:
			default:
				ch.missed.Add(1)
			}
		}
	}()
	return ch
}

// stop ends the churn and returns the achieved rate of successful updates.
func (ch *churn) stop() (rate float64, failures, missed int64) {
	close(ch.stopc)
	ch.wg.Wait()
	return float64(ch.updates.Load()) / time.Since(ch.start).Seconds(), ch.failures.Load(), ch.missed.Load()
}

// noopUpdates writes n API updates that change no proxy rule: annotations
// on Services and on EndpointSlices (half each), 8 writers.
func (b *bench) noopUpdates(n int) {
	others := b.c.Services - firstOther
	work := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				i := firstOther + k%others
				patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"bench.nftproxy.io/noop":"%d-%d"}}}`, k, time.Now().UnixNano()))
				var err error
				ctx := context.Background()
				if k%2 == 0 {
					_, err = b.client.CoreV1().Services(ns).Patch(ctx, svcName(i), types.MergePatchType, patch, metav1.PatchOptions{})
				} else {
					_, err = b.client.DiscoveryV1().EndpointSlices(ns).Patch(ctx, svcName(i)+"-1", types.MergePatchType, patch, metav1.PatchOptions{})
				}
				if err != nil {
					failed.Add(1)
				}
			}
		}()
	}
	for k := 0; k < n; k++ {
		work <- k
	}
	close(work)
	wg.Wait()
	if f := failed.Load(); f > 0 {
		b.tb.Fatalf("%d of %d no-op updates failed", f, n)
	}
}
