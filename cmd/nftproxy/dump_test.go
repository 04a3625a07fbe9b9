package main

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	logsapi "k8s.io/component-base/logs/api/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// dumpArgs are the flags every dump of the tests runs with.
var dumpArgs = []string{"dump", "--hostname-override", "n1", "--cluster-cidr", "10.244.0.0/16,fd00:244::/48"}

// proxiedServices are the Services of dumpTestObjects that the dump must
// show, by the comments their rules carry; ignoredServices those it must
// not.
var (
	proxiedServices = []string{"ns/web:tcp", "ns/web:udp", "ns/np:tcp", "ns/lb:tcp", "ns/local:tcp", "ns/sticky:tcp", "ns/empty:tcp"}
	ignoredServices = []string{"ns/extname", "ns/headless", "ns/other-proxy"}
)

// dumpTestObjects are Services of every kind (dual-stack ClusterIP with
// TCP and UDP, NodePort, LoadBalancer with source ranges, externalTraffic
// Policy Local, session affinity, no endpoints, and three the proxy
// ignores), their EndpointSlices, this node and another, ServiceCIDRs and
// a Pod (not read).
func dumpTestObjects() []runtime.Object {
	svc := func(name string, typ v1.ServiceType, ips []string, mutate func(*v1.Service)) *v1.Service {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.ServiceSpec{Type: typ, ClusterIP: ips[0], ClusterIPs: ips,
				Ports: []v1.ServicePort{{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP}}}}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	nodePort := func(p int32) func(*v1.Service) { return func(s *v1.Service) { s.Spec.Ports[0].NodePort = p } }
	objs := []runtime.Object{
		svc("web", v1.ServiceTypeClusterIP, []string{"10.96.0.10", "fd00:96::10"}, func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: "udp", Port: 53, Protocol: v1.ProtocolUDP})
		}),
		svc("np", v1.ServiceTypeNodePort, []string{"10.96.0.11"}, nodePort(30011)),
		svc("lb", v1.ServiceTypeLoadBalancer, []string{"10.96.0.12"}, func(s *v1.Service) {
			s.Spec.Ports[0].NodePort = 30012
			s.Spec.LoadBalancerSourceRanges = []string{"198.51.100.0/24"}
			s.Spec.ExternalIPs = []string{"203.0.113.12"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.12"}}
		}),
		svc("local", v1.ServiceTypeNodePort, []string{"10.96.0.13"}, func(s *v1.Service) {
			s.Spec.Ports[0].NodePort = 30013
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32013
		}),
		svc("sticky", v1.ServiceTypeClusterIP, []string{"10.96.0.14"}, func(s *v1.Service) {
			timeout := int32(600)
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
		}),
		svc("empty", v1.ServiceTypeClusterIP, []string{"10.96.0.15"}, nil),
		svc("extname", v1.ServiceTypeExternalName, []string{""}, func(s *v1.Service) { s.Spec.ExternalName = "example.org" }),
		svc("headless", v1.ServiceTypeClusterIP, []string{v1.ClusterIPNone}, nil),
		svc("other-proxy", v1.ServiceTypeClusterIP, []string{"10.96.0.16"}, func(s *v1.Service) {
			s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "other"}
		}),
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{v1.LabelTopologyZone: "a"}},
			Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:244:1::/64"}},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.10.0.11"},
				{Type: v1.NodeInternalIP, Address: "fd00:10::11"}}}},
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2"},
			Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.10.0.12"}}}},
		&networking.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
			Spec: networking.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:96::/112"}}},
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "a"}},
	}
	for _, s := range []struct {
		svc   string
		fam   discovery.AddressType
		ports map[string]v1.Protocol
		addrs []string
	}{
		{"web", discovery.AddressTypeIPv4, map[string]v1.Protocol{"tcp": v1.ProtocolTCP, "udp": v1.ProtocolUDP}, []string{"10.244.1.2", "10.244.2.2"}},
		{"web", discovery.AddressTypeIPv6, map[string]v1.Protocol{"tcp": v1.ProtocolTCP, "udp": v1.ProtocolUDP}, []string{"fd00:244:1::2"}},
		{"np", discovery.AddressTypeIPv4, map[string]v1.Protocol{"tcp": v1.ProtocolTCP}, []string{"10.244.2.3"}},
		{"lb", discovery.AddressTypeIPv4, map[string]v1.Protocol{"tcp": v1.ProtocolTCP}, []string{"10.244.1.4", "10.244.2.4"}},
		{"local", discovery.AddressTypeIPv4, map[string]v1.Protocol{"tcp": v1.ProtocolTCP}, []string{"10.244.1.5", "10.244.2.5"}},
		{"sticky", discovery.AddressTypeIPv4, map[string]v1.Protocol{"tcp": v1.ProtocolTCP}, []string{"10.244.1.6", "10.244.2.6"}},
		{"empty", discovery.AddressTypeIPv4, map[string]v1.Protocol{"tcp": v1.ProtocolTCP}, nil},
	} {
		objs = append(objs, endpointSlice(s.svc, s.fam, s.ports, s.addrs))
	}
	return objs
}

// endpointSlice is a Service's slice of one family: port 8080 under each
// name, endpoints in 10.244.N.x (fd00:244:N::x) on node nN.
func endpointSlice(svc string, fam discovery.AddressType, ports map[string]v1.Protocol, addrs []string) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-" + strings.ToLower(string(fam)),
		Labels: map[string]string{discovery.LabelServiceName: svc}}, AddressType: fam}
	for name, proto := range ports {
		name, proto, port := name, proto, int32(8080)
		es.Ports = append(es.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	for _, a := range addrs {
		node := "n1"
		if strings.HasPrefix(a, "10.244.2.") {
			node = "n2"
		}
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{a}, NodeName: &node})
	}
	return es
}

// yamlList is objs as `kubectl get … -o yaml` prints them: a v1 List
// whose items say their apiVersion and kind.
func yamlList(t *testing.T, objs []runtime.Object) []byte {
	t.Helper()
	list := &v1.List{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "List"}}
	for _, o := range objs {
		o = o.DeepCopyObject()
		gvks, _, err := scheme.Scheme.ObjectKinds(o)
		if err != nil {
			t.Fatal(err)
		}
		o.GetObjectKind().SetGroupVersionKind(gvks[0])
		list.Items = append(list.Items, runtime.RawExtension{Object: o})
	}
	out, err := yaml.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// runDumpCommand runs nftproxy with args, files served by name and stdin,
// and the API client (nil: none may be made); it returns standard output
// and fails the test unless the exit status is 0.
func runDumpCommand(t *testing.T, client kubernetes.Interface, files map[string]string, stdin string, args ...string) string {
	t.Helper()
	saved := newDumpClient
	t.Cleanup(func() { newDumpClient = saved })
	newDumpClient = func(clientOptions) (kubernetes.Interface, error) {
		if client == nil {
			t.Fatal("dump made an API client")
		}
		return client, nil
	}
	var stdout, stderr syncBuffer
	env := testEnv(files)
	env.stdout, env.stderr, env.stdin = &stdout, &stderr, strings.NewReader(stdin)
	code := execute(context.Background(), args, env)
	if err := logsapi.ResetForTest(nil); err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("nftproxy %v: exit status %d: %s", args, code, stderr.String())
	}
	return stdout.String()
}

// TestDumpFromFileEqualsFromAPI: the objects listed from an API (a fake
// clientset holding the Go objects) and the same objects as kubectl's YAML
// List (--from-file; also split over two files, and a YAML stream on
// standard input) give the same dump, which has both families' tables, the
// Services the proxy serves and none of those it ignores.
func TestDumpFromFileEqualsFromAPI(t *testing.T) {
	objs := dumpTestObjects()
	fromAPI := runDumpCommand(t, fake.NewClientset(objs...), nil, "", dumpArgs...)
	for _, want := range []string{"table ip nftproxy {", "table ip6 nftproxy {", "10.10.0.11", "198.51.100.0/24", "fd00:96::/112"} {
		if !strings.Contains(fromAPI, want) {
			t.Errorf("the dump lacks %q:\n%s", want, fromAPI)
		}
	}
	for _, svc := range proxiedServices {
		if !strings.Contains(fromAPI, `"`+svc+`"`) {
			t.Errorf("the dump lacks Service port %s:\n%s", svc, fromAPI)
		}
	}
	for _, svc := range ignoredServices {
		if strings.Contains(fromAPI, svc) {
			t.Errorf("the dump has %s, which the proxy ignores", svc)
		}
	}
	whole := string(yamlList(t, objs))
	half := len(objs) / 2
	var stream strings.Builder
	for _, o := range objs {
		stream.WriteString("---\n")
		stream.Write(yamlList(t, []runtime.Object{o}))
	}
	for name, run := range map[string]func() string{
		"one file": func() string {
			return runDumpCommand(t, nil, map[string]string{"all.yaml": whole}, "", append(dumpArgs, "--from-file", "all.yaml")...)
		},
		"two files": func() string {
			files := map[string]string{"a.yaml": string(yamlList(t, objs[:half])), "b.yaml": string(yamlList(t, objs[half:]))}
			return runDumpCommand(t, nil, files, "", append(dumpArgs, "--from-file", "a.yaml", "--from-file", "b.yaml")...)
		},
		"stdin": func() string {
			return runDumpCommand(t, nil, nil, stream.String(), append(dumpArgs, "--from-file", "-")...)
		},
	} {
		if got := run(); got != fromAPI {
			t.Errorf("%s: the dump from the file differs from the API's:\n%s\nwant:\n%s", name, got, fromAPI)
		}
	}
}

// TestDumpFollowsFlags: kube-proxy's flags and --config shape the dump as
// they shape the proxy: --ip-families, --masquerade-all, the masquerade
// bit, and the node named.
func TestDumpFollowsFlags(t *testing.T) {
	files := map[string]string{"all.yaml": string(yamlList(t, dumpTestObjects())),
		"config.yaml": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nhostnameOverride: n1\nnftables:\n  masqueradeAll: true\n  masqueradeBit: 3\n"}
	from := []string{"--from-file", "all.yaml"}
	v4 := runDumpCommand(t, nil, files, "", append(append(dumpArgs, from...), "--ip-families", "ipv4")...)
	if strings.Contains(v4, "table ip6") || !strings.Contains(v4, "table ip nftproxy") {
		t.Errorf("--ip-families ipv4 dumps:\n%s", v4)
	}
	cfg := runDumpCommand(t, nil, files, "", append([]string{"dump", "--config", "config.yaml"}, from...)...)
	if !strings.Contains(cfg, "0x00000008") || strings.Contains(cfg, "0x00004000") {
		t.Errorf("--config with masqueradeBit 3 dumps:\n%s", cfg)
	}
	n2 := runDumpCommand(t, nil, files, "", append(append(dumpArgs, from...), "--hostname-override", "n2")...)
	if !strings.Contains(n2, "10.10.0.12") || strings.Contains(n2, "10.10.0.11") {
		t.Errorf("the dump for n2 does not answer NodePorts on n2's address only:\n%s", n2)
	}
	plain := runDumpCommand(t, nil, files, "", append(dumpArgs, from...)...)
	gate := append(append(dumpArgs, from...), "--feature-gates", "KubeProxyNFTablesLocalhostNodePorts=true")
	refused := runDumpCommand(t, nil, files, "", gate...)
	proxied := runDumpCommand(t, nil, files, "", append(gate, "--nodeport-addresses", "primary,localhost")...)
	for _, tc := range []struct {
		name, dump string
		want, not  []string
	}{
		{"without the gate", plain, nil, []string{"localhost"}},
		{"with the gate", refused, []string{"ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports",
			"ip6 daddr ::1 meta l4proto . th dport vmap @localhost-nodeport-reject-ports",
			`tcp . 30011 comment "ns/np:tcp" : goto localhost-nodeport-reject`}, nil},
		{"with the gate and localhost", proxied, []string{"localhost-nodeport-reject-ports"}, []string{": goto localhost-nodeport-reject,", "tcp . 30011 comment \"ns/np:tcp\" : goto localhost-nodeport-reject"}},
	} {
		for _, w := range tc.want {
			if !strings.Contains(tc.dump, w) {
				t.Errorf("%s: the dump lacks %q:\n%s", tc.name, w, tc.dump)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(tc.dump, n) {
				t.Errorf("%s: the dump has %q:\n%s", tc.name, n, tc.dump)
			}
		}
	}
}

// TestDumpLoadsInNft: `nft -c -f` accepts the dump, in a fresh network
// namespace; loaded there for real, `nft list` prints each table back as
// the dump has it.
func TestDumpLoadsInNft(t *testing.T) {
	ns := netns.New(t, "nftproxy-dump", "nft")
	out := runDumpCommand(t, fake.NewClientset(dumpTestObjects()...), nil, "", dumpArgs...)
	lang := nfttest.SystemNft(t, func(stdin string, args ...string) (string, error) {
		return ns.Run(stdin, append([]string{"nft"}, args...)...)
	})
	if why := lang.CannotReadReason(out); why != "" {
		t.Skip(why)
	}
	if _, err := ns.Run(out, "nft", "-c", "-f", "-"); err != nil {
		t.Fatalf("nft -c -f rejects the dump: %v\n%s", err, out)
	}
	if _, err := ns.Run(out, "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f rejects the dump: %v", err)
	}
	tables := strings.SplitAfter(out, "}\ntable ")
	for i, fam := range []string{"ip", "ip6"} {
		want := tables[i]
		if i > 0 {
			want = "table " + want
		}
		want = strings.TrimSuffix(want, "table ")
		listing, err := ns.Run("", "nft", "list", "table", fam, nft.TableName)
		if err != nil {
			t.Fatal(err)
		}
		if got := nft.Canonical(listing); got != lang.Listing(want) {
			t.Errorf("nft lists the %s table loaded from the dump as:\n%s\nthe dump has:\n%s", fam, got, want)
		}
	}
}

// TestDumpRefusesProxyCommands: dump runs none of the proxy's commands,
// and says so rather than ignore them; a file that does not decode fails.
func TestDumpRefusesProxyCommands(t *testing.T) {
	for _, args := range [][]string{{"dump", "--cleanup"}, {"dump", "--init-only"}, {"dump", "--write-config-to", "x"}} {
		if code, _, stderr := executeForTest(t, nil, args...); code != 2 || !strings.Contains(stderr, "not a dump option") {
			t.Errorf("%v: exit %d, stderr %q; want 2, not a dump option", args, code, stderr)
		}
	}
	files := map[string]string{"bad.yaml": "kind: Service\n"}
	if code, stdout, stderr := executeForTest(t, files, "dump", "--from-file", "bad.yaml"); code != 1 || stdout != "" || !strings.Contains(stderr, "bad.yaml") {
		t.Errorf("a file without apiVersion: exit %d, stdout %q, stderr %q; want 1, nothing, the file named", code, stdout, stderr)
	}
}
