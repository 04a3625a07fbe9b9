package scenarios

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/chart"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// Helpers of TestDeploy: a bed set up like a kubeadm cluster (kubeadm's own
// kube-proxy objects, an API server that allows privileged pods), kubectl
// and kubeadm built from the newest Kubernetes release (e2e/tools/versions),
// and the deploy/ kustomizations.

// Names of the objects deploy/ and kubeadm create in kube-system.
const (
	kubeSystem     = "kube-system"
	proxyConfigMap = "kube-proxy" // kubeadm's; deploy/ reads it
	dropInName     = "nftproxy"   // DaemonSet, ServiceAccount, ClusterRole
)

// dropIn is the bed of TestDeploy.
type dropIn struct {
	t        *testing.T
	bed      *testbed.Bed
	client   kubernetes.Interface
	kubectl  string // binaries
	kubeadm  string
	nftproxy string
	probe    string
	deploy   string // the repository's deploy/ directory
	dir      string // the test's files
	backend  *testbed.Pod
	nodes    int
}

// newDropIn starts a bed whose API server allows privileged containers,
// as kubeadm's does (kube-proxy's DaemonSet, and our init container, are
// privileged), with a node "be" holding the backend pod the Services of
// the test point at; no proxy runs there.
func newDropIn(t *testing.T) *dropIn {
	testbed.RequirePrivileges(t)
	bin := testbed.EnsureBinaries(t)
	deploy, err := filepath.Abs(filepath.Join("..", "..", "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	d := &dropIn{t: t,
		kubectl: filepath.Join(bin, "kubectl"), kubeadm: filepath.Join(bin, "kubeadm"),
		nftproxy: testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy"),
		probe:    testbed.ProbePath(t), deploy: deploy, dir: t.TempDir(),
	}
	for _, p := range []string{d.kubectl, d.kubeadm} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v (e2e/tools/build.sh builds it)", err)
		}
	}
	d.bed = testbed.Start(t, testbed.Options{APIServerFlags: []string{"--allow-privileged=true"}})
	d.client = d.bed.Client()
	d.backend = d.bed.AddNode("be").AddPod("backend")
	d.backend.Start(d.probe, "serve", "--name", "backend", "--port", fmt.Sprint(backendPort), "--tcp")
	d.publishRootCA()
	d.answerUnallocated()
	return d
}

// answerUnallocated makes the control namespace, where nodes route what
// they do not proxy, own unallocatedServiceIP: a connection there is then
// refused unless nftproxy drops it. Without it the control namespace
// answers with ICMP errors, which the kernel rate-limits into timeouts
// that look like the drop.
func (d *dropIn) answerUnallocated() {
	ctx, cancel := d.ctx()
	defer cancel()
	if out, err := d.bed.Ctl.Exec(ctx, "ip", "addr", "add", unallocatedServiceIP.Addr().String()+"/32", "dev", "lo"); err != nil {
		d.t.Fatalf("%v: %s", err, out)
	}
}

// ctx is a context for one API call or command.
func (d *dropIn) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Minute)
}

// run runs kubectl or kubeadm as the bed's admin, from the control namespace.
func (d *dropIn) run(tool string, args ...string) (string, error) {
	ctx, cancel := d.ctx()
	defer cancel()
	return d.bed.AdminExec(ctx, tool, args...)
}

// mustKubectl runs kubectl and fails the test on error.
func (d *dropIn) mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := d.run(d.kubectl, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// kubeadmProxyAddon runs kubeadm's kube-proxy addon phase against the bed.
func (d *dropIn) kubeadmProxyAddon() { d.bed.KubeadmProxyAddon(d.t, d.kubeadm, d.dir, "") }

// publishRootCA writes ConfigMap kube-root-ca.crt in kube-system, as
// kube-controller-manager's root-ca-cert-publisher does in every
// namespace: the service account volume of a pod projects its ca.crt.
func (d *dropIn) publishRootCA() {
	ctx, cancel := d.ctx()
	defer cancel()
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-root-ca.crt", Namespace: kubeSystem},
		Data: map[string]string{"ca.crt": string(d.bed.RESTConfig().CAData)}}
	if _, err := d.client.CoreV1().ConfigMaps(kubeSystem).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		d.t.Fatal(err)
	}
}

// configMap returns kube-system/kube-proxy as the API server has it.
func (d *dropIn) configMap(t *testing.T) *v1.ConfigMap {
	t.Helper()
	ctx, cancel := d.ctx()
	defer cancel()
	cm, err := d.client.CoreV1().ConfigMaps(kubeSystem).Get(ctx, proxyConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cm
}

// kustomizations lists what `kubectl apply -k` may be given under deploy/:
// each Kustomization directory, and for each Component one overlay (in a
// temporary directory) of deploy/ with that component, the way a user
// enables it. deploy/monitoring is left out: it needs the
// prometheus-operator CRDs, and its own test installs them.
func (d *dropIn) kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(d.deploy, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && path == filepath.Join(d.deploy, "monitoring") {
			t.Logf("not dry-run here: %s (needs the prometheus-operator CRDs; its own test covers it)", path)
			return filepath.SkipDir
		}
		if e.IsDir() || e.Name() != "kustomization.yaml" {
			return nil
		}
		dir := filepath.Dir(path)
		kind, err := kustomizationKind(path)
		if err != nil {
			return err
		}
		switch kind {
		case "Kustomization", "":
			dirs = append(dirs, dir)
		case "Component":
			dirs = append(dirs, d.overlayWith(t, dir))
		default:
			return fmt.Errorf("%s: unknown kind %q", path, kind)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

func kustomizationKind(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var k struct{ Kind string }
	if err := yaml.Unmarshal(b, &k); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return k.Kind, nil
}

// overlayWith writes an overlay of deploy/ that adds the Component in
// component and returns its directory.
func (d *dropIn) overlayWith(t *testing.T, component string) string {
	t.Helper()
	dir, err := os.MkdirTemp(d.dir, "overlay-")
	if err != nil {
		t.Fatal(err)
	}
	if err := chart.Overlay(dir, d.deploy, component); err != nil {
		t.Fatal(err)
	}
	return dir
}

// service creates Service "web" (NodePort, TCP 80) in namespace e2e with
// the backend pod as its endpoint, and returns its ClusterIP and nodePort.
func (d *dropIn) service() (*v1.Service, error) {
	ctx, cancel := d.ctx()
	defer cancel()
	if _, err := d.client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "e2e"}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	svc, err := d.client.CoreV1().Services("e2e").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "e2e"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeNodePort,
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	name, proto, port, node := "http", v1.ProtocolTCP, int32(backendPort), d.backend.Node.Name
	_, err = d.client.DiscoveryV1().EndpointSlices("e2e").Create(ctx, &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "e2e", Labels: map[string]string{discovery.LabelServiceName: "web"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Protocol: &proto, Port: &port}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{d.backend.IPv4.String()}, NodeName: &node}},
	}, metav1.CreateOptions{})
	return svc, err
}
