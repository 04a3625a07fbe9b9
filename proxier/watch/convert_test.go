package watch

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/proxier/model"
)

func TestConvertServiceIgnores(t *testing.T) {
	base := func() *v1.Service {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s", Labels: map[string]string{}},
			Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
				Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}
	}
	tests := []struct {
		name   string
		mutate func(*v1.Service)
		want   bool // converted (not ignored)
	}{
		{"plain ClusterIP", func(*v1.Service) {}, true},
		{"ExternalName", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }, false},
		{"headless", func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }, false},
		{"headless label", func(s *v1.Service) { s.Labels[LabelHeadless] = "" }, false},
		{"other proxy", func(s *v1.Service) { s.Labels[LabelServiceProxyName] = "other" }, false},
		{"invalid ClusterIP", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"1.2.3"} }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.mutate(s)
			got, _ := ConvertService(s)
			if (got != nil) != tc.want {
				t.Errorf("converted=%v, want %v", got != nil, tc.want)
			}
		})
	}
}

func TestConvertServiceReportsBadPorts(t *testing.T) {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Spec: v1.ServiceSpec{ClusterIPs: []string{"10.96.0.1", "bogus"}, Ports: []v1.ServicePort{
			{Name: "ok", Port: 80, Protocol: v1.ProtocolUDP},
			{Name: "bad-proto", Port: 81, Protocol: "ICMP"},
			{Name: "bad-port", Port: 70000, Protocol: v1.ProtocolTCP},
			{Name: "ok", Port: 82, Protocol: v1.ProtocolUDP},
		}}}
	got, problems := ConvertService(s)
	if got == nil || len(got.Ports) != 1 || got.Ports[0].Port != 80 || len(got.ClusterIPs) != 1 {
		t.Fatalf("want the one good port and IP kept, got %+v", got)
	}
	reasons := map[string]bool{}
	for _, p := range problems {
		reasons[p.Reason] = true
	}
	for _, r := range []string{"invalid-cluster-ip", "invalid-protocol", "invalid-port", "duplicate-port"} {
		if !reasons[r] {
			t.Errorf("problem %q not reported: %+v", r, problems)
		}
	}
}

func TestConvertEndpointSlice(t *testing.T) {
	port, name, proto := int32(8080), "http", v1.ProtocolTCP
	f := false
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "s-1", Labels: map[string]string{discovery.LabelServiceName: "s"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}, {Name: &name}},
		Endpoints: []discovery.Endpoint{
			{Addresses: []string{"10.244.1.1"}},
			{Addresses: []string{"10.244.1.2"}, Conditions: discovery.EndpointConditions{Ready: &f}},
			{Addresses: []string{"fd00::1"}},
			{Addresses: []string{"300.1.1.1"}},
		},
	}
	got, problems := ConvertEndpointSlice(es)
	if got == nil || got.Service.Name != "s" || len(got.Ports) != 1 || len(got.Endpoints) != 2 {
		t.Fatalf("got %+v", got)
	}
	if !got.Endpoints[0].Ready || got.Endpoints[1].Ready || got.Endpoints[1].Serving {
		t.Errorf("conditions: %+v", got.Endpoints)
	}
	if len(problems) != 3 {
		t.Errorf("want 3 problems (port without number, IPv6 address in IPv4 slice, bad address), got %+v", problems)
	}
	es.AddressType = discovery.AddressTypeFQDN
	if got, _ := ConvertEndpointSlice(es); got != nil {
		t.Errorf("FQDN slice converted")
	}
}

func TestConvertServiceExternal(t *testing.T) {
	proxy, vip := v1.LoadBalancerIPModeProxy, v1.LoadBalancerIPModeVIP
	local := v1.ServiceInternalTrafficPolicyLocal
	timeout := int32(600)
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.0.1"},
			Ports:                    []v1.ServicePort{{Name: "a", Port: 80, NodePort: 30080}, {Name: "b", Port: 81, NodePort: 70000}},
			ExternalIPs:              []string{"192.0.2.1", "not-an-ip"},
			LoadBalancerSourceRanges: []string{"198.51.100.7/24", "bad"},
			ExternalTrafficPolicy:    v1.ServiceExternalTrafficPolicyLocal, InternalTrafficPolicy: &local,
			HealthCheckNodePort: 32000, SessionAffinity: v1.ServiceAffinityClientIP,
			SessionAffinityConfig: &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}},
		Status: v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{
			{IP: "192.0.2.2", IPMode: &vip}, {IP: "192.0.2.3", IPMode: &proxy}, {Hostname: "lb.example"}, {IP: "192.0.2.4"}}}}}
	got, problems := ConvertService(s)
	if got == nil {
		t.Fatal("not converted")
	}
	if len(got.Ports) != 2 || got.Ports[0].NodePort != 30080 || got.Ports[1].NodePort != 0 {
		t.Errorf("ports %+v", got.Ports)
	}
	if len(got.ExternalIPs) != 1 || got.ExternalIPs[0].String() != "192.0.2.1" {
		t.Errorf("external IPs %v", got.ExternalIPs)
	}
	if len(got.LoadBalancerIPs) != 2 || got.LoadBalancerIPs[0].String() != "192.0.2.2" || got.LoadBalancerIPs[1].String() != "192.0.2.4" {
		t.Errorf("load balancer IPs %v (ipMode Proxy must be skipped)", got.LoadBalancerIPs)
	}
	if len(got.SourceRanges) != 1 || got.SourceRanges[0].String() != "198.51.100.0/24" {
		t.Errorf("source ranges %v", got.SourceRanges)
	}
	if !got.ExternalLocal || !got.InternalLocal || got.HealthCheckNodePort != 32000 || got.AffinityTimeout.Seconds() != 600 {
		t.Errorf("policies %+v", got)
	}
	if len(problems) != 3 {
		t.Errorf("want 3 problems (node port, external IP, source range), got %v", problems)
	}
	s.Spec.Type = v1.ServiceTypeClusterIP
	if got, _ := ConvertService(s); got.Ports[0].NodePort != 0 || len(got.LoadBalancerIPs) != 0 {
		t.Errorf("ClusterIP type keeps NodePort/LB IPs: %+v", got)
	}
}

func TestConvertNode(t *testing.T) {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{v1.LabelTopologyZone: "z"}},
		Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:244:1::/64"}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{
			{Type: v1.NodeExternalIP, Address: "192.0.2.9"}, {Type: v1.NodeInternalIP, Address: "10.10.0.11"},
			{Type: v1.NodeInternalIP, Address: "10.10.0.12"}, {Type: v1.NodeExternalIP, Address: "2001:db8::9"}}}}
	got := ConvertNode(n)
	if got.Name != "n1" || got.Zone != "z" || len(got.PodCIDRs) != 2 {
		t.Errorf("%+v", got)
	}
	if len(got.Addresses) != 2 || got.Addresses[0].String() != "10.10.0.11" || got.Addresses[1].String() != "2001:db8::9" {
		t.Errorf("primary addresses %v: want the first InternalIP, else ExternalIP, per family", got.Addresses)
	}
}

func TestConvertEndpointHints(t *testing.T) {
	es := testSlice("s-1", "s", "10.244.1.1", "10.244.1.2")
	es.Endpoints[0].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "a"}}, ForNodes: []discovery.ForNode{{Name: "n1"}}}
	es.Endpoints[1].Hints = &discovery.EndpointHints{}
	got, _ := ConvertEndpointSlice(es)
	if e := got.Endpoints[0]; len(e.ZoneHints()) != 1 || e.ZoneHints()[0] != "a" || len(e.NodeHints()) != 1 || e.NodeHints()[0] != "n1" {
		t.Errorf("hints: %+v", e.Place)
	}
	if e := got.Endpoints[1]; e.Place != nil {
		t.Errorf("empty hints and no node: %+v, want no placement", e.Place)
	}
}

// TestConvertSharesPlacements: endpoints on one node with the same hints
// share one Placement, in one slice or in two; any other difference makes
// another, including names that would read alike if joined.
func TestConvertSharesPlacements(t *testing.T) {
	node := func(s string) *string { return &s }
	hints := func(zones []string, nodes ...string) *discovery.EndpointHints {
		h := &discovery.EndpointHints{}
		for _, z := range zones {
			h.ForZones = append(h.ForZones, discovery.ForZone{Name: z})
		}
		for _, n := range nodes {
			h.ForNodes = append(h.ForNodes, discovery.ForNode{Name: n})
		}
		return h
	}
	es := testSlice("s-1", "s", "10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.1.4", "10.244.1.5", "10.244.1.6", "10.244.1.7")
	es.Endpoints[0].NodeName, es.Endpoints[0].Hints = node("n1"), hints([]string{"a"})
	es.Endpoints[1].NodeName, es.Endpoints[1].Hints = node("n1"), hints([]string{"a"})
	es.Endpoints[2].NodeName = node("n1")
	es.Endpoints[3].NodeName, es.Endpoints[3].Hints = node("n1"), hints([]string{"a", "b"})
	es.Endpoints[4].NodeName, es.Endpoints[4].Hints = node("n1"), hints([]string{"a"}, "b")
	es.Endpoints[5].NodeName, es.Endpoints[5].Hints = node("n1a"), hints(nil)
	es.Endpoints[6].Hints = hints(nil, "n1")
	other := testSlice("s-2", "s", "10.244.2.1")
	other.Endpoints[0].NodeName, other.Endpoints[0].Hints = node("n1"), hints([]string{"a"})
	got, _ := ConvertEndpointSlice(es)
	got2, _ := ConvertEndpointSlice(other)
	e := got.Endpoints
	if e[0].Place != e[1].Place || e[0].Place != got2.Endpoints[0].Place {
		t.Errorf("same node and hints: placements %p %p %p, want one", e[0].Place, e[1].Place, got2.Endpoints[0].Place)
	}
	want := []model.Placement{{NodeName: "n1", Zones: []string{"a"}}, {NodeName: "n1", Zones: []string{"a"}},
		{NodeName: "n1"}, {NodeName: "n1", Zones: []string{"a", "b"}}, {NodeName: "n1", Zones: []string{"a"}, Nodes: []string{"b"}},
		{NodeName: "n1a"}, {Nodes: []string{"n1"}}}
	seen := map[*model.Placement]int{}
	for i := range e {
		if !reflect.DeepEqual(*e[i].Place, want[i]) {
			t.Errorf("endpoint %d: placement %+v, want %+v", i, *e[i].Place, want[i])
		}
		if j, ok := seen[e[i].Place]; ok && i != 1 {
			t.Errorf("endpoints %d and %d share a placement: %+v", j, i, *e[i].Place)
		}
		seen[e[i].Place] = i
	}
}

// TestConvertRejectsInvalidNames: a namespace, name or port name that is
// not a DNS-1123 label (which the API server refuses, but etcd holds what
// is written into it) skips the object or the port, with a problem: these
// names become chain names and comments.
func TestConvertRejectsInvalidNames(t *testing.T) {
	l63, l64 := strings.Repeat("a", 63), strings.Repeat("a", 64)
	for _, tc := range []struct {
		ns, name, port string
		want           string // the problem's reason; "": converted whole
	}{
		{l63, l63, l63, ""},
		{"ns", "1st", "2nd", ""}, // RelaxedServiceNameValidation
		{l64, "s", "p", "invalid-name"},
		{"ns", l64, "p", "invalid-name"},
		{"ns", "s", l64, "invalid-port-name"},
		{"", "s", "p", "invalid-name"},
		{"ns", "s", "P", "invalid-port-name"},
		{"ns", `s" } chain x {`, "p", "invalid-name"},
		{"ns\n", "s", "p", "invalid-name"},
		{"ñs", "s", "p", "invalid-name"},
		{"ns", "s", "p;", "invalid-port-name"},
		{"ns", "-s", "p", "invalid-name"},
	} {
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: tc.name},
			Spec: v1.ServiceSpec{ClusterIPs: []string{"10.96.0.1"},
				Ports: []v1.ServicePort{{Name: tc.port, Port: 80}, {Name: "ok", Port: 81}}}}
		got, problems := ConvertService(svc)
		reasons := reasonsOf(problems)
		switch tc.want {
		case "":
			if got == nil || len(got.Ports) != 2 || len(problems) != 0 {
				t.Errorf("%q/%q:%q: got %+v, problems %v", tc.ns, tc.name, tc.port, got, problems)
			}
		case "invalid-name":
			if got != nil || !slices.Equal(reasons, []string{tc.want}) {
				t.Errorf("%q/%q: got %+v, problems %v; want none and %s", tc.ns, tc.name, got, problems, tc.want)
			}
		default:
			if got == nil || len(got.Ports) != 1 || got.Ports[0].Name != "ok" || !slices.Equal(reasons, []string{tc.want}) {
				t.Errorf("port %q: got %+v, problems %v; want port ok and %s", tc.port, got, problems, tc.want)
			}
		}
		es := testSlice("s-1", tc.name, "10.244.1.1")
		es.Namespace = tc.ns
		gotES, problems := ConvertEndpointSlice(es)
		if nameOK := tc.want != "invalid-name"; (gotES != nil) != nameOK || nameOK != (len(problems) == 0) {
			t.Errorf("slice of %q/%q: got %+v, problems %v", tc.ns, tc.name, gotES, problems)
		}
	}
}

func reasonsOf(problems []Problem) []string {
	var out []string
	for _, p := range problems {
		out = append(out, p.Reason)
	}
	return out
}

// TestConvertServiceDuplicates: of two ports with one protocol and number,
// or one name, and of two ClusterIPs of one family, the first is kept (the
// API server refuses the second).
func TestConvertServiceDuplicates(t *testing.T) {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Spec: v1.ServiceSpec{ClusterIPs: []string{"10.96.0.1", "fd00::1", "10.96.0.2", "fd00::2"}, Ports: []v1.ServicePort{
			{Name: "a", Port: 80, Protocol: v1.ProtocolTCP},
			{Name: "b", Port: 80, Protocol: v1.ProtocolTCP},
			{Name: "c", Port: 80, Protocol: v1.ProtocolUDP},
			{Name: "a", Port: 81, Protocol: v1.ProtocolSCTP},
		}}}
	got, problems := ConvertService(s)
	if got == nil || len(got.ClusterIPs) != 2 || got.ClusterIPs[0].String() != "10.96.0.1" || got.ClusterIPs[1].String() != "fd00::1" {
		t.Fatalf("ClusterIPs %+v", got)
	}
	if len(got.Ports) != 2 || got.Ports[0].Name != "a" || got.Ports[1].Name != "c" {
		t.Errorf("ports %+v", got.Ports)
	}
	if r := reasonsOf(problems); !slices.Equal(r, []string{"invalid-cluster-ip", "invalid-cluster-ip", "duplicate-port", "duplicate-port"}) {
		t.Errorf("problems %v", problems)
	}
}

// TestConvertEndpointSliceProblems: each skipped port or endpoint of a
// slice is reported, with a reason of its own.
func TestConvertEndpointSliceProblems(t *testing.T) {
	es := testSlice("s-1", "s", "10.244.1.1", "fd00::1", "10.244.1.300")
	icmp, zero, big := v1.Protocol("ICMP"), int32(0), int32(65536)
	es.Ports = append(es.Ports, discovery.EndpointPort{Port: es.Ports[0].Port, Protocol: &icmp},
		discovery.EndpointPort{Port: &zero}, discovery.EndpointPort{Port: &big}, discovery.EndpointPort{})
	es.Endpoints = append(es.Endpoints, discovery.Endpoint{})
	got, problems := ConvertEndpointSlice(es)
	if got == nil || len(got.Ports) != 1 || len(got.Endpoints) != 1 {
		t.Fatalf("got %+v", got)
	}
	want := []string{"invalid-protocol", "invalid-port", "invalid-port", "invalid-port",
		"invalid-address", "invalid-address", "invalid-address"}
	if r := reasonsOf(problems); !slices.Equal(r, want) {
		t.Errorf("problems %v, want reasons %v", problems, want)
	}
}
