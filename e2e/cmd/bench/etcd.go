package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
)

// Writing the API state into etcd.
//
// The API server's ClusterIP allocator (v1.36, ipallocator.Allocator)
// counts every IPAddress object after each allocation (Used, and Free
// through Used): creating Service k costs O(k), 75 ms at k = 15,000 on
// this machine, and 100,000 Services would take hours to create through
// the API. With --populate etcd the bench writes what the API server would
// have stored for each other Service (the Service with its ClusterIP, its
// IPAddress, its EndpointSlice) straight into etcd, in transactions of
// etcdTxnOps puts; the API server's watch cache then serves them like any
// other object. The stable and mover Services, and every change during the
// measurement, still go through the API.

// etcdTxnOps is etcd's default --max-txn-ops.
const etcdTxnOps = 128

// etcdPrefix is the API server's default --etcd-prefix.
const etcdPrefix = "/registry"

// etcdWriter puts protobuf-encoded API objects into the bed's etcd through
// its JSON gateway (etcd listens on loopback of the control namespace).
type etcdWriter struct {
	hc    *http.Client
	codec serializer.CodecFactory
	ops   []map[string]any // the transaction being filled
	puts  int
}

func newEtcdWriter(b *bench) *etcdWriter {
	return &etcdWriter{hc: &http.Client{Transport: &http.Transport{DialContext: b.bed.Ctl.DialContext}, Timeout: time.Minute},
		codec: serializer.NewCodecFactory(scheme.Scheme)}
}

// put queues obj (of group version gv) under key, flushing a full
// transaction.
func (w *etcdWriter) put(key string, gv schema.GroupVersion, obj runtime.Object) error {
	info, ok := runtime.SerializerInfoForMediaType(w.codec.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		return fmt.Errorf("no protobuf serializer")
	}
	data, err := runtime.Encode(w.codec.EncoderForVersion(info.Serializer, gv), obj)
	if err != nil {
		return fmt.Errorf("encode %s: %w", key, err)
	}
	w.ops = append(w.ops, map[string]any{"requestPut": map[string]string{
		"key": base64.StdEncoding.EncodeToString([]byte(etcdPrefix + key)), "value": base64.StdEncoding.EncodeToString(data)}})
	if len(w.ops) == etcdTxnOps {
		return w.flush()
	}
	return nil
}

// flush sends the queued puts as one transaction.
func (w *etcdWriter) flush() error {
	if len(w.ops) == 0 {
		return nil
	}
	body, err := json.Marshal(map[string]any{"success": w.ops})
	if err != nil {
		return err
	}
	resp, err := w.hc.Post("http://127.0.0.1:2379/v3/kv/txn", "application/json", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("etcd txn: %w", err)
	}
	defer resp.Body.Close()
	reply, _ := io.ReadAll(resp.Body)
	var r struct {
		Succeeded bool `json:"succeeded"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(reply, &r) != nil || !r.Succeeded {
		return fmt.Errorf("etcd txn: %s: %.300s", resp.Status, reply)
	}
	w.puts += len(w.ops)
	w.ops = w.ops[:0]
	return nil
}

// populateEtcd writes Services [from, to) (none of them stable or mover)
// into etcd, with ClusterIPs from the top of the service range that the
// API server has not allocated, and waits until the API server lists them.
func (b *bench) populateEtcd(from, to int) {
	t0 := time.Now()
	ctx := context.Background()
	taken := map[netip.Addr]bool{}
	list, err := b.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	must(b.tb, err)
	for _, s := range list.Items {
		for _, ip := range s.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				taken[a] = true
			}
		}
	}
	w := newEtcdWriter(b)
	next := netip.MustParseAddr("10.111.255.254") // 10.96.0.0/12 from the top, down
	created := metav1.NewTime(time.Now())
	for i := from; i < to; i++ {
		for taken[next] {
			next = next.Prev()
		}
		ip := next
		next = next.Prev()
		svc, ipa, es := b.storedObjects(i, ip, created)
		must(b.tb, w.put("/services/specs/"+ns+"/"+svc.Name, v1.SchemeGroupVersion, svc))
		must(b.tb, w.put("/ipaddresses/"+ipa.Name, networking.SchemeGroupVersion, ipa))
		must(b.tb, w.put("/endpointslices/"+ns+"/"+es.Name, discovery.SchemeGroupVersion, es))
	}
	must(b.tb, w.flush())
	// A list without resourceVersion reads the latest state: once it holds
	// them all, the API server serves them (from its watch cache too).
	want := to - from
	for {
		n := 0
		opts := metav1.ListOptions{Limit: 500}
		for {
			l, err := b.client.DiscoveryV1().EndpointSlices(ns).List(ctx, opts)
			must(b.tb, err)
			n += len(l.Items)
			if opts.Continue = l.Continue; opts.Continue == "" {
				break
			}
		}
		if n >= want {
			break
		}
		if time.Since(t0) > 15*time.Minute {
			b.tb.Fatalf("the API server lists %d EndpointSlices, want at least %d", n, want)
		}
		time.Sleep(time.Second)
	}
	fmt.Printf("wrote Services, IPAddresses and EndpointSlices %d..%d (%d endpoints each) into etcd in %v (%d puts)\n",
		from, to-1, b.c.Endpoints, time.Since(t0).Round(100*time.Millisecond), w.puts)
}

// storedObjects are Service i, its IPAddress and its EndpointSlice as the
// API server stores them once created through the API (defaults filled,
// identity set; resourceVersion comes from etcd).
func (b *bench) storedObjects(i int, ip netip.Addr, created metav1.Time) (*v1.Service, *networking.IPAddress, *discovery.EndpointSlice) {
	uid := func(kind int) types.UID { return types.UID(fmt.Sprintf("6f1c2a4e-%04d-4000-8000-%012d", kind, i)) }
	single, cluster := v1.IPFamilyPolicySingleStack, v1.ServiceInternalTrafficPolicyCluster
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName(i), Namespace: ns, UID: uid(1), CreationTimestamp: created},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip.String(), ClusterIPs: []string{ip.String()},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
			SessionAffinity: v1.ServiceAffinityNone,
			Ports:           []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(80)}}},
	}
	ipa := &networking.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: ip.String(), UID: uid(2), CreationTimestamp: created, Labels: map[string]string{
			networking.LabelIPAddressFamily: string(v1.IPv4Protocol), networking.LabelManagedBy: "ipallocator.k8s.io"}},
		Spec: networking.IPAddressSpec{ParentRef: &networking.ParentReference{Resource: "services", Namespace: ns, Name: svc.Name}},
	}
	es := b.fakeSlice(i, 0)
	es.UID, es.CreationTimestamp = uid(3), created
	return svc, ipa, es
}
