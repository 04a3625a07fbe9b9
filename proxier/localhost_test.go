package proxier

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/trace"
	"github.com/nftproxy/nftproxy/proxier/localnodeport"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/proxyhealth"
)

// recordingLocalhost is a LocalhostNodePortProxy that records what it is
// handed.
type recordingLocalhost struct {
	mu      sync.Mutex
	ports   map[uint16]localnodeport.Port
	syncs   int
	pending bool
}

func (r *recordingLocalhost) Sync(m map[uint16]localnodeport.Port) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Like the real proxy, a handover binds what was pending: otherwise
	// every later sync hands over again and the count runs on.
	r.ports, r.syncs, r.pending = maps.Clone(m), r.syncs+1, false
	return nil
}

func (r *recordingLocalhost) Pending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pending
}

func (r *recordingLocalhost) get() (map[uint16]localnodeport.Port, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ports, r.syncs
}

func nodePortService(name, ip string, nodePort int32, proto v1.Protocol) *v1.Service {
	svc := service("default", name, ip, 80, proto)
	svc.Spec.Type, svc.Spec.Ports[0].NodePort = v1.ServiceTypeNodePort, nodePort
	return svc
}

func eps(s ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range s {
		out = append(out, netip.MustParseAddrPort(a))
	}
	return out
}

// TestLocalhostNodePortsHandedOver: with the gate on and a loopback CIDR
// in nodePortAddresses, every TCP NodePort goes to the family's userspace
// proxy after each sync that changed them, with the endpoints its external
// traffic goes to and its affinity; UDP NodePorts and ClusterIPs do not,
// and UDP on loopback is refused by the rules while TCP is left to the
// proxy. A port the proxy could not bind is handed again at the next sync
// though nothing changed.
func TestLocalhostNodePortsHandedOver(t *testing.T) {
	lp := &recordingLocalhost{}
	web := nodePortService("web", "10.96.0.10", 30080, v1.ProtocolTCP)
	local := nodePortService("local", "10.96.0.11", 30081, v1.ProtocolTCP)
	local.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	local.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	local.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
	empty := nodePortService("empty", "10.96.0.12", 30082, v1.ProtocolTCP)
	dns := nodePortService("dns", "10.96.0.53", 30053, v1.ProtocolUDP)
	internal := service("default", "internal", "10.96.0.13", 80, v1.ProtocolTCP)
	h := startWithConfig(t, func(c *Config) {
		c.LocalhostNodePorts = true
		c.NodePortPrimary, c.NodePortCIDRs = true, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	}, func(d *Deps) { d.LocalhostNodePorts = map[nft.Family]LocalhostNodePortProxy{nft.IPv4: lp} },
		web, slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11", "10.244.2.12"),
		local, onNode("n1", slice("default", "local", "local-1", 8080, v1.ProtocolTCP, "10.244.1.21")),
		slice("default", "local", "local-2", 8080, v1.ProtocolTCP, "10.244.2.22"),
		empty, dns, slice("default", "dns", "dns-1", 5353, v1.ProtocolUDP, "10.244.1.53"),
		internal, slice("default", "internal", "internal-1", 8080, v1.ProtocolTCP, "10.244.1.31"))

	want := map[uint16]localnodeport.Port{
		30080: {Service: "default/web:p", Endpoints: eps("10.244.1.11:8080", "10.244.2.12:8080")},
		30081: {Service: "default/local:p", Endpoints: eps("10.244.1.21:8080"), AffinityTimeout: time.Minute},
		30082: {Service: "default/empty:p"},
	}
	testutil.Eventually(t, "the NodePorts handed to the proxy", func() bool { got, _ := lp.get(); return reflect.DeepEqual(got, want) })

	lo := func(proto uint8, port uint16) trace.Packet {
		a := netip.MustParseAddr("127.0.0.1")
		return trace.Packet{Src: a, Dst: a, Proto: proto, DPort: port, FromNode: true}
	}
	h.eventually(lo(nft.ProtoUDP, 30053), trace.VerdictReject)
	h.eventually(lo(nft.ProtoTCP, 30080), nft.VerdictAccept)

	ctx := context.Background()
	es := slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Update(ctx, es, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.CoreV1().Services("default").Delete(ctx, "empty", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want[30080] = localnodeport.Port{Service: "default/web:p", Endpoints: eps("10.244.1.11:8080")}
	delete(want, 30082)
	testutil.Eventually(t, "the changed NodePorts", func() bool { got, _ := lp.get(); return reflect.DeepEqual(got, want) })

	// A change that touches no TCP NodePort hands nothing over...
	_, syncs := lp.get()
	create := func(name, ip string) {
		if _, err := h.client.CoreV1().Services("default").Create(ctx, service("default", name, ip, 80, v1.ProtocolTCP), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.eventually(tcp(ip, 80), trace.VerdictReject)
	}
	create("other", "10.96.0.20")
	if _, n := lp.get(); n != syncs {
		t.Errorf("%d handovers after a change of no NodePort, want none", n-syncs)
	}
	// ...unless the proxy has a port to bind again.
	lp.mu.Lock()
	lp.pending = true
	lp.mu.Unlock()
	create("another", "10.96.0.21")
	testutil.Eventually(t, "a handover with a port pending", func() bool { _, n := lp.get(); return n == syncs+1 })
}

// TestLocalhostNodePortsRejected: with the gate on and no loopback CIDR,
// connections to a loopback NodePort are refused for every protocol, and
// no proxy is asked for; without the gate, the table has no localhost
// object at all.
func TestLocalhostNodePortsRejected(t *testing.T) {
	for _, gate := range []bool{true, false} {
		t.Run(fmt.Sprintf("gate %v", gate), func(t *testing.T) {
			h := startWithConfig(t, func(c *Config) { c.LocalhostNodePorts = gate }, func(*Deps) {},
				nodePortService("web", "10.96.0.10", 30080, v1.ProtocolTCP),
				slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11"))
			h.eventually(tcp("10.96.0.10", 80), nft.VerdictAccept, "10.244.1.11:8080")
			a := netip.MustParseAddr("127.0.0.1")
			want := nft.VerdictAccept
			if gate {
				want = trace.VerdictReject
			}
			h.eventually(trace.Packet{Src: a, Dst: a, Proto: nft.ProtoTCP, DPort: 30080, FromNode: true}, want)
			if dump := h.fk.Dump(nft.IPv4); strings.Contains(dump, "localhost") != gate {
				t.Errorf("gate %v: table:\n%s", gate, dump)
			}
		})
	}
}

// TestLocalhostConfig: which families are proxied and which protocols
// refused, from the gate and the loopback CIDRs (explicit ones only).
func TestLocalhostConfig(t *testing.T) {
	p := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	all, proxied := []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP}, []uint8{nft.ProtoUDP, nft.ProtoSCTP}
	for _, tc := range []struct {
		name           string
		gate           bool
		cidrs          []netip.Prefix
		proxy4, proxy6 bool
		reject4        []uint8
		reject6        []uint8
	}{
		{name: "gate off, localhost", cidrs: p("127.0.0.0/8", "::1/128")},
		{name: "primary", gate: true, reject4: all, reject6: all},
		{name: "localhost", gate: true, cidrs: p("127.0.0.0/8", "::1/128"), proxy4: true, proxy6: true, reject4: proxied, reject6: proxied},
		{name: "127.0.0.0/8 only", gate: true, cidrs: p("127.0.0.0/8"), proxy4: true, reject4: proxied, reject6: all},
		{name: "127.0.0.1/32", gate: true, cidrs: p("127.0.0.1/32"), proxy4: true, reject4: proxied, reject6: all},
		{name: "all does not count", gate: true, cidrs: p("0.0.0.0/0", "::/0"), reject4: all, reject6: all},
		{name: "a CIDR around loopback does not count", gate: true, cidrs: p("96.0.0.0/3"), reject4: all, reject6: all},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{LocalhostNodePorts: tc.gate, NodePortCIDRs: tc.cidrs}
			if c.LocalhostProxied(nft.IPv4) != tc.proxy4 || c.LocalhostProxied(nft.IPv6) != tc.proxy6 {
				t.Errorf("proxied %v %v, want %v %v", c.LocalhostProxied(nft.IPv4), c.LocalhostProxied(nft.IPv6), tc.proxy4, tc.proxy6)
			}
			r4, _ := rulesetConfig(c, nft.IPv4, model.Node{}, nil)
			r6, _ := rulesetConfig(c, nft.IPv6, model.Node{}, nil)
			if !reflect.DeepEqual(r4.LocalhostNodePorts.Reject, tc.reject4) || !reflect.DeepEqual(r6.LocalhostNodePorts.Reject, tc.reject6) {
				t.Errorf("reject %v %v, want %v %v", r4.LocalhostNodePorts.Reject, r6.LocalhostNodePorts.Reject, tc.reject4, tc.reject6)
			}
		})
	}
}

// TestLocalhostNodePortsRestart: a restart that turns the gate on adds
// the localhost objects, one with the same gate writes nothing, and one
// that turns it off removes them all.
func TestLocalhostNodePortsRestart(t *testing.T) {
	rec := &recorder{Fake: nftfake.New()}
	objs := []runtime.Object{nodePortService("web", "10.96.0.10", 30080, v1.ProtocolTCP),
		slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")}
	run := func(gate bool) {
		t.Helper()
		in := &instance{health: proxyhealth.New(time.Minute, nil)}
		var err error
		in.p, err = New(Config{NodeName: "n1", MasqueradeBit: 14, SyncPeriod: time.Minute, LocalhostNodePorts: gate},
			Deps{Client: fake.NewClientset(objs...), NFT: map[nft.Family]nft.Backend{nft.IPv4: rec}, Health: in.health})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = in.p.Run(ctx); close(done) }()
		testutil.Eventually(t, "the first sync", func() bool {
			return !in.health.Status().Families[nft.IPv4.IPFamily()].LastUpdated.IsZero()
		})
		cancel()
		<-done
	}
	localhostObjects := func() int {
		n := 0
		for _, l := range strings.Split(rec.Dump(nft.IPv4), "\n") {
			if strings.Contains(l, "localhost") {
				n++
			}
		}
		return n
	}
	run(false)
	if n := localhostObjects(); n != 0 {
		t.Fatalf("%d lines about localhost without the gate:\n%s", n, rec.Dump(nft.IPv4))
	}
	run(true)
	if n := localhostObjects(); n == 0 {
		t.Fatalf("no localhost objects after a restart with the gate:\n%s", rec.Dump(nft.IPv4))
	}
	before := rec.count()
	run(true)
	for _, tx := range rec.since(before) {
		if len(tx.Ops) > 0 {
			t.Errorf("a restart with the same gate sent %d operations", len(tx.Ops))
		}
	}
	run(false)
	if n := localhostObjects(); n != 0 {
		t.Errorf("%d lines about localhost after a restart without the gate:\n%s", n, rec.Dump(nft.IPv4))
	}
}
