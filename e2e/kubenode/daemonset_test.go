package kubenode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/kubenode"
	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// enableEnv turns TestDaemonSetOnKubelet on: it builds kubelet,
// kube-controller-manager and kube-scheduler and runs containerd, which
// `make test` does not need.
const enableEnv = "NFTPROXY_KUBELET_E2E"

// imageEnv names the nftproxy image archive; by default the one `make image`
// writes.
const imageEnv = "NFTPROXY_IMAGE_TAR"

// podTimeout bounds the wait for the DaemonSet's pod: created by the
// controller, bound by the scheduler, its containers started and ready.
const podTimeout = 3 * time.Minute

// TestDaemonSetOnKubelet runs deploy/ on a real kubelet: kubeadm's kube-proxy
// ConfigMap made for the bed, `kubectl apply -k deploy/`, the DaemonSet
// controller creating the pod, the scheduler binding it to node1, whose
// kubelet starts it with containerd from the imported image. It then checks
// the pod's /healthz from a pod namespace on node1 and connects from there
// through a Service whose endpoint is another pod namespace on node1.
func TestDaemonSetOnKubelet(t *testing.T) {
	if os.Getenv(enableEnv) != "1" {
		t.Skipf("set %s=1 (make kubelet-e2e) to run deploy/ on a real kubelet and containerd", enableEnv)
	}
	testbed.RequirePrivileges(t)
	r := newReport(t)
	r.step("find the nftproxy image and build the binaries")
	image := imageArchive(t)
	bins := kubenode.EnsureBinaries(t)
	r.versions = bins.Versions()
	t.Logf("versions: %s", r.versions)
	pause := kubenode.BuildPauseImage(t, t.TempDir())

	r.step("start etcd and kube-apiserver; node1's namespace and Node object")
	bed := testbed.Start(t, testbed.Options{
		APIServerFlags: []string{"--allow-privileged=true"}, // deploy/'s init container is privileged
	})
	kubenode.CheckMachineUntouched(t, bed.Prefix)
	// Before the controllers: the bed writes the Node's status right after
	// creating it, which fails if a controller changed the Node in between.
	node := bed.AddNode("node1")
	d := &dropIn{t: t, bed: bed, bins: bins, dir: t.TempDir()}

	r.step("kubeadm's kube-proxy objects, then `kubectl apply -k deploy/`")
	d.kubeadmProxyAddon()
	d.kubectl("--namespace", "kube-system", "delete", "daemonset", "kube-proxy")
	d.kubectl("apply", "-k", filepath.Join(kubebin.RepoRoot(), "deploy"))

	r.step("start kube-controller-manager and kube-scheduler")
	kubenode.StartControllers(t, bed, bins)

	r.step("start containerd and the kubelet on node1")
	kn := kubenode.Start(t, bed, node, bins, kubenode.Options{Images: []string{image, pause}})
	t.Logf("node1: containerd and kubelet up; images %v", kn.Images)

	r.step("the DaemonSet's pod running and ready on node1")
	pod := d.waitDaemonPod(node.Name)
	checkImage(t, pod, kn.Images)

	backend, client := node.AddPod("backend"), node.AddPod("client")
	r.step("the pod's /healthz, from a pod namespace on node1")
	checkHealthz(t, client, node)

	r.step("traffic through a Service on node1")
	checkService(t, bed, backend, client)
	r.done()
}

// report logs, when the test fails, which step it reached and the versions
// of what ran: what stopped a kubelet here, besides the error and the
// processes' log tails the bed prints.
type report struct {
	t        *testing.T
	current  string
	versions string
	finished bool
}

func newReport(t *testing.T) *report {
	r := &report{t: t}
	// Registered first, so it runs last: after the bed has printed its logs.
	t.Cleanup(func() {
		if t.Failed() && !r.finished {
			t.Logf("kubelet e2e stopped at step %q\nversions: %s", r.current, r.versions)
		}
	})
	return r
}

func (r *report) step(s string) {
	r.current = s
	r.t.Logf("step: %s", s)
}

func (r *report) done() { r.finished = true }

// imageArchive is the nftproxy image archive to import.
func imageArchive(t *testing.T) string {
	path := os.Getenv(imageEnv)
	if path == "" {
		path = filepath.Join(kubebin.RepoRoot(), "bin", "nftproxy-image.tar")
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("nftproxy image: %v (run `make image`, or set %s)", err, imageEnv)
	}
	return path
}

// checkImage checks that the pod's containers run the imported image:
// containerd reports the image's configuration digest as its ID.
func checkImage(t *testing.T, pod *v1.Pod, images map[string]kubenode.Image) {
	t.Helper()
	for _, cs := range pod.Status.ContainerStatuses {
		img, ok := images[cs.Image]
		if !ok {
			t.Fatalf("container %s runs image %s, not one imported (%v)", cs.Name, cs.Image, images)
		}
		if cs.ImageID != img.Config {
			t.Fatalf("container %s: image ID %s, want the imported %s", cs.Name, cs.ImageID, img.Config)
		}
		t.Logf("container %s: image %s (%s), started %v", cs.Name, cs.Image, cs.ImageID, cs.State.Running.StartedAt)
	}
}

// checkHealthz fetches the pod's /healthz on node's address from pod p.
func checkHealthz(t *testing.T, p *testbed.Pod, node *testbed.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := fmt.Sprintf("http://%s:10256/healthz", node.IPv4)
	body, err := p.HTTPGet(ctx, url)
	if err != nil {
		t.Fatalf("%s from %s: %v: %s", url, p.NS, err, body)
	}
	var st struct {
		Healthy     bool      `json:"healthy"`
		LastUpdated time.Time `json:"lastUpdated"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || !st.Healthy || st.LastUpdated.IsZero() {
		t.Fatalf("%s: want healthy with a last update, got %s (%v)", url, body, err)
	}
	t.Logf("%s: %s", url, strings.TrimSpace(body))
}

// checkService creates Service default/web (port 80) without a selector and
// its EndpointSlice (backend on port 8080), and connects to the ClusterIP from
// client until every attempt of a round is answered by the backend.
func checkService(t *testing.T, bed *testbed.Bed, backend, client *testbed.Pod) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	probe := testbed.ProbePath(t)
	srv := backend.Start(probe, "serve", "--name", "backend", "--port", "8080", "--tcp")
	if err := srv.WaitForLog(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	svc, err := bed.Client().CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name, port, proto, nodeName := "http", int32(8080), v1.ProtocolTCP, backend.Node.Name
	_, err = bed.Client().DiscoveryV1().EndpointSlices("default").Create(ctx, &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		Endpoints:   []discovery.Endpoint{{Addresses: []string{backend.IPv4.String()}, NodeName: &nodeName}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := svc.Spec.ClusterIP + ":80"
	var lines []string
	for {
		out, err := client.Exec(ctx, probe, "dial", "--proto", "tcp", "--addr", vip, "--count", "5")
		if err != nil {
			t.Fatal(err)
		}
		lines = strings.Split(strings.TrimSpace(out), "\n")
		if !slices.ContainsFunc(lines, func(l string) bool { return !strings.HasPrefix(l, "backend ") }) {
			t.Logf("%s from %s: %q", vip, client.NS, lines)
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s from %s: want every attempt answered by backend, last round: %q", vip, client.NS, lines)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
