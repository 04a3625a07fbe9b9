package watch

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// FuzzConvert feeds hostile field values to the converters: they must not
// panic, and what they keep must be programmable (addresses of the right
// family, ports in range, known protocols).
func FuzzConvert(f *testing.F) {
	f.Add("10.96.0.1", "fd00::1", int32(80), "TCP", "10.244.1.1", "IPv4", int32(8080))
	f.Add("None", "", int32(0), "UDP", "::ffff:1.2.3.4", "IPv6", int32(-1))
	f.Add("1.2.3.4%eth0", "0.0.0.0", int32(70000), "ICMP", "fe80::1%lo", "FQDN", int32(65535))
	f.Fuzz(func(t *testing.T, ip1, ip2 string, port int32, proto, epAddr, addrType string, epPort int32) {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
			Spec: v1.ServiceSpec{ClusterIP: ip1, ClusterIPs: []string{ip1, ip2},
				Ports: []v1.ServicePort{{Name: "p", Port: port, Protocol: v1.Protocol(proto)}}}}
		m, problems := ConvertService(svc)
		checkService(t, svc, m, problems)
		pr := v1.Protocol(proto)
		name := "p"
		es := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "s-1", Labels: map[string]string{discovery.LabelServiceName: "s"}},
			AddressType: discovery.AddressType(addrType),
			Ports:       []discovery.EndpointPort{{Name: &name, Port: &epPort, Protocol: &pr}},
			Endpoints:   []discovery.Endpoint{{Addresses: []string{epAddr}}},
		}
		ms, problems := ConvertEndpointSlice(es)
		checkSlice(t, es, ms, problems)
	})
}

// fuzzBytes hands out the bytes of a fuzz input, zeros once they run out.
type fuzzBytes []byte

func (b *fuzzBytes) byte() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

func (b *fuzzBytes) int32() int32 {
	return int32(binary.BigEndian.Uint32([]byte{b.byte(), b.byte(), b.byte(), b.byte()}))
}

// pick returns one of choices, by the next byte.
func (b *fuzzBytes) pick(choices []string) string { return choices[int(b.byte())%len(choices)] }

// FuzzConvertService converts Services with many ports and arbitrary
// strings in every field that reaches the model: what is kept must be
// programmable, and every part left out must be reported, with a reason
// from Reasons.
func FuzzConvertService(f *testing.F) {
	l63 := strings.Repeat("a", 63)
	f.Add("default", "web", "http,dns,,P", "10.96.0.1,fd00::1", "192.0.2.1,::1", "198.51.100.0/24", "ClusterIP", "TCP",
		[]byte{1, 0, 0, 0, 80, 0, 0, 0x75, 0x30, 2, 0, 0, 0, 53, 0, 0, 0, 0})
	f.Add(l63, l63, l63+","+l63+"x", "10.96.0.1,10.96.0.2,fd00::1,fd00::2", "0.0.0.0,224.0.0.1,1.2.3.4%eth0", "bad,10.0.0.0/33",
		"LoadBalancer", "ICMP", []byte{4, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 80, 0, 0, 0, 0, 1, 0, 0, 0, 80})
	f.Add("ns\n", `s" } chain x {`, "ñ", "None", "", "", "NodePort", "", []byte{})
	f.Add("ns", "1st", "a,b,c,d,e,f,g,h", "::ffff:10.96.0.1", "", "", "NodePort", "sctp",
		slices.Repeat([]byte{3, 0, 0, 0, 7, 0, 0, 0x80, 0}, 100))
	f.Fuzz(func(t *testing.T, ns, name, portNames, clusterIPs, externalIPs, sourceRanges, typ, otherProto string, ports []byte) {
		protos := []string{"", "TCP", "UDP", "SCTP", otherProto}
		names := strings.Split(portNames, ",")
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1.ServiceSpec{Type: v1.ServiceType(typ), ExternalIPs: strings.Split(externalIPs, ","),
				LoadBalancerSourceRanges: strings.Split(sourceRanges, ","), HealthCheckNodePort: 32000,
				ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyLocal, SessionAffinity: v1.ServiceAffinityClientIP}}
		if clusterIPs != "" {
			svc.Spec.ClusterIPs = strings.Split(clusterIPs, ",")
		}
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: svc.Spec.ExternalIPs[0]}}
		for b := fuzzBytes(ports); len(b) > 0; {
			svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: b.pick(names),
				Protocol: v1.Protocol(b.pick(protos)), Port: b.int32(), NodePort: b.int32()})
		}
		m, problems := ConvertService(svc)
		checkService(t, svc, m, problems)
	})
}

// FuzzConvertEndpointSlice converts EndpointSlices with many ports and
// endpoints (addresses of both families and arbitrary strings): what is
// kept must be programmable, and every port and endpoint left out must be
// reported, with a reason from Reasons.
func FuzzConvertEndpointSlice(f *testing.F) {
	f.Add("default", "web", "web-1", "IPv4", "http,", "TCP", "10.244.1.1,fd00::1,::ffff:10.0.0.1,,127.0.0.1",
		[]byte{0, 1, 0, 0, 0x1f, 0x90, 0, 1, 1, 2, 3, 4, 5})
	f.Add("ns", "s", strings.Repeat("x", 253), "IPv6", "p", "ICMP", "fd00::1%eth0,fe80::1,::,ff02::1",
		slices.Repeat([]byte{1, 0, 0, 0, 0, 0x50, 1, 2, 3}, 1200))
	f.Add("ns", "s\x00", "s-1", "FQDN", "", "", "", []byte{})
	f.Fuzz(func(t *testing.T, ns, svc, name, addrType, portNames, otherProto, addrs string, data []byte) {
		names := strings.Split(portNames, ",")
		protos := []string{"TCP", "UDP", "SCTP", otherProto}
		addrList := strings.Split(addrs, ",")
		es := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
			AddressType: discovery.AddressType(addrType),
		}
		b := fuzzBytes(data)
		for n := int(b.byte()) % 8; n > 0; n-- {
			pn, pr, port := b.pick(names), v1.Protocol(b.pick(protos)), b.int32()
			es.Ports = append(es.Ports, discovery.EndpointPort{Name: &pn, Protocol: &pr, Port: &port})
		}
		for i := 0; len(b) > 0; i++ {
			ready, serving, terminating := b.byte()&1 == 1, b.byte()&1 == 1, b.byte()&1 == 1
			var a string
			switch k := b.byte() % 3; k {
			case 0:
				a = netip.AddrFrom4([4]byte{b.byte(), b.byte(), b.byte(), b.byte()}).String()
			case 1:
				var a16 [16]byte
				for j := range a16 {
					a16[j] = b.byte()
				}
				a = netip.AddrFrom16(a16).String()
			default:
				a = b.pick(addrList)
			}
			node := fmt.Sprint("n", i%3)
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a}, NodeName: &node,
				Conditions: discovery.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}})
		}
		m, problems := ConvertEndpointSlice(es)
		checkSlice(t, es, m, problems)
	})
}

// checkProblems fails unless every problem is of kind with a reason from
// Reasons[kind], and returns how many there are of each reason.
func checkProblems(t *testing.T, kind string, problems []Problem) map[string]int {
	t.Helper()
	count := map[string]int{}
	for _, p := range problems {
		if p.Kind != kind || !slices.Contains(Reasons[kind], p.Reason) {
			t.Fatalf("problem %+v: kind or reason not among %s, %v", p, kind, Reasons[kind])
		}
		count[p.Reason]++
	}
	return count
}

// usable reports whether an address can be programmed as a service or
// endpoint address.
func usable(a netip.Addr) bool {
	return a.IsValid() && a.Zone() == "" && !a.Is4In6() && !a.IsUnspecified()
}

func knownProto(p uint8) bool {
	return p == nft.ProtoTCP || p == nft.ProtoUDP || p == nft.ProtoSCTP
}

func checkService(t *testing.T, svc *v1.Service, m *model.Service, problems []Problem) {
	t.Helper()
	count := checkProblems(t, "Service", problems)
	if m == nil {
		return
	}
	if !validName(m.Name.Namespace) || !validName(m.Name.Name) {
		t.Fatalf("kept Service %q", m.Name)
	}
	if n := len(m.ClusterIPs); n == 0 || n > 2 || n == 2 && m.ClusterIPs[0].Is4() == m.ClusterIPs[1].Is4() {
		t.Fatalf("kept ClusterIPs %v: one or two, of different families", m.ClusterIPs)
	}
	for _, ip := range m.ClusterIPs {
		if !usable(ip) {
			t.Fatalf("kept unusable ClusterIP %v", ip)
		}
	}
	if len(m.ClusterIPs)+count["invalid-cluster-ip"] != len(svc.Spec.ClusterIPs) {
		t.Fatalf("%d ClusterIPs: kept %v, reported %d", len(svc.Spec.ClusterIPs), m.ClusterIPs, count["invalid-cluster-ip"])
	}
	names := map[string]bool{}
	numbers := map[[2]int]bool{}
	for _, p := range m.Ports {
		if p.Name != "" && !validName(p.Name) || p.Port == 0 || !knownProto(p.Protocol) {
			t.Fatalf("kept unusable port %+v", p)
		}
		if names[p.Name] || numbers[[2]int{int(p.Protocol), int(p.Port)}] {
			t.Fatalf("kept a second port %+v", p)
		}
		names[p.Name], numbers[[2]int{int(p.Protocol), int(p.Port)}] = true, true
	}
	skipped := count["invalid-port-name"] + count["invalid-protocol"] + count["invalid-port"] + count["duplicate-port"]
	if len(m.Ports)+skipped != len(svc.Spec.Ports) {
		t.Fatalf("%d ports: kept %d, reported %d", len(svc.Spec.Ports), len(m.Ports), skipped)
	}
	for _, ip := range append(append([]netip.Addr(nil), m.ExternalIPs...), m.LoadBalancerIPs...) {
		if !usable(ip) || ip.IsLoopback() || ip.IsMulticast() {
			t.Fatalf("kept unusable external address %v", ip)
		}
	}
	for _, p := range m.SourceRanges {
		if !p.IsValid() || p != p.Masked() {
			t.Fatalf("kept source range %v", p)
		}
	}
}

func checkSlice(t *testing.T, es *discovery.EndpointSlice, m *model.EndpointSlice, problems []Problem) {
	t.Helper()
	count := checkProblems(t, "EndpointSlice", problems)
	if m == nil {
		return
	}
	if !validName(m.Service.Namespace) || !validName(m.Service.Name) {
		t.Fatalf("kept a slice of Service %q", m.Service)
	}
	for _, e := range m.Endpoints {
		if a := e.IP.Addr(); !m.Family.Contains(a) || !usable(a) || a.IsLoopback() || a.IsMulticast() {
			t.Fatalf("kept endpoint %v in a %s slice", a, m.Family)
		}
	}
	if len(m.Endpoints)+count["invalid-address"] != len(es.Endpoints) {
		t.Fatalf("%d endpoints: kept %d, reported %d", len(es.Endpoints), len(m.Endpoints), count["invalid-address"])
	}
	for _, p := range m.Ports {
		if p.Port == 0 || !knownProto(p.Protocol) {
			t.Fatalf("kept port %+v", p)
		}
	}
	if skipped := count["invalid-protocol"] + count["invalid-port"]; len(m.Ports)+skipped != len(es.Ports) {
		t.Fatalf("%d ports: kept %d, reported %d", len(es.Ports), len(m.Ports), skipped)
	}
}

// FuzzValidName: validName is validation.IsDNS1123Label's test.
func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", "a", "web-1", "-a", "a-", "A", "a.b", "a_b", "0", "x\n", "é",
		strings.Repeat("a", 63), strings.Repeat("a", 64)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validName(s), len(validation.IsDNS1123Label(s)) == 0; got != want {
			t.Errorf("validName(%q) = %v, IsDNS1123Label says %v", s, got, want)
		}
	})
}
