package watch

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
