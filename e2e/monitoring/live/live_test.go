package live

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/monitoring"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestMonitoring proves deploy/monitoring/ on the e2e bed: its manifests
// are accepted by the API server with the Prometheus operator's CRDs, and
// a real Prometheus, scraping nftproxy every second as job kube-proxy
// while Services and EndpointSlices change, nftproxy restarts and its
// table is deleted behind its back, returns series for every dashboard
// panel query, every alert's expression below its threshold and every
// query of the kubernetes-mixin's "Kubernetes / Proxy" dashboard, and
// fires none of the alerts.
func TestMonitoring(t *testing.T) {
	testbed.RequirePrivileges(t)
	promBin := monitoring.RequireTool(t, "prometheus")
	proxyBin := testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	bin := testbed.EnsureBinaries(t)
	kubectlBin := filepath.Join(bin, "kubectl")
	if _, err := os.Stat(kubectlBin); err != nil {
		t.Fatalf("%v (e2e/tools/build.sh builds it)", err)
	}
	rule, err := monitoring.LoadRule()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := rule.RulesFile()
	if err != nil {
		t.Fatal(err)
	}
	bed := testbed.Start(t, testbed.Options{BinDir: bin})
	t.Run("manifests", func(t *testing.T) { dryRunManifests(t, kubectl{bed: bed, bin: kubectlBin, dir: t.TempDir()}) })

	node := bed.AddNode("n1")
	target := node.IPv4.String() + ":10249"
	s := &scenario{t: t, client: bed.Client(), node: node, ns: "mon"}
	s.setup()
	prom := startPrometheus(t, bed, promBin, target, rules)
	// Metrics on the node's IP as the DaemonSet serves them. Tables not
	// owned, so that the test can change one behind nftproxy's back (as
	// another process could then) and see it repaired.
	s.proxyArgs = []string{proxyBin, "--kubeconfig", bed.ProxyKubeconfig, "--hostname-override", node.Name,
		"--cluster-cidr", "10.244.0.0/16,fd00:244::/32", "--iptables-min-sync-period", "0s",
		"--metrics-bind-address-override", node.IPv4.String(), "--own-tables=false", "--v", "2"}
	s.startProxy()
	s.churn()
	waitScraped(t, prom, time.Now())
	t.Logf("Prometheus ran %s, evaluating with a range of %s", time.Since(prom.started).Round(time.Second), prom.window())

	t.Run("dashboard", func(t *testing.T) { checkDashboard(t, prom) })
	t.Run("alerts", func(t *testing.T) { checkAlerts(t, prom, rule) })
	t.Run("mixin", func(t *testing.T) { checkMixin(t, prom) })
	t.Run("programming latency", func(t *testing.T) {
		// The running nftproxy's latencies add up to seconds: the
		// endpoints changed an hour before it started are not counted
		// (upstream leaves them out too).
		got, err := prom.query(`kubeproxy_network_programming_duration_seconds_sum{job="kube-proxy"}`)
		if err != nil || len(got) != 2 {
			t.Fatalf("network programming latency sums %v, %v: want one per family", got, err)
		}
		for _, s := range got {
			if !(s.float() < 60) {
				t.Errorf("%s: network programming latencies add up to %v s", s.Metric["ip_family"], s.float())
			}
		}
	})
}

// checkDashboard evaluates the dashboard's variables, then every panel
// query with them, each of which must return a series with a finite value.
func checkDashboard(t *testing.T, prom *prometheus) {
	d, err := monitoring.LoadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string][]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		selector, label, err := monitoring.LabelValues(v.QueryString())
		if err == nil {
			selector, err = monitoring.Substitute(selector, values, prom.window())
		}
		if err == nil {
			values[v.Name], err = prom.labelValues(selector, label)
		}
		if err != nil || len(values[v.Name]) == 0 {
			t.Fatalf("variable %s (%s): values %v, %v", v.Name, v.QueryString(), values[v.Name], err)
		}
		t.Logf("$%s = %v", v.Name, values[v.Name])
	}
	for _, q := range d.Queries() {
		expr, err := monitoring.Substitute(q.Expr, values, prom.window())
		if err != nil {
			t.Error(err)
			continue
		}
		expectSeries(t, prom, q.String(), expr)
	}
}

// mayBeNaN are queries whose series may all be NaN in a run this short:
// client-go times its requests but not watches, and after its first lists
// nftproxy sends none until a watch ends (every 5 to 10 minutes), so a
// rate of its request latency over the test is 0/0.
var mayBeNaN = map[string]bool{
	`"API request latency p99 by verb" A`:   true,
	`"Get Request Latency 99th Quantile" A`: true,
}

// checkAlerts: every alert's expression below its thresholds returns
// series, Prometheus evaluates every rule without error, and none fires.
func checkAlerts(t *testing.T, prom *prometheus, rule *monitoring.PrometheusRule) {
	for _, r := range rule.Rules() {
		inner, err := monitoring.Inner(r.Expr)
		if err != nil {
			t.Fatal(err)
		}
		for _, expr := range inner {
			expectSeries(t, prom, "alert "+r.Name(), expr)
		}
	}
	evaluated, err := prom.rules()
	if err != nil {
		t.Fatal(err)
	}
	if len(evaluated) != len(rule.Rules()) {
		t.Errorf("Prometheus evaluates %d rules, the PrometheusRule has %d", len(evaluated), len(rule.Rules()))
	}
	for _, r := range evaluated {
		if r.Health != "ok" || r.LastError != "" {
			t.Errorf("rule %s: health %q: %s", r.Name, r.Health, r.LastError)
		}
		if r.State == "firing" {
			t.Errorf("alert %s fires on a healthy nftproxy", r.Name)
		}
	}
}

// mixinMayBeEmpty are mixin queries that a healthy proxy leaves empty.
var mixinMayBeEmpty = map[string]string{
	`"Kube API Request Rate" B`:              "no 3xx answers from the API server",
	`"Kube API Request Rate" C`:              "no 4xx answers from the API server",
	`"Kube API Request Rate" D`:              "no 5xx answers from the API server",
	`"Post Request Latency 99th Quantile" A`: "nftproxy makes no POST requests (monitoring.MixinGaps)",
}

// checkMixin evaluates the kubernetes-mixin's queries as its dashboard
// would with one cluster and the instance its variable lists.
func checkMixin(t *testing.T, prom *prometheus) {
	selector, label, err := monitoring.LabelValues(monitoring.MixinInstanceVariable)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string][]string{"cluster": {""}}
	selector, err = monitoring.Substitute(selector, values, "5m")
	if err == nil {
		values["instance"], err = prom.labelValues(selector, label)
	}
	if err != nil || len(values["instance"]) == 0 {
		t.Fatalf("the mixin's instance variable lists %v (%v): its dashboard would be empty", values["instance"], err)
	}
	for _, q := range monitoring.MixinQueries {
		expr, err := monitoring.Substitute(q.Expr, values, "5m")
		if err != nil {
			t.Fatal(err)
		}
		if why, ok := mixinMayBeEmpty[q.String()]; ok {
			if _, err := prom.query(expr); err != nil {
				t.Errorf("%s (%s): %v", q, why, err)
			}
			continue
		}
		expectSeries(t, prom, q.String(), expr)
	}
	inner, err := monitoring.Inner(monitoring.MixinKubeProxyDown)
	if err != nil {
		t.Fatal(err)
	}
	expectSeries(t, prom, "KubeProxyDown", inner[0])
	if got, err := prom.query(monitoring.MixinKubeProxyDown); err != nil || len(got) != 0 {
		t.Errorf("KubeProxyDown's expression returns %v (%v) with nftproxy up", got, err)
	}
}

// expectSeries: expr returns at least one series, with a finite value
// unless what is in mayBeNaN.
func expectSeries(t *testing.T, prom *prometheus, what, expr string) {
	t.Helper()
	got, err := prom.query(expr)
	switch {
	case err != nil:
		t.Errorf("%s: %v\n\t%s", what, err, expr)
	case len(got) == 0:
		t.Errorf("%s: no series\n\t%s", what, expr)
	case finite(got) == 0 && !mayBeNaN[what]:
		t.Errorf("%s: %d series, none with a finite value\n\t%s", what, len(got), expr)
	}
}

// waitScraped waits until Prometheus has scraped nftproxy twice after
// since, so that the last changes' metrics are stored.
func waitScraped(t *testing.T, prom *prometheus, since time.Time) {
	expr := `timestamp(up{job="kube-proxy"} == 1)`
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		got, err := prom.query(expr)
		if err == nil && len(got) == 1 && got[0].float() > float64(since.Add(2*time.Second).Unix()) {
			return
		}
	}
	t.Fatalf("Prometheus did not scrape nftproxy after the changes:\n%s", prom.proc.Log())
}

// scenario is the node, its nftproxy and the API objects the test
// changes.
type scenario struct {
	t         *testing.T
	client    kubernetes.Interface
	node      *testbed.Node
	ns        string
	proxyArgs []string
	proxy     *testbed.Process
}

// setup creates, before nftproxy starts, a dual-stack Service with a UDP
// and a TCP port and its endpoints, a Service whose endpoints changed an
// hour ago, and a Service with an external IP nftproxy cannot program (a
// multicast address, which the API server accepts).
func (s *scenario) setup() {
	ctx := context.Background()
	if _, err := s.client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.ns}}, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
	s.service("dns", v1.ProtocolUDP, v1.ProtocolTCP)
	s.endpoints("dns", 1)
	// Endpoints last changed an hour ago, long before nftproxy starts: no
	// network programming latency of nftproxy's, at its start or restart.
	s.service("old", v1.ProtocolTCP)
	s.endpointsChangedAt("old", 1, time.Now().Add(-time.Hour))
	multicast := s.serviceObject("multicast", v1.ProtocolTCP)
	multicast.Spec.ExternalIPs = []string{"239.1.1.1"}
	if _, err := s.client.CoreV1().Services(s.ns).Create(ctx, multicast, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

// churn changes Services and EndpointSlices a few times a second, probes
// the health endpoints as kubelet would, restarts nftproxy once, and once
// deletes its table behind its back (nftproxy repairs it with a full
// sync).
func (s *scenario) churn() {
	for i := 0; i < 24; i++ {
		switch i % 3 {
		case 0:
			s.endpoints("dns", 1+i%2) // a UDP Service's endpoints: a conntrack cleanup
		case 1:
			s.service(fmt.Sprintf("web-%d", i), v1.ProtocolTCP)
			s.endpoints(fmt.Sprintf("web-%d", i), 2)
		case 2:
			s.deleteService(fmt.Sprintf("web-%d", i-1))
		}
		switch i {
		case 9:
			s.proxy.Stop(5 * time.Second)
			s.startProxy()
		case 15:
			s.deleteTable()
		}
		s.probeHealth()
		time.Sleep(500 * time.Millisecond)
	}
}

func (s *scenario) startProxy() {
	s.proxy = s.node.Start(s.proxyArgs...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.proxy.WaitForLog(ctx, "Synced"); err != nil {
		s.t.Fatal(err)
	}
}

// deleteTable deletes nftproxy's IPv4 table, as another process might,
// and waits for nftproxy to repair it (a full sync).
func (s *scenario) deleteTable() {
	repaired := strings.Count(s.proxy.Log(), "Repaired the table")
	if _, err := s.node.Exec(context.Background(), "nft", "delete", "table", "ip", "nftproxy"); err != nil {
		s.t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := s.node.Exec(context.Background(), "nft", "list", "table", "ip", "nftproxy"); err == nil &&
			strings.Count(s.proxy.Log(), "Repaired the table") > repaired {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the deleted table was not repaired:\n%s", s.proxy.Log())
		}
	}
}

// probeHealth asks /healthz and /livez, as kubelet's probes would.
func (s *scenario) probeHealth() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, path := range []string{"/healthz", "/livez"} {
		if _, err := s.node.HTTPGet(ctx, "http://127.0.0.1:10256"+path); err != nil {
			s.t.Errorf("GET %s: %v", path, err)
		}
	}
}

func (s *scenario) serviceObject(name string, protos ...v1.Protocol) *v1.Service {
	pol := v1.IPFamilyPolicyRequireDualStack
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns},
		Spec: v1.ServiceSpec{IPFamilyPolicy: &pol, IPFamilies: []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}}}
	for _, p := range protos {
		svc.Spec.Ports = append(svc.Spec.Ports, v1.ServicePort{Name: strings.ToLower(string(p)), Port: 53, Protocol: p})
	}
	return svc
}

func (s *scenario) service(name string, protos ...v1.Protocol) {
	if _, err := s.client.CoreV1().Services(s.ns).Create(context.Background(), s.serviceObject(name, protos...), metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *scenario) deleteService(name string) {
	ctx := context.Background()
	if err := s.client.CoreV1().Services(s.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatal(err)
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		if err := s.client.DiscoveryV1().EndpointSlices(s.ns).Delete(ctx, name+"-"+fam, metav1.DeleteOptions{}); err != nil {
			s.t.Fatal(err)
		}
	}
}

// endpoints writes the Service's EndpointSlices with n endpoints on this
// node, changed now.
func (s *scenario) endpoints(svcName string, n int) { s.endpointsChangedAt(svcName, n, time.Now()) }

// endpointsChangedAt writes the Service's EndpointSlices with n endpoints
// on this node, stamped, as the EndpointSlice controller stamps them, with
// the time of the change (the network programming latency's start).
func (s *scenario) endpointsChangedAt(svcName string, n int, changed time.Time) {
	ctx := context.Background()
	svc, err := s.client.CoreV1().Services(s.ns).Get(ctx, svcName, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, fam := range []discovery.AddressType{discovery.AddressTypeIPv4, discovery.AddressTypeIPv6} {
		es := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: svcName + "-" + strings.ToLower(string(fam)), Namespace: s.ns,
				Labels:      map[string]string{discovery.LabelServiceName: svcName},
				Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: changed.Format(time.RFC3339Nano)}},
			AddressType: fam,
		}
		for _, sp := range svc.Spec.Ports {
			name, proto, port := sp.Name, sp.Protocol, int32(8080)
			es.Ports = append(es.Ports, discovery.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
		}
		for j := range n {
			addr, here := fmt.Sprintf("10.244.1.%d", 20+j), s.node.Name
			if fam == discovery.AddressTypeIPv6 {
				addr = fmt.Sprintf("fd00:244:1::%x", 0x20+j)
			}
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}, NodeName: &here})
		}
		slices := s.client.DiscoveryV1().EndpointSlices(s.ns)
		if _, err := slices.Update(ctx, es, metav1.UpdateOptions{}); err != nil {
			if _, err := slices.Create(ctx, es, metav1.CreateOptions{}); err != nil {
				s.t.Fatalf("write EndpointSlice %s: %v", es.Name, err)
			}
		}
	}
}
