package scenarios

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// latencyMinSync is both proxies' --iptables-min-sync-period in
// TestProgrammingLatencyLikeKubeProxy: long enough that the updates written
// after a sync wait for the next one together.
const latencyMinSync = 3 * time.Second

// latencyReading is what a proxy's metrics say of the updates it saw.
type latencyReading struct {
	count, sum, changes, serviceEvents float64
}

// TestProgrammingLatencyLikeKubeProxy feeds nftproxy (n1) and upstream
// kube-proxy (n2) the same EndpointSlice updates, with trigger times as the
// EndpointSlice controller writes them, and compares what each records:
// kubeproxy_network_programming_duration_seconds must have a sample for
// every update made after the proxy started, each from its own trigger
// time, also when one sync takes several updates together (here: every
// update after the first waits for the min sync period), and
// kubeproxy_sync_proxy_rules_endpoint_changes_total must count every
// update. The two proxies sync at nearly the same moments, so their sums
// agree within a fraction of a second per sample. A headless Service is
// not even sent to nftproxy (kube-proxy's field selector).
func TestProgrammingLatencyLikeKubeProxy(t *testing.T) {
	testbed.RequirePrivileges(t)
	bed := testbed.Start(t, testbed.Options{})
	client := bed.Client()
	const ns = "latency"
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "other"} {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP}}}}
		createService(t, client, svc, false, nil)
	}
	before := time.Now().Add(-time.Hour) // a trigger time from before the proxies started
	writeSlice(t, client, ns, "web", "web-1", before, "10.244.3.11")
	writeSlice(t, client, ns, "other", "other-1", before, "10.244.3.21")

	n1, n2 := bed.AddNode("n1"), bed.AddNode("n2")
	nftproxy := testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	kp := filepath.Join(testbed.EnsureBinaries(t), "kube-proxy")
	common := func(n *testbed.Node) []string {
		return []string{"--kubeconfig", bed.ProxyKubeconfig, "--hostname-override", n.Name, "--cluster-cidr", clusterCIDRs,
			"--iptables-min-sync-period", latencyMinSync.String(), "--metrics-bind-address", "127.0.0.1:10249"}
	}
	n1.Start(append([]string{nftproxy}, common(n1)...)...)
	n2.Start(append(testbed.KubeProxyArgs(kp, "nftables"), common(n2)...)...)
	nodes := []*testbed.Node{n1, n2}
	waitFor(t, time.Minute, "both proxies' first full syncs", func() bool { return testbed.FullSyncs(n1.Netns) && testbed.FullSyncs(n2.Netns) })

	// u0 reaches both proxies idle, and each syncs at once; the updates
	// after it wait out the min sync period from that sync, together.
	read := func(n *testbed.Node) latencyReading {
		t.Helper()
		m := func(name string, labels ...string) float64 {
			v, err := testbed.Metric(n.Netns, name, labels...)
			if err != nil {
				t.Fatalf("%s on %s: %v", name, n.Name, err)
			}
			return v
		}
		return latencyReading{
			count:   m("kubeproxy_network_programming_duration_seconds_count", "ip_family=IPv4"),
			sum:     m("kubeproxy_network_programming_duration_seconds_sum", "ip_family=IPv4"),
			changes: m("kubeproxy_sync_proxy_rules_endpoint_changes_total"),
		}
	}
	time.Sleep(latencyMinSync) // both idle for a min sync period
	writeSlice(t, client, ns, "web", "web-1", time.Now(), "10.244.3.12")
	waitFor(t, time.Minute, "u0's sample on both", func() bool { return read(n1).count >= 1 && read(n2).count >= 1 })
	start := [2]latencyReading{read(n1), read(n2)}
	events0, err := testbed.Metric(n1.Netns, "nftproxy_api_events_total", "kind=Service")
	if err != nil {
		t.Fatal(err)
	}

	headless := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "headless", Namespace: ns},
		Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Ports: []v1.ServicePort{{Name: "tcp", Port: 80}}}}
	if _, err := client.CoreV1().Services(ns).Create(ctx, headless, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The updates, and what kube-proxy's semantics make of each.
	const wantSamples, wantChanges = 4, 6
	writeSlice(t, client, ns, "web", "web-1", time.Now(), "10.244.3.13") // u1: a sample
	time.Sleep(time.Second)
	u2 := time.Now()
	writeSlice(t, client, ns, "web", "web-1", u2, "10.244.3.14")                                                   // u2: a sample
	writeSlice(t, client, ns, "web", "web-1", u2, "10.244.3.14", "example.com/team=a")                             // u3: a label only: a sample
	writeSlice(t, client, ns, "web", "web-2", time.Now(), "10.244.3.15")                                           // u4: a new slice: a sample
	writeSlice(t, client, ns, "web", "web-old", before, "10.244.3.16")                                             // u5: triggered before the start: none
	if err := client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, "other-1", metav1.DeleteOptions{}); err != nil { // u6: none
		t.Fatal(err)
	}
	// Until both have what kube-proxy's semantics want, or a minute: the
	// comparisons below say what is missing.
	var got [2]latencyReading
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		for i, n := range nodes {
			r := read(n)
			got[i] = latencyReading{count: r.count - start[i].count, sum: r.sum - start[i].sum, changes: r.changes - start[i].changes}
		}
		if got[0].count >= wantSamples && got[1].count >= wantSamples && got[0].changes >= wantChanges && got[1].changes >= wantChanges {
			break
		}
	}
	// A last update, synced after all of the above by both: anything a
	// proxy recorded late would show in the counts.
	time.Sleep(latencyMinSync)
	writeSlice(t, client, ns, "web", "web-2", time.Now(), "10.244.3.17")
	waitFor(t, time.Minute, "the last update on both", func() bool {
		return read(n1).count-start[0].count > got[0].count && read(n2).count-start[1].count > got[1].count
	})
	for i, n := range nodes {
		r := read(n)
		if c := r.count - start[i].count - 1; c != got[i].count {
			t.Errorf("%s recorded %v samples late", n.Name, c-got[i].count)
		}
	}
	t.Logf("nftproxy:   %v samples summing %.3f s, %v endpoint changes", got[0].count, got[0].sum, got[0].changes)
	t.Logf("kube-proxy: %v samples summing %.3f s, %v endpoint changes", got[1].count, got[1].sum, got[1].changes)
	for i, who := range []string{"nftproxy", "kube-proxy"} {
		if got[i].count != wantSamples || got[i].changes != wantChanges {
			t.Errorf("%s: %v samples and %v endpoint changes, want %d and %d", who, got[i].count, got[i].changes, wantSamples, wantChanges)
		}
	}
	if got[0].count != got[1].count || got[0].changes != got[1].changes {
		t.Errorf("nftproxy recorded %v samples and %v changes, kube-proxy %v and %v", got[0].count, got[0].changes, got[1].count, got[1].changes)
	}
	if d := math.Abs(got[0].sum - got[1].sum); d > 0.5*wantSamples {
		t.Errorf("the samples sum to %.3f s on nftproxy and %.3f s on kube-proxy: more apart than their syncs can explain", got[0].sum, got[1].sum)
	}
	if events, err := testbed.Metric(n1.Netns, "nftproxy_api_events_total", "kind=Service"); err != nil || events != events0 {
		t.Errorf("nftproxy received %v Service events (%v) for a headless Service, want none", events-events0, err)
	}
}

// writeSlice creates or replaces EndpointSlice name of Service svc, with the
// given trigger time, one ready endpoint on port 8080 per address, and a
// label "k=v" if given.
func writeSlice(t *testing.T, client kubernetes.Interface, ns, svc, name string, trigger time.Time, addr string, label ...string) {
	t.Helper()
	port, proto, pname := int32(backendPort), v1.ProtocolTCP, "tcp"
	ready := true
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels:      map[string]string{discovery.LabelServiceName: svc},
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.Format(time.RFC3339Nano)}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Protocol: &proto, Port: &port}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{addr}, Conditions: discovery.EndpointConditions{Ready: &ready}}},
	}
	for _, l := range label {
		k, v, _ := strings.Cut(l, "=")
		es.Labels[k] = v
	}
	ctx := context.Background()
	old, err := client.DiscoveryV1().EndpointSlices(ns).Get(ctx, name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = client.DiscoveryV1().EndpointSlices(ns).Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = client.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("write EndpointSlice %s: %v", name, err)
	}
}

// waitFor polls cond every 100 ms until it holds, failing the test after
// limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
	}
}
