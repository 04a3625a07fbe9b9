package watch

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/nft"
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
		if m, _ := ConvertService(svc); m != nil {
			for _, ip := range m.ClusterIPs {
				if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
					t.Fatalf("kept unusable ClusterIP %v", ip)
				}
			}
			for _, p := range m.Ports {
				if p.Port == 0 || (p.Protocol != nft.ProtoTCP && p.Protocol != nft.ProtoUDP && p.Protocol != nft.ProtoSCTP) {
					t.Fatalf("kept unusable port %+v", p)
				}
			}
		}
		pr := v1.Protocol(proto)
		name := "p"
		es := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "s-1", Labels: map[string]string{discovery.LabelServiceName: "s"}},
			AddressType: discovery.AddressType(addrType),
			Ports:       []discovery.EndpointPort{{Name: &name, Port: &epPort, Protocol: &pr}},
			Endpoints:   []discovery.Endpoint{{Addresses: []string{epAddr}}},
		}
		if m, _ := ConvertEndpointSlice(es); m != nil {
			for _, e := range m.Endpoints {
				if !m.Family.Contains(e.Addr) || e.Addr.Zone() != "" {
					t.Fatalf("kept endpoint %v in a %s slice", e.Addr, m.Family)
				}
			}
			for _, p := range m.Ports {
				if p.Port == 0 {
					t.Fatalf("kept port 0")
				}
			}
		}
	})
}
