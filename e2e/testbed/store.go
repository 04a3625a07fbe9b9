package testbed

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

// Writing API state straight into etcd.
//
// The API server's ClusterIP allocator (v1.36, ipallocator.Allocator)
// counts every IPAddress object after each allocation: creating Service k
// costs O(k), 75 ms at k = 15,000 on our machines, and 100,000 Services
// would take hours to create through the API. Store writes what the API
// server would have stored for each Service (the Service with its
// ClusterIP, its IPAddress, its EndpointSlice) straight into etcd; the API
// server's watch cache then serves them like any other object.

// etcdTxnOps is etcd's default --max-txn-ops.
const etcdTxnOps = 128

// etcdPrefix is the API server's default --etcd-prefix.
const etcdPrefix = "/registry"

// StoredService is a selector-less ClusterIP Service (single-stack IPv4)
// with one EndpointSlice, for Store.
type StoredService struct {
	Name  string
	Ports []v1.ServicePort // Name, Port, Protocol; TargetPort defaults to Port
	// Slice is the Service's EndpointSlice (name, labels, addresses,
	// ports); Store sets its namespace and identity.
	Slice *discovery.EndpointSlice
}

// Store writes svcs into etcd in namespace ns (which must exist), with
// ClusterIPs from the top of the service range that the API server has not
// allocated, and waits until the API server lists them. It returns the
// ClusterIP of each, in order.
func (b *Bed) Store(ns string, svcs []StoredService) ([]netip.Addr, error) {
	t0 := time.Now()
	ctx := context.Background()
	taken := map[netip.Addr]bool{}
	list, err := b.client.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, s := range list.Items {
		for _, ip := range s.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil {
				taken[a] = true
			}
		}
	}
	w := b.EtcdWriter()
	next := netip.MustParseAddr("10.111.255.254") // 10.96.0.0/12 from the top, down
	created := metav1.NewTime(time.Now())
	ips := make([]netip.Addr, 0, len(svcs))
	for i, s := range svcs {
		for taken[next] {
			next = next.Prev()
		}
		ip := next
		next = next.Prev()
		ips = append(ips, ip)
		svc, ipa, es := storedObjects(ns, s, ip, created, i)
		for _, put := range []struct {
			key string
			gv  schema.GroupVersion
			obj runtime.Object
		}{
			{"/services/specs/" + ns + "/" + svc.Name, v1.SchemeGroupVersion, svc},
			{"/ipaddresses/" + ipa.Name, networking.SchemeGroupVersion, ipa},
			{"/endpointslices/" + ns + "/" + es.Name, discovery.SchemeGroupVersion, es},
		} {
			if err := w.Put(put.key, put.gv, put.obj); err != nil {
				return nil, err
			}
		}
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	if err := b.waitListed(ctx, ns, len(svcs), 15*time.Minute); err != nil {
		return nil, err
	}
	b.t.Logf("testbed: stored %d Services with their EndpointSlices in etcd in %v (%d puts)",
		len(svcs), time.Since(t0).Round(100*time.Millisecond), w.puts)
	return ips, nil
}

// waitListed waits until the API server lists at least want EndpointSlices
// in ns: a list without resourceVersion reads the latest state, and once it
// holds them all, the API server serves them (from its watch cache too).
func (b *Bed) waitListed(ctx context.Context, ns string, want int, limit time.Duration) error {
	for deadline := time.Now().Add(limit); ; time.Sleep(time.Second) {
		n := 0
		opts := metav1.ListOptions{Limit: 500}
		for {
			l, err := b.client.DiscoveryV1().EndpointSlices(ns).List(ctx, opts)
			if err != nil {
				return err
			}
			n += len(l.Items)
			if opts.Continue = l.Continue; opts.Continue == "" {
				break
			}
		}
		if n >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the API server lists %d EndpointSlices in %s, want at least %d", n, ns, want)
		}
	}
}

// WaitRepaired waits, up to limit, until the API server's ClusterIP
// repair controller has nothing left to do, for measurements that must not
// share the API server's CPU with it. After Store, its informers see some
// Services before their IPAddresses and it "repairs" each: a create, which
// fails (the address exists), and an Event, retried with a backoff through
// a queue drained at ten a second. At 100,000 Services that lasted from
// seconds to over ten minutes, whatever order the objects were written in.
// Done is: the controller's Service queue ("services" in the API server's
// workqueue metrics) empty, with no retry, for 5 s.
func (b *Bed) WaitRepaired(limit time.Duration) error {
	ctx := context.Background()
	read := func() (depth, retries float64, err error) {
		raw, err := b.client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return 0, 0, err
		}
		return sumSamples(string(raw), "workqueue_depth", "name=services"),
			sumSamples(string(raw), "workqueue_retries_total", "name=services"), nil
	}
	t0 := time.Now()
	quietSince, lastRetries := t0, -1.0
	for ; time.Since(t0) < limit; time.Sleep(500 * time.Millisecond) {
		depth, retries, err := read()
		if err != nil {
			return err
		}
		if depth > 0 || retries != lastRetries {
			quietSince, lastRetries = time.Now(), retries
		}
		if time.Since(quietSince) >= 5*time.Second {
			b.t.Logf("testbed: the API server's ClusterIP repair queue empty after %v (%.0f retries)",
				time.Since(t0).Round(100*time.Millisecond), retries)
			return nil
		}
	}
	b.t.Logf("testbed: the API server's ClusterIP repair queue still busy after %v; going on", limit)
	return nil
}

// storedObjects are a Service, its IPAddress and its EndpointSlice as the
// API server stores them once created through the API (defaults filled,
// identity set; resourceVersion comes from etcd).
func storedObjects(ns string, s StoredService, ip netip.Addr, created metav1.Time, i int) (*v1.Service, *networking.IPAddress, *discovery.EndpointSlice) {
	uid := func(kind int) types.UID { return types.UID(fmt.Sprintf("6f1c2a4e-%04d-4000-8000-%012d", kind, i)) }
	single, cluster := v1.IPFamilyPolicySingleStack, v1.ServiceInternalTrafficPolicyCluster
	ports := make([]v1.ServicePort, len(s.Ports))
	for j, p := range s.Ports {
		if p.TargetPort == (intstr.IntOrString{}) {
			p.TargetPort = intstr.FromInt32(p.Port)
		}
		ports[j] = p
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: ns, UID: uid(1), CreationTimestamp: created},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip.String(), ClusterIPs: []string{ip.String()},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
			SessionAffinity: v1.ServiceAffinityNone, Ports: ports},
	}
	ipa := &networking.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: ip.String(), UID: uid(2), CreationTimestamp: created, Labels: map[string]string{
			networking.LabelIPAddressFamily: string(v1.IPv4Protocol), networking.LabelManagedBy: "ipallocator.k8s.io"}},
		Spec: networking.IPAddressSpec{ParentRef: &networking.ParentReference{Resource: "services", Namespace: ns, Name: svc.Name}},
	}
	es := s.Slice.DeepCopy()
	es.Namespace, es.UID, es.CreationTimestamp = ns, uid(3), created
	return svc, ipa, es
}

// EtcdWriter puts protobuf-encoded API objects into the bed's etcd through
// its JSON gateway (etcd listens on loopback of the control namespace), in
// transactions of etcdTxnOps puts.
type EtcdWriter struct {
	hc    *http.Client
	codec serializer.CodecFactory
	ops   []map[string]any // the transaction being filled
	puts  int
}

// EtcdWriter returns a writer into the bed's etcd.
func (b *Bed) EtcdWriter() *EtcdWriter {
	return &EtcdWriter{hc: &http.Client{Transport: &http.Transport{DialContext: b.Ctl.DialContext}, Timeout: time.Minute},
		codec: serializer.NewCodecFactory(scheme.Scheme)}
}

// Put queues obj (of group version gv) under key (below the API server's
// prefix), sending a full transaction.
func (w *EtcdWriter) Put(key string, gv schema.GroupVersion, obj runtime.Object) error {
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
		return w.Flush()
	}
	return nil
}

// Flush sends the queued puts as one transaction.
func (w *EtcdWriter) Flush() error {
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
