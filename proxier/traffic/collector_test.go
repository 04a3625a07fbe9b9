package traffic

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// fakeReader reads the counters of the elements of rulesets: each
// element's counter is counts["<family> <set name> <element text>"] (0 if
// not there). fail, per family, are the errors of the next reads.
type fakeReader struct {
	rulesets map[nft.Family]*nft.Ruleset
	counts   map[string]uint64
	fail     map[nft.Family][]error
	reads    int
}

func (r *fakeReader) ReadCounters(_ context.Context, f nft.Family, fn nftnl.CountedElement) error {
	r.reads++
	rs := r.rulesets[f]
	if rs == nil {
		return nil
	}
	buf := make([]byte, 0, 256)
	for _, name := range rs.SortedSetNames() {
		s := rs.Sets[name]
		if !s.Counter {
			continue
		}
		for e := range s.Elements.All() {
			n := r.counts[f.String()+" "+name+" "+s.ElementText(e)]
			// As nftnl's reader, the comment lives in a buffer that the
			// next element overwrites.
			buf = append(buf[:0], e.Comment...)
			e.Comment = unsafe.String(unsafe.SliceData(buf), len(buf))
			fn(s, e, nftnl.Counter{Packets: n, Bytes: 60 * n})
			for i := range buf {
				buf[i] = '#'
			}
		}
	}
	if errs := r.fail[f]; len(errs) > 0 {
		r.fail[f] = errs[1:]
		return errs[0]
	}
	return nil
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ip(s string) netip.Addr     { return netip.MustParseAddr(s) }

// webPorts: default/web, port http (tcp 80) with a NodePort, an external
// IP and a load balancer IP, two endpoints (one on this node, with Local
// external policy: it is in the cluster and the local slot); kube-system/dns
// (udp 53, unnamed port) with one endpoint; default/empty with none.
func webPorts(f nft.Family) []model.ServicePortState {
	a := func(v4, v6 string) netip.Addr {
		if f == nft.IPv6 {
			return ip(v6)
		}
		return ip(v4)
	}
	p := func(v4, v6 string, port uint16) netip.AddrPort { return netip.AddrPortFrom(a(v4, v6), port) }
	name := func(ns, n, port string, proto uint8) model.ServicePortName {
		return model.ServicePortName{ServiceName: model.ServiceName{Namespace: ns, Name: n}, Port: port, Protocol: proto}
	}
	return []model.ServicePortState{
		{Name: name("default", "web", "http", nft.ProtoTCP), ClusterIP: a("10.96.0.10", "fd00:96::10"), Port: 80, NodePort: 30080,
			ExternalIPs: []netip.Addr{a("192.0.2.1", "2001:db8::1")}, LoadBalancerIPs: []netip.Addr{a("192.0.2.2", "2001:db8::2")},
			ExternalLocal:  true,
			Endpoints:      []netip.AddrPort{p("10.244.1.11", "fd00:244::11", 8080), p("10.244.2.12", "fd00:244::12", 8080)},
			LocalEndpoints: []netip.AddrPort{p("10.244.1.11", "fd00:244::11", 8080)}},
		{Name: name("kube-system", "dns", "", nft.ProtoUDP), ClusterIP: a("10.96.0.53", "fd00:96::53"), Port: 53,
			Endpoints: []netip.AddrPort{p("10.244.1.20", "fd00:244::20", 5353)}},
		{Name: name("default", "empty", "", nft.ProtoTCP), ClusterIP: a("10.96.0.20", "fd00:96::20"), Port: 80},
	}
}

func build(f nft.Family, counters ruleset.Counters) *nft.Ruleset {
	cfg := ruleset.Config{MasqueradeMark: 0x4000, Counters: counters,
		NodePorts: ruleset.NodePortAddresses{CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}}
	return ruleset.Build(cfg, f, webPorts(f))
}

// dispatchElement is the text of the element of a dispatch map with this
// key, as the fake reader keys it.
func dispatchElement(t *testing.T, rs *nft.Ruleset, set, key string) string {
	t.Helper()
	s := rs.Sets[set]
	for e := range s.Elements.All() {
		if s.KeyString(e.Key) == key {
			return rs.Family.String() + " " + set + " " + s.ElementText(e)
		}
	}
	t.Fatalf("no element %s in %s", key, set)
	return ""
}

// endpointElement is the text of the element of ep in the slot of chain
// kind ("service" or "local") of default/web, as the fake reader keys it.
func endpointElement(t *testing.T, rs *nft.Ruleset, kind string, ep netip.AddrPort) string {
	t.Helper()
	for _, c := range rs.Chains {
		if !strings.HasPrefix(c.Name, kind+"-") || !strings.Contains(c.Name, "default/web") {
			continue
		}
		d := c.Rules[0].Phrases[0].(nft.DNATMap)
		s := rs.Sets[d.Map]
		for e := range s.Elements.All() {
			if nft.ElementSlot(e) == uint32(d.Slot) && e.Data[0].Addr == ep.Addr() {
				return rs.Family.String() + " " + d.Map + " " + s.ElementText(e)
			}
		}
	}
	t.Fatalf("no %s element of %s", kind, ep)
	return ""
}

func TestCollector(t *testing.T) {
	v4, v6 := build(nft.IPv4, ruleset.CountEndpoints), build(nft.IPv6, ruleset.CountEndpoints)
	counts := map[string]uint64{
		dispatchElement(t, v4, "service-ips", "10.96.0.10 . tcp . 80"):  0,
		dispatchElement(t, v4, "service-ips", "192.0.2.1 . tcp . 80"):   2,
		dispatchElement(t, v4, "service-ips", "192.0.2.2 . tcp . 80"):   3,
		dispatchElement(t, v4, "service-ips", "10.96.0.53 . udp . 53"):  9,
		dispatchElement(t, v4, "service-nodeports", "tcp . 30080"):      4,
		dispatchElement(t, v6, "service-ips", "fd00:96::10 . tcp . 80"): 100,
		dispatchElement(t, v6, "service-ips", "2001:db8::2 . tcp . 80"): 0,
		// Packets both ways, all frontends of a port together.
		dispatchElement(t, v4, "service-traffic", "10.96.0.10 . tcp . 80"):  7,
		dispatchElement(t, v4, "service-traffic", "192.0.2.1 . tcp . 80"):   3,
		dispatchElement(t, v4, "nodeport-traffic", "tcp . 30080"):           5,
		dispatchElement(t, v6, "service-traffic", "fd00:96::10 . tcp . 80"): 10,
		dispatchElement(t, v4, "service-traffic", "10.96.0.53 . udp . 53"):  2,
	}
	counts[endpointElement(t, v4, "service", ap("10.244.1.11:8080"))] = 1
	counts[endpointElement(t, v4, "service", ap("10.244.2.12:8080"))] = 6
	counts[endpointElement(t, v4, "local", ap("10.244.1.11:8080"))] = 2
	counts[endpointElement(t, v6, "service", netip.MustParseAddrPort("[fd00:244::11]:8080"))] = 50
	r := &fakeReader{rulesets: map[nft.Family]*nft.Ruleset{nft.IPv4: v4, nft.IPv6: v6}, counts: counts}
	c := NewCollector(r, []nft.Family{nft.IPv4, nft.IPv6}, nil)
	want := `
# HELP nftproxy_endpoint_new_connections_total New connections sent to an endpoint of a Service port (kernel counters of the endpoints maps' elements; they start again at zero when the Service's endpoints change)
# TYPE nftproxy_endpoint_new_connections_total counter
nftproxy_endpoint_new_connections_total{endpoint="10.244.1.11:8080",namespace="default",port="http",protocol="tcp",service="web"} 3
nftproxy_endpoint_new_connections_total{endpoint="10.244.2.12:8080",namespace="default",port="http",protocol="tcp",service="web"} 6
nftproxy_endpoint_new_connections_total{endpoint="10.244.1.20:5353",namespace="kube-system",port="",protocol="udp",service="dns"} 0
nftproxy_endpoint_new_connections_total{endpoint="[fd00:244::11]:8080",namespace="default",port="http",protocol="tcp",service="web"} 50
nftproxy_endpoint_new_connections_total{endpoint="[fd00:244::12]:8080",namespace="default",port="http",protocol="tcp",service="web"} 0
nftproxy_endpoint_new_connections_total{endpoint="[fd00:244::20]:5353",namespace="kube-system",port="",protocol="udp",service="dns"} 0
# HELP nftproxy_service_new_connections_total New connections dispatched to a Service port, by frontend (kernel counters of the service-ips and service-nodeports elements; an element replaced starts again at zero)
# TYPE nftproxy_service_new_connections_total counter
nftproxy_service_new_connections_total{frontend="cluster-ip",namespace="default",port="http",protocol="tcp",service="web"} 100
nftproxy_service_new_connections_total{frontend="external",namespace="default",port="http",protocol="tcp",service="web"} 5
nftproxy_service_new_connections_total{frontend="node-port",namespace="default",port="http",protocol="tcp",service="web"} 4
nftproxy_service_new_connections_total{frontend="cluster-ip",namespace="kube-system",port="",protocol="udp",service="dns"} 9
# HELP nftproxy_service_packets_total Packets of the connections to a Service port, requests and replies (kernel counters of the service-traffic and nodeport-traffic elements; an element replaced starts again at zero)
# TYPE nftproxy_service_packets_total counter
nftproxy_service_packets_total{namespace="default",port="http",protocol="tcp",service="web"} 25
nftproxy_service_packets_total{namespace="kube-system",port="",protocol="udp",service="dns"} 2
# HELP nftproxy_service_bytes_total Bytes (IP packet lengths) of the connections to a Service port, requests and replies (kernel counters of the service-traffic and nodeport-traffic elements; an element replaced starts again at zero)
# TYPE nftproxy_service_bytes_total counter
nftproxy_service_bytes_total{namespace="default",port="http",protocol="tcp",service="web"} 1500
nftproxy_service_bytes_total{namespace="kube-system",port="",protocol="udp",service="dns"} 120
`
	names := []string{"nftproxy_service_new_connections_total", "nftproxy_endpoint_new_connections_total",
		"nftproxy_service_packets_total", "nftproxy_service_bytes_total"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// A read a commit interrupted is dropped and read again; another
	// error leaves the family out and is counted.
	r.fail = map[nft.Family][]error{nft.IPv4: {fmt.Errorf("dump: %w", nftnl.ErrInterrupted)}, nft.IPv6: {errors.New("no socket")}}
	reads := r.reads
	got, err := gather(c)
	if err != nil {
		t.Fatal(err)
	}
	if r.reads-reads != 3 {
		t.Errorf("%d reads, want 3 (IPv4 twice, IPv6 once)", r.reads-reads)
	}
	if v := got[`nftproxy_service_new_connections_total{frontend="cluster-ip",namespace="default",port="http",protocol="tcp",service="web"}`]; v != 0 {
		t.Errorf("cluster-ip of web without IPv6: %v, want 0 (IPv4's only)", v)
	}
	if v := got[`nftproxy_service_new_connections_total{frontend="external",namespace="default",port="http",protocol="tcp",service="web"}`]; v != 5 {
		t.Errorf("external of web after an interrupted read: %v, want 5 (counted once)", v)
	}
	if v := got[`nftproxy_traffic_counter_read_errors_total{ip_family="IPv6"}`]; v != 1 {
		t.Errorf("read errors of IPv6: %v, want 1", v)
	}
}

// TestCollectorServicesOnly: with CountServices the endpoints maps are not
// counted, and no endpoint series is reported.
func TestCollectorServicesOnly(t *testing.T) {
	rs := build(nft.IPv4, ruleset.CountServices)
	r := &fakeReader{rulesets: map[nft.Family]*nft.Ruleset{nft.IPv4: rs}, counts: map[string]uint64{}}
	got, err := gather(NewCollector(r, []nft.Family{nft.IPv4}, nil))
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for k := range got {
		if strings.HasPrefix(k, "nftproxy_endpoint_") {
			t.Errorf("endpoint series %s without endpoint counters", k)
		}
		if strings.HasPrefix(k, "nftproxy_service_new_connections_total") {
			series++
		}
	}
	if series != 4 { // web: cluster-ip, external, node-port; dns: cluster-ip
		t.Errorf("%d service series, want 4: %v", series, got)
	}
}

// gather collects c into a map from series (name{labels}) to value.
func gather(c prometheus.Collector) (map[string]float64, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	mfs, err := reg.Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetCounter().GetValue()
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out, nil
}

// TestCollectorHoldsCommits: each family's read runs inside a hold (the
// proxy's commits wait for it), released after it, interruptions
// included; reads interrupted more than three times still succeed.
func TestCollectorHoldsCommits(t *testing.T) {
	rs := build(nft.IPv4, ruleset.CountServices)
	interrupted := fmt.Errorf("dump: %w", nftnl.ErrInterrupted)
	r := &fakeReader{rulesets: map[nft.Family]*nft.Ruleset{nft.IPv4: rs}, counts: map[string]uint64{},
		fail: map[nft.Family][]error{nft.IPv4: {interrupted, interrupted, interrupted, interrupted, interrupted}}}
	held, maxHeld, holds := 0, 0, 0
	hold := func() func() {
		holds++
		held++
		maxHeld = max(maxHeld, held)
		return func() { held-- }
	}
	errs := testutil.ToFloat64(metrics.RulesetReadFailuresTotal.WithLabelValues("IPv4", metrics.ReaderCounters))
	got, err := gather(NewCollector(r, []nft.Family{nft.IPv4}, hold))
	if err != nil {
		t.Fatal(err)
	}
	if holds != 1 || held != 0 || maxHeld != 1 {
		t.Errorf("holds taken %d, still held %d, most at once %d; want 1, 0, 1", holds, held, maxHeld)
	}
	if r.reads != 6 || len(got) == 0 {
		t.Errorf("%d reads, %d series; want 6 (5 interrupted) and the series", r.reads, len(got))
	}
	if d := testutil.ToFloat64(metrics.RulesetReadFailuresTotal.WithLabelValues("IPv4", metrics.ReaderCounters)) - errs; d != 0 {
		t.Errorf("%v failed reads counted, want 0", d)
	}
}
