package proxier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/trace"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

func service(ns, name, ip string, port int32, proto v1.Protocol) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "p", Port: port, Protocol: proto}}},
	}
}

func slice(ns, svc, name string, port int32, proto v1.Protocol, addrs ...string) *discovery.EndpointSlice {
	pname := "p"
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a}})
	}
	return es
}

// onNode puts every endpoint of es on node.
func onNode(node string, es *discovery.EndpointSlice) *discovery.EndpointSlice {
	for i := range es.Endpoints {
		es.Endpoints[i].NodeName = &node
	}
	return es
}

type harness struct {
	local  []netip.Addr // the node's addresses, for the tracer
	t      *testing.T
	client *fake.Clientset
	fk     *nftfake.Fake
	p      *Proxier
}

func start(t *testing.T, objs ...runtime.Object) *harness {
	return startWith(t, func(*Deps) {}, objs...)
}

// startWith starts a proxier whose Deps the caller may add to.
func startWith(t *testing.T, deps func(*Deps), objs ...runtime.Object) *harness {
	t.Helper()
	return startWithConfig(t, func(*Config) {}, deps, objs...)
}

// startWithConfig is startWith with the proxier's configuration changed by
// cfg first.
func startWithConfig(t *testing.T, cfg func(*Config), deps func(*Deps), objs ...runtime.Object) *harness {
	t.Helper()
	h := &harness{t: t, client: fake.NewClientset(objs...), fk: nftfake.New()}
	d := Deps{Client: h.client, NFT: map[nft.Family]nft.Backend{nft.IPv4: h.fk}}
	deps(&d)
	c := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Minute,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	cfg(&c)
	var err error
	h.p, err = New(c, d)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h
}

// eventually waits for the packet to get the wanted DNAT targets.
func (h *harness) eventually(pkt trace.Packet, want nft.VerdictKind, dnat ...string) {
	h.t.Helper()
	var wantAP []netip.AddrPort
	for _, d := range dnat {
		wantAP = append(wantAP, netip.MustParseAddrPort(d))
	}
	var res trace.Result
	if testutil.Poll(func() bool {
		res = trace.New(h.fk.Rulesets(), h.local...).Trace(pkt)
		return res.Verdict == want && slices.Equal(res.DNAT, wantAP)
	}) {
		return
	}
	h.t.Fatalf("packet %+v: got %s %v, want %s %v\n%s", pkt, res.Verdict, res.DNAT, want, wantAP, h.fk.Dump(nft.IPv4))
}

func tcp(dst string, port uint16) trace.Packet {
	return trace.Packet{Src: netip.MustParseAddr("10.244.1.5"), Dst: netip.MustParseAddr(dst), Proto: nft.ProtoTCP, DPort: port}
}

func TestServiceLifecycle(t *testing.T) {
	h := start(t, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP))
	ctx := context.Background()
	h.eventually(tcp("10.96.0.10", 80), trace.VerdictReject) // no endpoints yet

	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")

	es = slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11", "10.244.2.12")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080", "10.244.2.12:8080")

	if err := h.client.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictDrop) // now unallocated
}

// TestBadInputIsSkipped: an invalid endpoint address, an invalid ClusterIP
// and an unknown protocol are skipped: they produce no rules and are
// counted once each; other Services keep working. (TestBadInput has every
// other kind of bad input.)
func TestBadInputIsSkipped(t *testing.T) {
	bad := service("default", "bad-ip", "not-an-ip", 80, v1.ProtocolTCP)
	badProto := service("default", "bad-proto", "10.96.0.30", 80, "ICMP")
	before := problemCounts()
	h := start(t,
		service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11", "999.1.1.1", "fe80::1", "127.0.0.1"),
		bad, badProto,
	)
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")
	// bad-proto has no port left: its ClusterIP is not live, and traffic
	// to it is dropped as to any unallocated address.
	h.eventually(tcp("10.96.0.30", 80), nft.VerdictDrop)
	dump := h.fk.Dump(nft.IPv4)
	for _, s := range []string{"bad-ip", "bad-proto", "10.96.0.30", "999.1.1.1", "fe80::1", "127.0.0.1"} {
		if strings.Contains(dump, s) {
			t.Errorf("the table holds %q:\n%s", s, grep(dump, s))
		}
	}
	want := map[problemKey]float64{{"EndpointSlice", "invalid-address"}: 3, {"Service", "invalid-cluster-ip"}: 1,
		{"Service", "invalid-protocol"}: 1}
	if got := countedSince(before); !maps.Equal(got, want) {
		t.Errorf("counted %v, want %v", got, want)
	}
}

// TestFailedSyncIsRetried: a transaction the kernel refuses is retried, the
// change is not lost, and the retry rewrites the table whole.
func TestFailedSyncIsRetried(t *testing.T) {
	h := start(t, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP))
	h.eventually(tcp("10.96.0.10", 80), trace.VerdictReject)
	h.fk.FailNext = errors.New("injected ENOBUFS")
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")
}

// TestSingleChangeCostsItsSize: with 2,000 Services programmed, moving one
// endpoint sends a transaction of a few operations, not a rewrite.
func TestSingleChangeCostsItsSize(t *testing.T) {
	var objs []runtime.Object
	for i := 0; i < 2000; i++ {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		name := fmt.Sprintf("svc-%d", i)
		objs = append(objs, service("default", name, ip, 80, v1.ProtocolTCP),
			slice("default", name, name+"-1", 8080, v1.ProtocolTCP, fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)))
	}
	// The first table is written in pieces: a Service answers once its
	// piece is in, before the last piece is. Count from the end of the
	// first sync.
	synced := make(chan struct{})
	h := startWith(t, func(d *Deps) { d.FirstSync = func(context.Context, nft.Family) { close(synced) } }, objs...)
	<-synced
	h.eventually(tcp("10.96.7.250", 80), nft.VerdictAccept, "10.244.7.250:8080")
	before := h.fk.Ops
	es := slice("default", "svc-1999", "svc-1999-1", 8080, v1.ProtocolTCP, "10.244.99.1")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.7.250", 80), nft.VerdictAccept, "10.244.99.1:8080")
	// The endpoints map's element out and in (the bound leaves room for a
	// hairpin element out and in).
	if ops := h.fk.Ops - before; ops > 4 {
		t.Errorf("one endpoint change took %d operations", ops)
	}
}

// testServices are Services using every feature that shapes a fragment
// (NodePort, external and load balancer IPs with source ranges, traffic
// policies, session affinity), with one EndpointSlice each; gen moves
// their endpoints.
func testServices(n, gen int) ([]*model.Service, []*model.EndpointSlice) {
	var svcs []*model.Service
	var slices []*model.EndpointSlice
	for i := 0; i < n; i++ {
		name := model.ServiceName{Namespace: "ns", Name: fmt.Sprintf("svc-%d", i)}
		svc := &model.Service{Name: name, ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 96, 1, byte(i)})},
			Ports: []model.ServicePort{{Name: "p", Protocol: nft.ProtoTCP, Port: 80}}}
		switch i % 5 {
		case 1:
			svc.Ports[0].NodePort = uint16(30000 + i)
			svc.ExternalLocal, svc.HealthCheckNodePort = true, uint16(32000+i)
		case 2:
			svc.LoadBalancerIPs = []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})}
			svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
			svc.ExternalIPs = []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, byte(i)})}
		case 3:
			svc.AffinityTimeout = time.Duration(i) * time.Minute
		case 4:
			svc.InternalLocal = true
		}
		es := &model.EndpointSlice{Name: name.Name + "-1", Service: name, Family: nft.IPv4,
			Ports: []model.EndpointPort{{Name: "p", Protocol: nft.ProtoTCP, Port: 8080}}}
		for j := 0; j < i%4; j++ {
			es.Endpoints = append(es.Endpoints, model.Endpoint{IP: model.IPOf(netip.AddrFrom4([4]byte{10, 244, byte(gen + j), byte(i)})),
				Ready: true, Serving: true, Place: &model.Placement{NodeName: fmt.Sprintf("n%d", (i+j+gen)%3)}})
		}
		svcs, slices = append(svcs, svc), append(slices, es)
	}
	return svcs, slices
}

func setAll(p *Proxier, svcs []*model.Service, slices []*model.EndpointSlice) {
	for i, svc := range svcs {
		p.trackers.Services.Set(svc.Name, svc)
		p.trackers.Slices.Set(model.SliceKey{Namespace: svc.Name.Namespace, Name: slices[i].Name}, slices[i])
	}
}

// TestIncrementalSyncsMatchFullBuild: the proxier keeps no fragments and
// rebuilds a Service's old fragment from its programmed ports and the
// configuration they were built with. After changes of Services,
// endpoints, the node (addresses, pod CIDRs: NodeCIDR local detection; its
// zone, which picks the endpoints of topology hints) and the Service CIDRs,
// the table equals a fresh proxier's.
func TestIncrementalSyncsMatchFullBuild(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour,
		LocalDetect:  LocalDetect{Mode: DetectNodeCIDR},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}
	newProxier := func() (*Proxier, *nftfake.Fake) {
		fk := nftfake.New()
		p, err := New(cfg, Deps{NFT: map[nft.Family]nft.Backend{nft.IPv4: fk}})
		if err != nil {
			t.Fatal(err)
		}
		return p, fk
	}
	node := func(addr, podCIDR, zone string) model.Node {
		return model.Node{Name: "n1", Zone: zone, Addresses: []netip.Addr{netip.MustParseAddr(addr)},
			PodCIDRs: []netip.Prefix{netip.MustParsePrefix(podCIDR)}}
	}
	// Every endpoint hinted for zone a or b, alternately: the zone of the
	// node decides which endpoints a Service has.
	hinted := func(svcs []*model.Service, slices []*model.EndpointSlice) ([]*model.Service, []*model.EndpointSlice) {
		for i, es := range slices {
			c := *es
			c.Endpoints = append([]model.Endpoint(nil), es.Endpoints...)
			for j := range c.Endpoints {
				place := &model.Placement{Zones: []string{[]string{"a", "b"}[j%2]}}
				if e := c.Endpoints[j]; e.Place != nil {
					place.NodeName = e.Place.NodeName
				}
				c.Endpoints[j].Place = place
			}
			slices[i] = &c
		}
		return svcs, slices
	}
	sync := func(p *Proxier) {
		t.Helper()
		if err := p.sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p, fk := newProxier()
	p.setNode(node("10.10.0.11", "10.244.1.0/24", "a"))
	svcs, slices := hinted(testServices(40, 0))
	setAll(p, svcs, slices)
	sync(p)

	// The configuration changes with some Services: every Service is
	// rebuilt, each releasing the fragment built with the old one.
	p.setNode(node("10.10.0.12", "10.244.2.0/24", "b"))
	p.setAPIServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")})
	svcs2, slices2 := hinted(testServices(40, 1))
	setAll(p, svcs2[:20], slices2[:20])
	sync(p)
	// Then only Services change, some are deleted.
	setAll(p, svcs2[20:30], slices2[20:30])
	for _, svc := range svcs2[30:35] {
		p.trackers.Services.Delete(svc.Name)
	}
	sync(p)
	svcs3, slices3 := hinted(testServices(40, 2))
	setAll(p, svcs3[5:15], slices3[5:15])
	sync(p)

	want, wantFk := newProxier()
	want.setNode(node("10.10.0.12", "10.244.2.0/24", "b"))
	want.setAPIServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")})
	final, finalSlices := append([]*model.Service(nil), svcs...), append([]*model.EndpointSlice(nil), slices...)
	copy(final[:20], svcs2[:20])
	copy(finalSlices[:20], slices2[:20])
	copy(final[20:30], svcs2[20:30])
	copy(finalSlices[20:30], slices2[20:30])
	copy(final[5:15], svcs3[5:15])
	copy(finalSlices[5:15], slices3[5:15])
	setAll(want, append(final[:30:30], final[35:]...), append(finalSlices[:30:30], finalSlices[35:]...))
	for _, es := range finalSlices[30:35] {
		want.trackers.Slices.Set(model.SliceKey{Namespace: "ns", Name: es.Name}, es)
	}
	sync(want)
	// Released slots are reused, so the slots differ from a fresh build's.
	canon := func(rs *nft.Ruleset) string { return ruleset.CanonicalSlots(rs).Dump() }
	if got, w := canon(fk.Ruleset(nft.IPv4)), canon(wantFk.Ruleset(nft.IPv4)); got != w {
		t.Errorf("table after incremental syncs differs from a fresh build:\n%s\nwant:\n%s", got, w)
	}
	if got, w := canon(p.families[nft.IPv4].editor.Ruleset()), canon(want.families[nft.IPv4].editor.Ruleset()); got != w {
		t.Errorf("editor's ruleset after incremental syncs differs from a fresh build:\n%s\nwant:\n%s", got, w)
	}
}

// TestChangeRevertedAfterFailedSync: a change whose sync one family's
// kernel refused, then reverted before the retry, is reverted in both
// families' tables: the one that failed (its retry rewrites it) and the
// one that had programmed the change. Both tables then equal a fresh
// proxier's.
func TestChangeRevertedAfterFailedSync(t *testing.T) {
	cfg := Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour}
	newProxier := func() (*Proxier, map[nft.Family]*nftfake.Fake) {
		fks := map[nft.Family]*nftfake.Fake{nft.IPv4: nftfake.New(), nft.IPv6: nftfake.New()}
		p, err := New(cfg, Deps{NFT: map[nft.Family]nft.Backend{nft.IPv4: fks[nft.IPv4], nft.IPv6: fks[nft.IPv6]}})
		if err != nil {
			t.Fatal(err)
		}
		return p, fks
	}
	// Service 3 is dual-stack, with an EndpointSlice of each family.
	svcs, slices := testServices(8, 0)
	svc3 := *svcs[3]
	svc3.ClusterIPs = append(append([]netip.Addr(nil), svc3.ClusterIPs...), netip.MustParseAddr("fd00:96::3"))
	svcs[3] = &svc3
	v6 := &model.EndpointSlice{Name: "svc-3-2", Service: svc3.Name, Family: nft.IPv6, Ports: slices[3].Ports,
		Endpoints: []model.Endpoint{{IP: model.IPOf(netip.MustParseAddr("fd00:244::3")), Ready: true, Serving: true}}}
	// The change: Service 3's port.
	changed := svc3
	changed.Ports = []model.ServicePort{{Name: "p", Protocol: nft.ProtoTCP, Port: 81}}
	setup := func(p *Proxier) {
		setAll(p, svcs, slices)
		p.trackers.Slices.Set(model.SliceKey{Namespace: "ns", Name: v6.Name}, v6)
	}
	canon := func(rs *nft.Ruleset) string { return ruleset.CanonicalSlots(rs).Dump() }
	for _, failing := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(failing.IPFamily(), func(t *testing.T) {
			p, fks := newProxier()
			setup(p)
			if err := p.sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			p.trackers.Services.Set(svc3.Name, &changed)
			fks[failing].FailNext = errors.New("injected")
			if err := p.sync(context.Background()); err == nil {
				t.Fatal("the refused sync succeeded")
			}
			p.trackers.Services.Set(svc3.Name, svcs[3])
			if err := p.sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			want, wantFks := newProxier()
			setup(want)
			if err := want.sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
				if got, w := canon(fks[f].Ruleset(f)), canon(wantFks[f].Ruleset(f)); got != w {
					t.Errorf("%s table after the retry differs from a fresh build:\n%s\nwant:\n%s", f.IPFamily(), got, w)
				}
			}
		})
	}
}

// TestFirstSyncHook: Deps.FirstSync runs once per family, after the
// family's first successful sync, when its rules are in the kernel; a
// first sync that failed does not call it, and later syncs do not either.
func TestFirstSyncHook(t *testing.T) {
	type call struct {
		f       nft.Family
		verdict nft.VerdictKind // of a packet to the Service when called
	}
	calls := make(chan call, 10)
	var fk *nftfake.Fake
	h := startWith(t, func(d *Deps) {
		fk = d.NFT[nft.IPv4].(*nftfake.Fake)
		fk.FailNext = errors.New("injected: the first transaction fails")
		d.FirstSync = func(_ context.Context, f nft.Family) {
			calls <- call{f, trace.New(fk.Rulesets()).Trace(tcp("10.96.0.10", 80)).Verdict}
		}
	}, service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP))
	select {
	case c := <-calls:
		if c.f != nft.IPv4 || c.verdict != trace.VerdictReject {
			t.Errorf("FirstSync(%s) with the Service's packet getting %s, want IPv4 with reject (rules in)", c.f, c.verdict)
		}
		if fk.FailNext != nil {
			t.Error("FirstSync was called before the failing first sync")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("FirstSync not called")
	}
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")
	select {
	case c := <-calls:
		t.Errorf("FirstSync(%s) called again after a later sync", c.f)
	default:
	}
}
