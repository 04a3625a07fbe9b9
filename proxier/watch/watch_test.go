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
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/proxier/changes"
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

// TestWatcherTracksConvertedObjects: adds, updates and deletes reach the
// trackers as model values, objects the proxy ignores count as deleted,
// and problems are reported when they appear.
func TestWatcherTracksConvertedObjects(t *testing.T) {
	ignored := testService("ext", "")
	ignored.Spec.Type, ignored.Spec.ClusterIPs = v1.ServiceTypeExternalName, nil
	client := fake.NewClientset(testService("web", "10.96.0.10"), ignored,
		testSlice("web-1", "web", "10.244.1.11", "bogus"))
	tr := NewTrackers(time.Time{})
	var mu sync.Mutex
	invalid := map[string]int{}
	w, err := New(API{Client: client}, "n1", 0, tr, Hooks{Invalid: func(p Problem) { mu.Lock(); invalid[p.Reason]++; mu.Unlock() }})
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
	testutil.Eventually(t, "updates and delete tracked", func() bool {
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

func newServiceStore(h Hooks, tr Trackers) *trackingStore[model.ServiceName, model.Service] {
	return newTrackingStore(h.withDefaults(), "Service", tr.Services,
		func(ns, name string) model.ServiceName { return model.ServiceName{Namespace: ns, Name: name} })
}

// TestProblemsReportedOnce: a problem is logged and counted once, when a
// version of the object brings it; not again when the reflector relists
// (the object converted again) or an update keeps it. A new problem is
// reported, and so is an old one again after the object was deleted.
func TestProblemsReportedOnce(t *testing.T) {
	logs, logger := captureLog()
	tr := NewTrackers(time.Time{})
	reported := map[string]int{}
	s := newServiceStore(Hooks{Invalid: func(p Problem) { reported[p.Reason]++ }, Log: logger}, tr)
	bad := func(ports ...int32) *v1.Service {
		s := testService("web", "10.96.0.10")
		for _, p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: fmt.Sprint("p", p), Port: p})
		}
		return s
	}
	check := func(step string, err error, invalidPort int) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if reported["invalid-port"] != invalidPort {
			t.Errorf("%s: invalid-port reported %d times, want %d", step, reported["invalid-port"], invalidPort)
		}
		if n := logs.count("Skipping invalid part of object", "invalid-port"); n != invalidPort {
			t.Errorf("%s: %d log lines, want %d", step, n, invalidPort)
		}
	}
	check("list", s.Replace([]any{bad(0)}, "1"), 1)
	check("relist", s.Replace([]any{bad(0)}, "2"), 1)
	converted, _ := convertForCache(bad(0))
	check("relist of converted objects", s.Replace([]any{converted}, "3"), 1)
	check("update keeping the problem", s.Update(bad(0)), 1)
	check("update adding one", s.Update(bad(0, 70000)), 2)
	check("delete", s.Delete(bad(0, 70000)), 2)
	check("created again", s.Add(bad(0)), 3)
	check("relist without it", s.Replace(nil, "4"), 3)
	check("relist with it again", s.Replace([]any{bad(0)}, "5"), 4)
}

// TestStoreReplace: a relist records the objects it holds, deletes those
// it does not (and those the proxy ignores), calls Changed once, and marks
// the store synced.
func TestStoreReplace(t *testing.T) {
	tr := NewTrackers(time.Time{})
	changed, events := 0, 0
	s := newServiceStore(Hooks{Changed: func() { changed++ }, Event: func(string) { events++ }}, tr)
	if s.hasSynced() {
		t.Fatal("synced before the first list")
	}
	ignored := testService("ext", "")
	ignored.Spec.Type, ignored.Spec.ClusterIPs = v1.ServiceTypeExternalName, nil
	if err := s.Replace([]any{testService("a", "10.96.0.1"), testService("b", "10.96.0.2"), ignored}, "1"); err != nil {
		t.Fatal(err)
	}
	if !s.hasSynced() || changed != 1 || events != 3 || len(tr.Services.All()) != 2 {
		t.Fatalf("after the list: synced %v, Changed %d times, %d events, services %v",
			s.hasSynced(), changed, events, tr.Services.All())
	}
	tr.Services.Checkout(func(model.ServiceName, changes.Change[*model.Service]) {})
	if err := s.Replace([]any{testService("a", "10.96.0.1"), testService("b", "10.96.0.2")}, "2"); err != nil {
		t.Fatal(err)
	}
	if changed != 1 || tr.Services.Pending() != 0 {
		t.Fatalf("relist of the same objects: Changed %d times, %d pending", changed, tr.Services.Pending())
	}
	if err := s.Replace([]any{testService("b", "10.96.0.3"), testService("c", "10.96.0.4")}, "3"); err != nil {
		t.Fatal(err)
	}
	got := map[model.ServiceName]changes.Change[*model.Service]{}
	tr.Services.Checkout(func(k model.ServiceName, c changes.Change[*model.Service]) { got[k] = c })
	a, b, c := got[model.ServiceName{Namespace: "ns", Name: "a"}], got[model.ServiceName{Namespace: "ns", Name: "b"}],
		got[model.ServiceName{Namespace: "ns", Name: "c"}]
	if changed != 2 || len(got) != 3 || !a.Deleted || b.Deleted || b.Value.ClusterIPs[0].String() != "10.96.0.3" || c.Deleted {
		t.Errorf("relist with changes: Changed %d times, pending %+v", changed, got)
	}
	if err := s.Replace([]any{&v1.Node{}}, "4"); err == nil {
		t.Error("a Node in a Service list was accepted")
	}
}

// TestStoreCountsUpdates: every add, update and delete of a tracked object
// counts as an update, changed or not (kube-proxy's changes_total count
// every event), and a relist counts the objects it changed; an object the
// proxy ignores counts only when ignoring it deletes what was tracked.
func TestStoreCountsUpdates(t *testing.T) {
	tr := NewTrackers(time.Time{})
	updates := 0
	s := newServiceStore(Hooks{Updated: func(kind string, n int) {
		if kind != KindService {
			t.Errorf("updates of %s counted by the Services' store", kind)
		}
		updates += n
	}}, tr)
	ignored := func(name string) *v1.Service {
		svc := testService(name, "")
		svc.Spec.Type, svc.Spec.ClusterIPs = v1.ServiceTypeExternalName, nil
		return svc
	}
	steps := []struct {
		what string
		do   func() error
		want int
	}{
		{"list of two and an ignored one", func() error {
			return s.Replace([]any{testService("a", "10.96.0.1"), testService("b", "10.96.0.2"), ignored("x")}, "1")
		}, 2},
		{"relist of the same", func() error {
			return s.Replace([]any{testService("a", "10.96.0.1"), testService("b", "10.96.0.2")}, "2")
		}, 0},
		{"update", func() error { return s.Update(testService("a", "10.96.0.3")) }, 1},
		{"update changing nothing", func() error { return s.Update(testService("a", "10.96.0.3")) }, 1},
		{"update of an ignored one", func() error { return s.Update(ignored("x")) }, 0},
		{"a tracked one becomes ignored", func() error { return s.Update(ignored("b")) }, 1},
		{"delete", func() error { return s.Delete(testService("a", "10.96.0.3")) }, 1},
		{"delete of an unknown one", func() error { return s.Delete(testService("zz", "10.96.0.9")) }, 0},
		{"relist adding one", func() error { return s.Replace([]any{testService("c", "10.96.0.4")}, "3") }, 1},
	}
	for _, st := range steps {
		before := updates
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		if got := updates - before; got != st.want {
			t.Errorf("%s: %d updates counted, want %d", st.what, got, st.want)
		}
	}
}

// TestSelectors: Services are listed and watched with kube-proxy's label
// and field selectors (no headless Service crosses the wire), and
// EndpointSlices with the label selector.
func TestSelectors(t *testing.T) {
	client := fake.NewClientset()
	w, err := New(API{Client: client}, "n1", 0, NewTrackers(time.Time{}), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	proxied, err := labels.Parse(ProxyLabelSelector)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{
		"services":       {proxied.String(), "spec.clusterIP!=None"},
		"endpointslices": {proxied.String(), ""},
	}
	seen := map[string]int{}
	for _, a := range client.Actions() {
		w, ok := want[a.GetResource().Resource]
		if !ok || (a.GetVerb() != "list" && a.GetVerb() != "watch") {
			continue
		}
		var lsel, fsel string
		switch a := a.(type) {
		case k8stesting.ListAction:
			lsel, fsel = a.GetListRestrictions().Labels.String(), a.GetListRestrictions().Fields.String()
		case k8stesting.WatchAction:
			lsel, fsel = a.GetWatchRestrictions().Labels.String(), a.GetWatchRestrictions().Fields.String()
		}
		if lsel != w[0] || fsel != w[1] {
			t.Errorf("%s %s with labels %q and fields %q, want %q and %q", a.GetVerb(), a.GetResource().Resource, lsel, fsel, w[0], w[1])
		}
		seen[a.GetResource().Resource]++
	}
	if seen["services"] == 0 || seen["endpointslices"] == 0 {
		t.Errorf("calls seen: %v", seen)
	}
}
