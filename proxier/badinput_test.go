package proxier

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft/trace"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// problemKey is a series of nftproxy_invalid_objects_total: kind, reason.
type problemKey struct{ kind, reason string }

// problemCounts reads every series of nftproxy_invalid_objects_total the
// watch layer can count.
func problemCounts() map[problemKey]float64 {
	out := map[problemKey]float64{}
	for kind, reasons := range watch.Reasons {
		for _, r := range reasons {
			out[problemKey{kind, r}] = promtestutil.ToFloat64(metrics.InvalidObjectsTotal.WithLabelValues(kind, r))
		}
	}
	return out
}

// countedSince returns the series that grew since before, by how much.
func countedSince(before map[problemKey]float64) map[problemKey]float64 {
	out := map[problemKey]float64{}
	for k, v := range problemCounts() {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// traceTo traces pkt through the harness's rulesets until it is DNATed to
// exactly the endpoints want (in any order), or fails.
func (h *harness) traceTo(pkt trace.Packet, want ...netip.AddrPort) {
	h.t.Helper()
	slices.SortFunc(want, netip.AddrPort.Compare)
	var res trace.Result
	if testutil.Poll(func() bool {
		res = trace.New(h.fk.Rulesets(), h.local...).Trace(pkt)
		got := slices.Clone(res.DNAT)
		slices.SortFunc(got, netip.AddrPort.Compare)
		return res.Verdict == nft.VerdictAccept && slices.Equal(got, want)
	}) {
		return
	}
	h.t.Fatalf("packet %+v: got %s to %d endpoints %v, want %d", pkt, res.Verdict, len(res.DNAT), first(res.DNAT, 5), len(want))
}

func first[T any](s []T, n int) []T { return s[:min(n, len(s))] }

func endpoints(port uint16, addrs ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range addrs {
		out = append(out, netip.AddrPortFrom(netip.MustParseAddr(a), port))
	}
	return out
}

func withPorts(s *v1.Service, ports ...v1.ServicePort) *v1.Service {
	s.Spec.Ports = append(s.Spec.Ports, ports...)
	return s
}

func withSlicePorts(es *discovery.EndpointSlice, ports ...discovery.EndpointPort) *discovery.EndpointSlice {
	es.Ports = append(es.Ports, ports...)
	return es
}

func slicePort(name string, port int32, proto v1.Protocol) discovery.EndpointPort {
	return discovery.EndpointPort{Name: &name, Port: &port, Protocol: &proto}
}

// badInputCase is bad or extreme input beside a good Service, default/web.
type badInputCase struct {
	name string
	objs []runtime.Object
	// counted are the problems the metric must count (once each, however
	// many syncs there were); no other series may grow.
	counted map[problemKey]float64
	// absent are what the tables must not contain: the bad objects' names
	// and addresses.
	absent []string
	// web are default/web's endpoints (10.244.1.11 unless the case adds
	// some); check traces what else must work.
	web   []string
	check func(h *harness)
	ipv6  bool // also program IPv6 (with its own good Service, default/web6)
}

// longName is a DNS label of 63 characters, the API's limit.
var longName = strings.Repeat("l", 62) + "9"

func badInputCases() []badInputCase {
	many := slice("default", "many", "many-1", 8080, v1.ProtocolTCP)
	var manyWant []string
	for i := range 1500 {
		a := fmt.Sprintf("10.245.%d.%d", i/250, i%250+1)
		many.Endpoints = append(many.Endpoints, discovery.Endpoint{Addresses: []string{a}})
		manyWant = append(manyWant, a)
	}
	ports100 := service("default", "ports100", "10.96.0.60", 1000, v1.ProtocolTCP)
	ports100.Spec.Ports = nil
	ports100Slice := slice("default", "ports100", "ports100-1", 2000, v1.ProtocolTCP, "10.244.1.60")
	ports100Slice.Ports = nil
	for i := range 100 {
		name := fmt.Sprintf("p%d", i)
		ports100.Spec.Ports = append(ports100.Spec.Ports, v1.ServicePort{Name: name, Port: int32(1000 + i), Protocol: v1.ProtocolTCP})
		ports100Slice.Ports = append(ports100Slice.Ports, slicePort(name, int32(2000+i), v1.ProtocolTCP))
	}
	limits := service(longName, longName, "10.96.0.70", 80, v1.ProtocolTCP)
	limits.Spec.ClusterIPs = []string{"10.96.0.70", "fd00:96::70"}
	limits.Spec.Ports[0].Name = longName
	limits.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	sliceName := strings.Repeat(strings.Repeat("s", 62)+".", 5)[:253] // a DNS subdomain's limit
	limits4 := slice(longName, longName, sliceName, 8080, v1.ProtocolTCP, "10.244.1.70")
	limits4.Ports[0].Name = &longName
	limits6 := slice(longName, longName, sliceName[:251]+"-6", 65535, v1.ProtocolTCP, "fd00:2440:1234:5678:9abc:def0:1234:1001")
	limits6.AddressType, limits6.Ports[0].Name = discovery.AddressTypeIPv6, &longName

	lbOpen := service("default", "lb", "10.96.0.95", 80, v1.ProtocolTCP)
	lbOpen.Spec.Type, lbOpen.Spec.LoadBalancerSourceRanges = v1.ServiceTypeLoadBalancer, []string{"0.0.0.0/0"}
	lbOpen.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.95"}}
	twoV4 := service("default", "two-v4", "10.96.0.20", 80, v1.ProtocolTCP)
	twoV4.Spec.ClusterIPs = []string{"10.96.0.20", "10.96.0.21"}

	return []badInputCase{
		{name: "invalid and mixed-family addresses",
			objs: []runtime.Object{
				slice("default", "web", "web-2", 8080, v1.ProtocolTCP, "fd00::1", "999.1.1.1", "127.0.0.1", "", "10.244.1.12"),
				twoV4,
				service("default", "bad-ip", "not-an-ip", 80, v1.ProtocolTCP),
				service("default", "v6-only", "fd00::20", 80, v1.ProtocolTCP),
				slice("default", "two-v4", "two-v4-1", 8080, v1.ProtocolTCP, "10.244.1.20"),
			},
			counted: map[problemKey]float64{{"EndpointSlice", "invalid-address"}: 4, {"Service", "invalid-cluster-ip"}: 2},
			absent:  []string{"10.96.0.21", "bad-ip", "v6-only", "fd00::"},
			web:     []string{"10.244.1.11", "10.244.1.12"},
			check:   func(h *harness) { h.traceTo(tcp("10.96.0.20", 80), endpoints(8080, "10.244.1.20")...) }},
		{name: "ports 0 and 65536+",
			objs: []runtime.Object{
				withPorts(service("default", "ports", "10.96.0.30", 80, v1.ProtocolTCP),
					v1.ServicePort{Name: "zero", Port: 0}, v1.ServicePort{Name: "big", Port: 70000},
					v1.ServicePort{Name: "np", Port: 81, NodePort: 70000}),
				withSlicePorts(slice("default", "ports", "ports-1", 8080, v1.ProtocolTCP, "10.244.1.30"),
					slicePort("zero", 0, v1.ProtocolTCP), slicePort("big", 65536, v1.ProtocolTCP)),
			},
			counted: map[problemKey]float64{{"Service", "invalid-port"}: 2, {"Service", "invalid-node-port"}: 1,
				{"EndpointSlice", "invalid-port"}: 2},
			// 70000 would be 4464 in 16 bits.
			absent: []string{"4464", "tcp . 0 ", " . 0,", " . 0 }"},
			check:  func(h *harness) { h.traceTo(tcp("10.96.0.30", 80), endpoints(8080, "10.244.1.30")...) }},
		{name: "unknown protocols",
			objs: []runtime.Object{
				withPorts(service("default", "icmp", "10.96.0.40", 80, v1.ProtocolTCP), v1.ServicePort{Name: "ping", Port: 7, Protocol: "ICMP"}),
				withSlicePorts(slice("default", "icmp", "icmp-1", 8080, v1.ProtocolTCP, "10.244.1.40"), slicePort("ping", 7, "ICMP")),
			},
			counted: map[problemKey]float64{{"Service", "invalid-protocol"}: 1, {"EndpointSlice", "invalid-protocol"}: 1},
			absent:  []string{"icmp . 7", ":ping"},
			check:   func(h *harness) { h.traceTo(tcp("10.96.0.40", 80), endpoints(8080, "10.244.1.40")...) }},
		{name: "the same endpoint in two slices",
			objs: []runtime.Object{slice("default", "web", "web-2", 8080, v1.ProtocolTCP, "10.244.1.11", "10.244.1.12")},
			web:  []string{"10.244.1.11", "10.244.1.12"}},
		{name: "1,500 endpoints in one slice",
			objs:  []runtime.Object{service("default", "many", "10.96.0.50", 80, v1.ProtocolTCP), many},
			check: func(h *harness) { h.traceTo(tcp("10.96.0.50", 80), endpoints(8080, manyWant...)...) }},
		{name: "100 ports on one Service",
			objs: []runtime.Object{ports100, ports100Slice},
			check: func(h *harness) {
				for i := range 100 {
					h.traceTo(tcp("10.96.0.60", uint16(1000+i)), endpoints(uint16(2000+i), "10.244.1.60")...)
				}
			}},
		{name: "names at their length limits, IPv6 endpoint, session affinity", ipv6: true,
			objs: []runtime.Object{limits, limits4, limits6},
			check: func(h *harness) {
				h.traceTo(tcp("10.96.0.70", 80), endpoints(8080, "10.244.1.70")...)
				pkt := tcp("fd00:96::70", 80)
				pkt.Src = netip.MustParseAddr("fd00:244::5")
				h.traceTo(pkt, endpoints(65535, "fd00:2440:1234:5678:9abc:def0:1234:1001")...)
			}},
		{name: "non-ASCII and hostile names",
			objs: []runtime.Object{
				service("default", "wéb", "10.96.0.81", 80, v1.ProtocolTCP),
				service("dé", "web", "10.96.0.82", 80, v1.ProtocolTCP),
				service("default", "x\"}\n\tchain evil {", "10.96.0.83", 80, v1.ProtocolTCP),
				slice("default", "wéb", "web-x", 8080, v1.ProtocolTCP, "10.244.1.81"),
				withPorts(service("default", "ports-bad", "10.96.0.84", 80, v1.ProtocolTCP),
					v1.ServicePort{Name: "ñ", Port: 81}, v1.ServicePort{Name: "p\"; drop", Port: 82}),
				slice("default", "ports-bad", "ports-bad-1", 8080, v1.ProtocolTCP, "10.244.1.84"),
			},
			counted: map[problemKey]float64{{"Service", "invalid-name"}: 3, {"Service", "invalid-port-name"}: 2,
				{"EndpointSlice", "invalid-name"}: 1},
			absent: []string{"10.96.0.81", "10.96.0.82", "10.96.0.83", "10.244.1.81", "evil", "é", "ñ", "drop\""},
			check:  func(h *harness) { h.traceTo(tcp("10.96.0.84", 80), endpoints(8080, "10.244.1.84")...) }},
		{name: "loadBalancerSourceRanges of every address",
			objs: []runtime.Object{lbOpen, slice("default", "lb", "lb-1", 8080, v1.ProtocolTCP, "10.244.1.95")},
			check: func(h *harness) {
				pkt := tcp("192.0.2.95", 80)
				pkt.Src = netip.MustParseAddr("203.0.113.7")
				h.traceTo(pkt, endpoints(8080, "10.244.1.95")...)
			}},
		{name: "a slice without its Service and a Service without slices",
			objs: []runtime.Object{
				slice("default", "orphan", "orphan-1", 8080, v1.ProtocolTCP, "10.244.1.91"),
				service("default", "lonely", "10.96.0.90", 80, v1.ProtocolTCP),
			},
			absent: []string{"orphan", "10.244.1.91"},
			check:  func(h *harness) { h.eventually(tcp("10.96.0.90", 80), trace.VerdictReject) }},
	}
}

// TestBadInput: for each kind of bad or extreme input from the API, the
// proxier does not crash, a good Service beside it keeps working, the bad
// parts produce no rules, and each problem is counted once, with a bounded
// reason (and logged once: see watch.TestProblemsReportedOnce). Extreme but
// valid input (many endpoints or ports, names at their limits, shared
// endpoints, a slice without its Service) is programmed, and counts no
// problem.
func TestBadInput(t *testing.T) {
	for _, tc := range badInputCases() {
		t.Run(tc.name, func(t *testing.T) {
			before := problemCounts()
			objs := append([]runtime.Object{service("default", "web", "10.96.0.10", 80, v1.ProtocolTCP),
				slice("default", "web", "web-1", 8080, v1.ProtocolTCP, "10.244.1.11")}, tc.objs...)
			deps := func(*Deps) {}
			if tc.ipv6 {
				web6 := service("default", "web6", "fd00:96::10", 80, v1.ProtocolTCP)
				web6Slice := slice("default", "web6", "web6-1", 8080, v1.ProtocolTCP, "fd00:244::11")
				web6Slice.AddressType = discovery.AddressTypeIPv6
				objs = append(objs, web6, web6Slice)
				deps = func(d *Deps) { d.NFT[nft.IPv6] = d.NFT[nft.IPv4] }
			}
			h := startWith(t, deps, objs...)
			if tc.web == nil {
				tc.web = []string{"10.244.1.11"}
			}
			h.traceTo(tcp("10.96.0.10", 80), endpoints(8080, tc.web...)...)
			if tc.ipv6 {
				pkt := tcp("fd00:96::10", 80)
				pkt.Src = netip.MustParseAddr("fd00:244::5")
				h.traceTo(pkt, endpoints(8080, "fd00:244::11")...)
			}
			if tc.check != nil {
				tc.check(h)
			}
			dump := h.fk.Dump(nft.IPv4) + h.fk.Dump(nft.IPv6)
			for _, s := range tc.absent {
				if strings.Contains(dump, s) {
					t.Errorf("the tables hold %q:\n%s", s, grep(dump, s))
				}
			}
			checkComments(t, dump)
			want := tc.counted
			if want == nil {
				want = map[problemKey]float64{}
			}
			if got := countedSince(before); !maps.Equal(got, want) {
				t.Errorf("counted %v, want %v", got, want)
			}
		})
	}
}

// grep returns the lines of s that contain sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(first(out, 10), "\n")
}

var commentText = regexp.MustCompile(`comment "([^"]*)"`)

// checkComments fails for a comment nft would not read back (over 128
// characters).
func checkComments(t *testing.T, dump string) {
	t.Helper()
	for _, m := range commentText.FindAllStringSubmatch(dump, -1) {
		if len(m[1]) > 128 {
			t.Errorf("comment of %d characters: %q", len(m[1]), m[1])
		}
	}
}

// TestSharedFrontend: two Services may list the same external IP and port
// (the API allows it). Both are programmed without failing a sync; when
// the one the frontend goes to is deleted, it goes to the other.
func TestSharedFrontend(t *testing.T) {
	withExternal := func(s *v1.Service) *v1.Service {
		s.Spec.ExternalIPs = []string{"192.0.2.1"}
		return s
	}
	failures := func() float64 {
		return promtestutil.ToFloat64(metrics.NFTablesSyncFailuresTotal.WithLabelValues("IPv4"))
	}
	before := failures()
	h := start(t,
		withExternal(service("default", "a", "10.96.0.11", 80, v1.ProtocolTCP)),
		slice("default", "a", "a-1", 8080, v1.ProtocolTCP, "10.244.1.11"),
		withExternal(service("default", "b", "10.96.0.12", 80, v1.ProtocolTCP)),
		slice("default", "b", "b-1", 8080, v1.ProtocolTCP, "10.244.1.12"))
	h.traceTo(tcp("10.96.0.11", 80), endpoints(8080, "10.244.1.11")...)
	h.traceTo(tcp("10.96.0.12", 80), endpoints(8080, "10.244.1.12")...)
	outside := tcp("192.0.2.1", 80)
	outside.Src = netip.MustParseAddr("203.0.113.7")
	owner := map[netip.AddrPort]string{endpoints(8080, "10.244.1.11")[0]: "a", endpoints(8080, "10.244.1.12")[0]: "b"}
	other := map[string]string{"a": "10.244.1.12", "b": "10.244.1.11"}
	res := trace.New(h.fk.Rulesets()).Trace(outside)
	if res.Verdict != nft.VerdictAccept || len(res.DNAT) != 1 || owner[res.DNAT[0]] == "" {
		t.Fatalf("the external IP: %s %v, want one of the Services' endpoints", res.Verdict, res.DNAT)
	}
	gone := owner[res.DNAT[0]]
	if err := h.client.CoreV1().Services("default").Delete(context.Background(), gone, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.traceTo(outside, endpoints(8080, other[gone])...)
	if n := failures() - before; n != 0 {
		t.Errorf("%v syncs failed", n)
	}
}
