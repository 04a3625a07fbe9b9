package main

import (
	"context"
	"net/netip"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// fakeKubelet plays kube-scheduler and every node's kubelet for the churn
// Deployments' pods, as kubemark's hollow kubelets do: it binds each new
// pod to the next node in turn, reports it running and ready at once with
// an address from the node's pod CIDR, and deletes a pod being deleted
// without waiting (no container to stop). No container runs and no packet
// is sent to these addresses.
//
// The Ready condition's transition time is what the EndpointSlice
// controller's trigger time follows, and the API server keeps it to the
// second: a kubelet's pod that turned ready at .9 of a second shows a
// network programming latency 0.9 s longer than its path took. The fake
// kubelet therefore reports a pod ready in the first readyAlign of a
// second, with that second as its transition time, so that the latency
// the proxies record is the path's own (docs/scale.md).
type fakeKubelet struct {
	client kubernetes.Interface
	queue  workqueue.TypedRateLimitingInterface[string]
	store  cache.Store
	stop   context.CancelFunc

	mu    sync.Mutex
	nodes []string
	cidrs map[string]netip.Prefix // node → its pod CIDR
	next  int                     // the node the next pod goes to
	used  map[string]int          // node → addresses handed out
}

// readyAlign: a pod turns ready at most this long after the second its
// Ready condition names.
const readyAlign = 50 * time.Millisecond

// fakeKubeletWorkers handle pods at once: binding, status and deletion are
// one API call each.
const fakeKubeletWorkers = 8

func startFakeKubelet(tb testbed.TB, cfg *rest.Config, nodes []string, cidrs map[string]netip.Prefix) *fakeKubelet {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "clusterbench-kubelet"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	k := &fakeKubelet{client: client, nodes: nodes, cidrs: cidrs, used: map[string]int{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(churnNS))
	inf := factory.Core().V1().Pods().Informer()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) }}); err != nil {
		tb.Fatal(err)
	}
	k.store = inf.GetStore()
	ctx, cancel := context.WithCancel(context.Background())
	k.stop = func() { cancel(); k.queue.ShutDown() }
	tb.Cleanup(k.stop)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		tb.Fatal("fake kubelet: the pod informer did not sync")
	}
	for range fakeKubeletWorkers {
		go k.work(ctx)
	}
	go k.heartbeats(ctx)
	return k
}

// heartbeatEvery is how often a kubelet renews its node's Lease (the
// kubelet's default: a tenth of the lease's 40 s).
const heartbeatEvery = 10 * time.Second

// heartbeats renews every node's Lease in kube-node-lease, spread over
// heartbeatEvery, as each node's kubelet does: the writes a real cluster's
// etcd sees all the time, which move its revision while the API server is
// down (so that a restarted server's watch caches start past every
// watcher's resource version, as in a real cluster).
func (k *fakeKubelet) heartbeats(ctx context.Context) {
	leases := k.client.CoordinationV1().Leases(v1.NamespaceNodeLease)
	held := map[string]*coordinationv1.Lease{}
	duration := int32(40)
	for {
		for _, node := range k.nodes {
			select {
			case <-ctx.Done():
				return
			case <-time.After(heartbeatEvery / time.Duration(len(k.nodes))):
			}
			now := metav1.NewMicroTime(time.Now())
			l := held[node]
			var err error
			if l == nil {
				l, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &duration, RenewTime: &now}},
					metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					l, err = leases.Get(ctx, node, metav1.GetOptions{})
				}
			} else {
				l = l.DeepCopy()
				l.Spec.RenewTime = &now
				l, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
			if err != nil {
				l = nil // read it again at the next round
			}
			held[node] = l
		}
	}
}

func (k *fakeKubelet) work(ctx context.Context) {
	for {
		key, quit := k.queue.Get()
		if quit {
			return
		}
		after, err := k.handle(ctx, key)
		switch {
		case err != nil && !apierrors.IsNotFound(err):
			k.queue.AddRateLimited(key)
		case after > 0:
			k.queue.Forget(key)
			k.queue.AddAfter(key, after)
		default:
			k.queue.Forget(key)
		}
		k.queue.Done(key)
	}
}

// handle moves one pod a step on: bound, then running and ready; a pod
// being deleted is deleted. A pod to turn ready at the next whole second
// comes back after the delay it returns.
func (k *fakeKubelet) handle(ctx context.Context, key string) (time.Duration, error) {
	obj, ok, err := k.store.GetByKey(key)
	if err != nil || !ok {
		return 0, err
	}
	pod := obj.(*v1.Pod)
	pods := k.client.CoreV1().Pods(pod.Namespace)
	switch {
	case pod.DeletionTimestamp != nil:
		zero := int64(0)
		return 0, pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
			Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	case pod.Spec.NodeName == "":
		return 0, pods.Bind(ctx, &v1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
			Target: v1.ObjectReference{Kind: "Node", Name: k.pick()}}, metav1.CreateOptions{})
	case pod.Status.PodIP == "":
		at := time.Now()
		second := at.Truncate(time.Second)
		if into := at.Sub(second); into > readyAlign {
			return time.Second - into, nil
		}
		pod = pod.DeepCopy()
		ip := k.address(pod.Spec.NodeName)
		now := metav1.NewTime(second)
		pod.Status.Phase = v1.PodRunning
		pod.Status.PodIP, pod.Status.PodIPs = ip, []v1.PodIP{{IP: ip}}
		pod.Status.StartTime = &now
		pod.Status.Conditions = nil
		for _, c := range []v1.PodConditionType{v1.PodScheduled, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
			pod.Status.Conditions = append(pod.Status.Conditions, v1.PodCondition{Type: c, Status: v1.ConditionTrue,
				LastTransitionTime: now})
		}
		_, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		return 0, err
	}
	return 0, nil
}

// pick is the node the next pod goes to.
func (k *fakeKubelet) pick() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := k.nodes[k.next%len(k.nodes)]
	k.next++
	return n
}

// address hands out the next address of node's pod CIDR: from .100 on, past
// the addresses of the bed's own pods on a real node, 150 in turn.
func (k *fakeKubelet) address(node string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	a := k.cidrs[node].Addr()
	for range 100 + k.used[node]%150 {
		a = a.Next()
	}
	k.used[node]++
	return a.String()
}

// waitReady waits until the churn namespace holds want pods, all ready.
func (k *fakeKubelet) waitReady(want int, limit time.Duration) bool {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		ready := 0
		for _, obj := range k.store.List() {
			if p := obj.(*v1.Pod); p.DeletionTimestamp == nil && p.Status.PodIP != "" {
				ready++
			}
		}
		if ready >= want {
			return true
		}
	}
	return false
}
