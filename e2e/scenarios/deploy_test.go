package scenarios

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// TestDeploy proves deploy/ on a bed set up like a kubeadm cluster: kubeadm
// writes its kube-proxy objects, every kustomization under deploy/ passes
// the API server's dry-run, `kubectl apply -k deploy/` leaves kubeadm's
// ConfigMap alone, and nftproxy run exactly as the DaemonSet's pod (kubeadm's
// files, a token of its own ServiceAccount, its capabilities) serves a
// ClusterIP, a NodePort and the ServiceCIDR drop. Then each rule of the
// ClusterRole is taken away in turn, and nftproxy must fail.
func TestDeploy(t *testing.T) {
	d := newDropIn(t)
	d.kubeadmProxyAddon()
	kubeadmCM := d.configMap(t)

	t.Run("kubeadm's kubeconfig.conf names the control plane", func(t *testing.T) {
		kc, err := clientcmd.Load([]byte(kubeadmCM.Data["kubeconfig.conf"]))
		if err != nil {
			t.Fatal(err)
		}
		if got := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server; got != testbed.APIServerURL {
			t.Fatalf("server %q, want the bed's control-plane endpoint %s", got, testbed.APIServerURL)
		}
	})

	t.Run("every kustomization passes the API server's dry-run", func(t *testing.T) {
		for _, dir := range d.kustomizations(t) {
			out := d.mustKubectl(t, "apply", "--dry-run=server", "-k", dir)
			t.Logf("%s:\n%s", dir, strings.TrimSpace(out))
		}
	})

	t.Run("installing.md's patch keeps kube-proxy on the architectures the image lacks", func(t *testing.T) {
		d.checkArchPatch(t)
	})

	d.mustKubectl(t, "apply", "-k", d.deploy)

	t.Run("kubeadm's ConfigMap is left as kubeadm wrote it", func(t *testing.T) {
		cm := d.configMap(t)
		if cm.ResourceVersion != kubeadmCM.ResourceVersion || !maps.Equal(cm.Data, kubeadmCM.Data) {
			t.Fatalf("kubectl apply -k deploy/ changed kube-system/kube-proxy:\nbefore %v\nafter  %v", kubeadmCM.Data, cm.Data)
		}
	})

	t.Run("the selector leaves kube-proxy's pods alone", func(t *testing.T) {
		d.checkSelector(t)
	})

	svc, err := d.service()
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.ClusterIP == unallocatedServiceIP.Addr().String() {
		t.Fatalf("%s was allocated to Service web; pick another unallocated address", svc.Spec.ClusterIP)
	}

	t.Run("nftproxy runs as the DaemonSet's pod", func(t *testing.T) {
		n, client := d.node()
		k := d.startPod(t, n)
		defer k.stop()
		d.checkKubeadmFiles(t, k, kubeadmCM)
		if err := d.serves(k, client, svc, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		d.checkKubeadmMode(t, k, kubeadmCM)
		d.checkEndpoints(t, k)
	})

	t.Run("every rule of the ClusterRole is needed", func(t *testing.T) {
		d.checkEachRule(t, svc)
	})

	// Last: it replaces kubeadm's ConfigMap.
	t.Run("without kubeadm, the component's ConfigMap", func(t *testing.T) {
		d.applyWithoutKubeadm(t)
		n, client := d.node()
		k := d.startPod(t, n)
		defer k.stop()
		if err := d.serves(k, client, svc, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

// unallocatedServiceIP is in the bed's service CIDR and never allocated:
// nftproxy drops what is sent there (answerUnallocated makes any other
// outcome a refusal).
var unallocatedServiceIP = netip.MustParseAddrPort("10.111.222.233:80")

// node adds a node for one run of nftproxy (each run starts from an empty
// ruleset) and a client pod on it.
func (d *dropIn) node() (*testbed.Node, *testbed.Pod) {
	d.nodes++
	n := d.bed.AddNode(fmt.Sprintf("p%d", d.nodes))
	return n, n.AddPod("client")
}

// serves checks, within wait each, that nftproxy on k's node becomes ready
// by the DaemonSet's readiness probe and then does, for a client pod on its
// node, what needs each of its permissions: a ClusterIP (Services,
// EndpointSlices), a NodePort on the node's address (its Node) and the drop
// of an unallocated service address (ServiceCIDRs). It returns the first
// failure.
func (d *dropIn) serves(k *kubeletPod, client *testbed.Pod, svc *v1.Service, wait time.Duration) error {
	if err := k.probe(k.pod.Spec.Containers[0].ReadinessProbe, wait); err != nil {
		return fmt.Errorf("not ready: %w", err)
	}
	checks := []struct {
		what  string
		addr  netip.AddrPort
		count int
		want  string
		ok    func([]string) bool
	}{
		{"ClusterIP", netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80), 3, "answers from the backend", onlyFrom("backend")},
		{"NodePort on the node's address", netip.AddrPortFrom(k.node.IPv4, uint16(svc.Spec.Ports[0].NodePort)), 3, "answers from the backend", onlyFrom("backend")},
		{"unallocated service address", unallocatedServiceIP, 1, "dropped (timeout)", all("timeout")},
	}
	for _, c := range checks {
		if lines, ok := d.await(client, c.addr, c.count, wait, c.ok); !ok {
			return fmt.Errorf("%s %s from a pod on %s: want %s, last got %s", c.what, c.addr, k.node.Name, c.want, summarize(lines))
		}
	}
	return nil
}

// await dials addr over TCP from a pod until ok accepts the answers or wait
// passes.
func (d *dropIn) await(from *testbed.Pod, addr netip.AddrPort, count int, wait time.Duration, ok func([]string) bool) ([]string, bool) {
	var lines []string
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := from.Exec(ctx, d.probe, "dial", "--proto", "tcp", "--addr", addr.String(), "--timeout", "1s", "--count", fmt.Sprint(count))
		cancel()
		if err != nil {
			return []string{err.Error()}, false
		}
		if lines = strings.Split(strings.TrimSpace(out), "\n"); ok(lines) {
			return lines, true
		}
	}
	return lines, false
}

// checkKubeadmMode: the bed's kubeadm configuration leaves kube-proxy's
// mode unset, for which kubeadm v1.37 writes "mode: iptables"; nftproxy,
// which serves (checked before), must say that it programs nftables.
func (d *dropIn) checkKubeadmMode(t *testing.T, k *kubeletPod, kubeadmCM *v1.ConfigMap) {
	var kpc struct{ Mode string }
	if err := yaml.Unmarshal([]byte(kubeadmCM.Data["config.conf"]), &kpc); err != nil {
		t.Fatal(err)
	}
	t.Logf("kubeadm wrote mode %q for an unset mode", kpc.Mode)
	if kpc.Mode == "iptables" && !strings.Contains(k.main.Log(), "The config file says mode") {
		t.Errorf("kubeadm's mode %q is not logged as read as nftables:\n%s", kpc.Mode, k.main.Log())
	}
}

// checkKubeadmFiles checks that the pod reads kubeadm's config.conf and
// kubeconfig.conf byte for byte, and that the CA and token kubeconfig.conf
// names are where the pod's service account volume puts them.
func (d *dropIn) checkKubeadmFiles(t *testing.T, k *kubeletPod, kubeadmCM *v1.ConfigMap) {
	c := k.pod.Spec.Containers[0]
	var configPath string
	for _, a := range slices.Concat(c.Command, c.Args) {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			configPath = p
		}
	}
	config := k.mustVolumeFile(c, configPath, []byte(kubeadmCM.Data["config.conf"]))
	var kpc struct {
		ClientConnection struct{ Kubeconfig string }
	}
	if err := yaml.Unmarshal(config, &kpc); err != nil {
		t.Fatal(err)
	}
	kcBytes := k.mustVolumeFile(c, kpc.ClientConnection.Kubeconfig, []byte(kubeadmCM.Data["kubeconfig.conf"]))
	kc, err := clientcmd.Load(kcBytes)
	if err != nil {
		t.Fatal(err)
	}
	ctx := kc.Contexts[kc.CurrentContext]
	k.mustVolumeFile(c, kc.Clusters[ctx.Cluster].CertificateAuthority, d.bed.RESTConfig().CAData)
	if tok := k.mustVolumeFile(c, kc.AuthInfos[ctx.AuthInfo].TokenFile, nil); len(tok) == 0 {
		t.Fatal("empty token")
	}
}

// mustVolumeFile returns the file at path in the container, which must
// hold want unless want is nil.
func (k *kubeletPod) mustVolumeFile(c v1.Container, path string, want []byte) []byte {
	k.t.Helper()
	got, err := k.volumeFile(c, path)
	if err != nil {
		k.t.Fatal(err)
	}
	if want != nil && string(got) != string(want) {
		k.t.Fatalf("%s in the container:\n%s\nwant:\n%s", path, got, want)
	}
	return got
}

// checkEndpoints checks the liveness probe and that metrics answer on the
// node's address, from the control namespace, where Prometheus would be.
func (d *dropIn) checkEndpoints(t *testing.T, k *kubeletPod) {
	c := k.pod.Spec.Containers[0]
	if err := k.probe(c.LivenessProbe, 10*time.Second); err != nil {
		t.Errorf("liveness: %v", err)
	}
	base := fmt.Sprintf("http://%s:%d", k.node.IPv4, k.port(c, intstr.FromString("metrics")))
	for path, want := range map[string]string{"/metrics": "kubeproxy_sync_proxy_rules_duration_seconds_count", "/proxyMode": "nftables"} {
		code, body, err := extHTTPGet(d.bed.Ctl, base+path)
		if err != nil || code != 200 || !strings.Contains(body, want) {
			t.Errorf("GET %s%s from the control namespace: %d %.200q %v; want 200 with %q", base, path, code, body, err, want)
		}
	}
}

// checkSelector checks that our DaemonSet's selector matches none of
// kube-proxy's pods and that our pods carry kube-proxy's label.
func (d *dropIn) checkSelector(t *testing.T) {
	ctx, cancel := d.ctx()
	defer cancel()
	ours, err := d.client.AppsV1().DaemonSets(kubeSystem).Get(ctx, dropInName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeProxy, err := d.client.AppsV1().DaemonSets(kubeSystem).Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sel, err := metav1.LabelSelectorAsSelector(ours.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if sel.Matches(labels.Set(kubeProxy.Spec.Template.Labels)) {
		t.Errorf("selector %s matches kube-proxy's pods (%v)", sel, kubeProxy.Spec.Template.Labels)
	}
	for k, v := range map[string]string{"k8s-app": "kube-proxy", "app.kubernetes.io/name": "nftproxy"} {
		if ours.Spec.Template.Labels[k] != v {
			t.Errorf("pods lack label %s=%s: %v", k, v, ours.Spec.Template.Labels)
		}
	}
}

// checkEachRule runs nftproxy once per rule of the ClusterRole, with that
// rule removed: it must fail to serve, and its log must show the API
// server's refusal of that rule's resources.
func (d *dropIn) checkEachRule(t *testing.T, svc *v1.Service) {
	ctx, cancel := d.ctx()
	role, err := d.client.RbacV1().ClusterRoles().Get(ctx, dropInName, metav1.GetOptions{})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for i, rule := range role.Rules {
		t.Run("without "+ruleName(rule), func(t *testing.T) {
			d.setRules(t, role, slices.Delete(slices.Clone(role.Rules), i, i+1))
			n, client := d.node()
			k := d.startPod(t, n)
			defer k.stop()
			err := d.serves(k, client, svc, 10*time.Second)
			if err == nil {
				out, _ := n.Exec(context.Background(), "nft", "list", "ruleset")
				t.Fatalf("nftproxy served everything without %s: the rule is not needed, or this test misses what needs it; the node's ruleset:\n%s", ruleName(rule), out)
			}
			t.Logf("fails, as it must: %v", err)
			for _, want := range refusals(rule) {
				if !want.MatchString(k.main.Log()) {
					t.Errorf("nftproxy's log does not match %q", want)
				}
			}
		})
	}
}

// setRules replaces the ClusterRole's rules until the test ends.
func (d *dropIn) setRules(t *testing.T, role *rbacv1.ClusterRole, rules []rbacv1.PolicyRule) {
	update := func(rules []rbacv1.PolicyRule) error {
		ctx, cancel := d.ctx()
		defer cancel()
		cur, err := d.client.RbacV1().ClusterRoles().Get(ctx, role.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Rules = rules
		_, err = d.client.RbacV1().ClusterRoles().Update(ctx, cur, metav1.UpdateOptions{})
		return err
	}
	if err := update(rules); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := update(role.Rules); err != nil {
			t.Errorf("restore ClusterRole %s: %v", role.Name, err)
		}
	})
}

func ruleName(r rbacv1.PolicyRule) string {
	return strings.Join(r.Resources, ",") + " (" + strings.Join(r.Verbs, ",") + ")"
}

// refusals matches the API server's refusal of each resource of r as
// client-go logs it: `endpointslices.discovery.k8s.io is forbidden`, or
// with the name a field selector asked for, `nodes \"p4\" is forbidden`.
func refusals(r rbacv1.PolicyRule) []*regexp.Regexp {
	var out []*regexp.Regexp
	for _, g := range r.APIGroups {
		for _, res := range r.Resources {
			if g != "" {
				res += "." + g
			}
			out = append(out, regexp.MustCompile(regexp.QuoteMeta(res)+`( \\?"[^"\\]*\\?")? is forbidden`))
		}
	}
	return out
}

// editMarker is the placeholder of the control-plane endpoint in the
// component's kubeconfig.conf.
const editMarker = "https://EDIT-control-plane-endpoint:6443"

// applyWithoutKubeadm applies deploy/ with the without-kubeadm component,
// its files edited as a user would (the bed's control-plane endpoint), and
// checks that the ConfigMap holds them.
func (d *dropIn) applyWithoutKubeadm(t *testing.T) {
	src := filepath.Join(d.deploy, "components", "without-kubeadm")
	comp := filepath.Join(d.dir, "without-kubeadm")
	if err := os.CopyFS(comp, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, name := range []string{"config.conf", "kubeconfig.conf"} {
		b, err := os.ReadFile(filepath.Join(comp, name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "# EDIT") {
			t.Errorf("%s marks no line to edit", name)
		}
		files[name] = string(b)
	}
	if !strings.Contains(files["kubeconfig.conf"], editMarker) {
		t.Fatalf("kubeconfig.conf has no %s to replace", editMarker)
	}
	files["kubeconfig.conf"] = strings.ReplaceAll(files["kubeconfig.conf"], editMarker, testbed.APIServerURL)
	if err := os.WriteFile(filepath.Join(comp, "kubeconfig.conf"), []byte(files["kubeconfig.conf"]), 0o644); err != nil {
		t.Fatal(err)
	}
	d.mustKubectl(t, "apply", "-k", d.overlayWith(t, comp))
	if cm := d.configMap(t); !maps.Equal(cm.Data, files) {
		t.Fatalf("ConfigMap kube-proxy holds %v, want the component's files %v", cm.Data, files)
	}
}

// checkArchPatch runs docs/installing.md's `kubectl patch` of kubeadm's
// kube-proxy DaemonSet (server-side dry-run) and checks that it keeps
// kube-proxy exactly on the nodes deploy/daemonset.yaml's affinity leaves
// out: kubernetes.io/arch NotIn the architectures ours runs on.
func (d *dropIn) checkArchPatch(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(kubebin.RepoRoot(), "docs", "installing.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("`kubectl -n\\s+kube-system patch daemonset kube-proxy --type merge -p '([^']+)'`").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/installing.md has no `kubectl -n kube-system patch daemonset kube-proxy --type merge -p '…'`")
	}
	out := d.mustKubectl(t, "-n", "kube-system", "patch", "daemonset", "kube-proxy", "--type", "merge", "-p", string(m[1]),
		"--dry-run=server", "-o", "yaml")
	var patched appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(out), &patched); err != nil {
		t.Fatal(err)
	}
	ours := affinityArchs(t, readDaemonSet(t))
	a := patched.Spec.Template.Spec.Affinity
	var got []string
	if a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				if e.Key == "kubernetes.io/arch" && e.Operator == "NotIn" {
					got = append(got, e.Values...)
				}
			}
		}
	}
	if slices.Sort(got); !slices.Equal(got, ours) {
		t.Errorf("the patched kube-proxy DaemonSet avoids %q; nftproxy's runs on %q", got, ours)
	}
}
