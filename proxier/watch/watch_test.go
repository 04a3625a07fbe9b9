package watch

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/proxier/model"
)

func testService(name, ip string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: "1",
		Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": "{…}"}},
		Spec: v1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}}}}
}

func testSlice(name, svc string, addrs ...string) *discovery.EndpointSlice {
	pname, port, proto := "p", int32(8080), v1.ProtocolTCP
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a}})
	}
	return es
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestWatcherTracksConvertedObjects: adds, updates and deletes reach the
// trackers as model values, objects the proxy ignores count as deleted,
// problems are reported when they appear, and the informers cache only the
// converted values, never the API objects.
func TestWatcherTracksConvertedObjects(t *testing.T) {
	ignored := testService("ext", "")
	ignored.Spec.Type, ignored.Spec.ClusterIPs = v1.ServiceTypeExternalName, nil
	client := fake.NewClientset(testService("web", "10.96.0.10"), ignored,
		testSlice("web-1", "web", "10.244.1.11", "bogus"))
	tr := NewTrackers()
	var mu sync.Mutex
	invalid := map[string]int{}
	w, err := New(client, "n1", 0, tr, Hooks{Invalid: func(p Problem) { mu.Lock(); invalid[p.Reason]++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	svcs, slices := tr.Services.All(), tr.Slices.All()
	web := svcs[model.ServiceName{Namespace: "ns", Name: "web"}]
	if len(svcs) != 1 || web == nil || web.ClusterIPs[0].String() != "10.96.0.10" {
		t.Fatalf("services after sync: %+v", svcs)
	}
	if es := slices[model.SliceKey{Namespace: "ns", Name: "web-1"}]; len(slices) != 1 || es == nil || len(es.Endpoints) != 1 {
		t.Fatalf("slices after sync: %+v", slices)
	}
	mu.Lock()
	if invalid["invalid-address"] != 1 {
		t.Errorf("invalid address reported %d times, want 1", invalid["invalid-address"])
	}
	mu.Unlock()
	for _, inf := range w.informers[:2] { // Services, EndpointSlices
		for _, obj := range inf.GetStore().List() {
			switch obj.(type) {
			case *converted[model.Service], *converted[model.EndpointSlice]:
			default:
				t.Errorf("informer cached a %T", obj)
			}
		}
	}

	// web becomes ExternalName (ignored: deleted), ext gets a ClusterIP.
	web2 := testService("web", "")
	web2.Spec.Type, web2.Spec.ClusterIPs = v1.ServiceTypeExternalName, nil
	ext := testService("ext", "10.96.0.20")
	for _, s := range []*v1.Service{web2, ext} {
		if _, err := client.CoreV1().Services("ns").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "updates and delete tracked", func() bool {
		svcs, slices := tr.Services.All(), tr.Slices.All()
		return len(svcs) == 1 && svcs[model.ServiceName{Namespace: "ns", Name: "ext"}] != nil && len(slices) == 0
	})
}

// TestConvertForCacheIsIdempotent: the watch-list reflector transforms its
// initial objects twice; the second pass must keep the first's result.
func TestConvertForCacheIsIdempotent(t *testing.T) {
	for _, obj := range []any{testService("web", "10.96.0.10"), testSlice("web-1", "web", "10.244.1.11")} {
		once, _ := convertForCache(obj)
		twice, _ := convertForCache(once)
		if once != twice {
			t.Errorf("%T: second transform gave %T %p, want %p", obj, twice, twice, once)
		}
	}
}

// TestTombstoneDelete: a delete the informer missed (a tombstone holding
// the cached, converted object) deletes from the tracker.
func TestTombstoneDelete(t *testing.T) {
	tr := NewTrackers()
	c, _ := convertForCache(testService("web", "10.96.0.10"))
	h := tracking(Hooks{}.withDefaults(), "Service", tr.Services,
		func(ns, name string) model.ServiceName { return model.ServiceName{Namespace: ns, Name: name} })
	h.OnAdd(c, true)
	if tr.Services.Pending() != 1 {
		t.Fatal("add not tracked")
	}
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/web", Obj: c})
	if n := len(tr.Services.All()); n != 0 {
		t.Errorf("%d services left after the tombstone", n)
	}
}

// captureLog returns a logger that writes to a buffer, one line per call.
func captureLog() (*logLines, klog.Logger) {
	l := &logLines{}
	return l, funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{})
}

type logLines struct {
	mu    sync.Mutex
	lines []string
}

// count counts the lines that contain all of words.
func (l *logLines) count(words ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			n++
		}
	}
	return n
}

// TestProblemsReportedOnce: a problem is logged and counted once, when a
// version of the object brings it; not again when the informer resyncs
// (an update from the cached object to itself), relists (the object
// converted again) or an update keeps it. A new problem is reported, and
// so is an old one again after the object was deleted.
func TestProblemsReportedOnce(t *testing.T) {
	logs, logger := captureLog()
	tr := NewTrackers()
	reported := map[string]int{}
	h := tracking(Hooks{Invalid: func(p Problem) { reported[p.Reason]++ }, Log: logger}.withDefaults(), "Service", tr.Services,
		func(ns, name string) model.ServiceName { return model.ServiceName{Namespace: ns, Name: name} })
	bad := func(rv string, ports ...int32) any {
		s := testService("web", "10.96.0.10")
		s.ResourceVersion = rv
		for _, p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: fmt.Sprint("p", p), Port: p})
		}
		c, _ := convertForCache(s)
		return c
	}
	check := func(step string, invalidPort int) {
		t.Helper()
		if reported["invalid-port"] != invalidPort {
			t.Errorf("%s: invalid-port reported %d times, want %d", step, reported["invalid-port"], invalidPort)
		}
		if n := logs.count("Skipping invalid part of object", "invalid-port"); n != invalidPort {
			t.Errorf("%s: %d log lines, want %d", step, n, invalidPort)
		}
	}
	v1obj := bad("1", 0)
	h.OnAdd(v1obj, true)
	check("add", 1)
	h.OnUpdate(v1obj, v1obj)
	check("resync", 1)
	relisted := bad("1", 0)
	h.OnUpdate(v1obj, relisted)
	check("relist", 1)
	kept := bad("2", 0)
	h.OnUpdate(relisted, kept)
	check("update keeping the problem", 1)
	more := bad("3", 0, 70000)
	h.OnUpdate(kept, more)
	check("update adding one", 2)
	h.OnDelete(more)
	h.OnAdd(bad("4", 0), false)
	check("deleted and created again", 3)
}

// TestResyncDoesNotRepeatProblems: with the informers resyncing (every
// second, their minimum), a problem is still reported once.
func TestResyncDoesNotRepeatProblems(t *testing.T) {
	bad := testService("web", "10.96.0.10")
	bad.Spec.Ports = append(bad.Spec.Ports, v1.ServicePort{Name: "zero", Port: 0})
	client := fake.NewClientset(bad)
	var mu sync.Mutex
	events, invalid := 0, 0
	w, err := New(client, "n1", time.Second, NewTrackers(), Hooks{
		Event: func(kind string) {
			mu.Lock()
			defer mu.Unlock()
			if kind == "Service" {
				events++
			}
		},
		Invalid: func(Problem) { mu.Lock(); invalid++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		n := events
		mu.Unlock()
		if n >= 3 { // the add and two resyncs
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Service events in 10 s, want the add and two resyncs", n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if invalid != 1 {
		t.Errorf("problem reported %d times over %d events, want once", invalid, events)
	}
}
