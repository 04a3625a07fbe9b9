package scenarios

import (
	"context"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/e2e/testbed/ocispec"
)

// TestImage builds the container image with `make image`, checks what is in it and
// that skopeo and containerd accept the archive, then runs it the way a cluster runs
// deploy/daemonset.yaml: its layers unpacked into a root file system, an OCI runtime
// spec derived from the DaemonSet's container, runc in the node's network namespace.
// The containerized nftproxy must program the node so that a ClusterIP answers, and
// serve /healthz.
func TestImage(t *testing.T) {
	testbed.RequirePrivileges(t)
	requireCommands(t, "make", "runc", "skopeo", "containerd", "ctr")
	bed := testbed.Start(t, testbed.Options{})
	// In the bed's directory: removed after the bed's containers, by Sweep too.
	work := filepath.Join(bed.Dir, "image")
	img := buildImage(t, work)
	rootfs := filepath.Join(work, "rootfs")
	un := unpackImage(t, img, rootfs, runtime.GOARCH)
	ds := readDaemonSet(t)
	archs := affinityArchs(t, ds)
	command := ds.Spec.Template.Spec.Containers[0].Command
	if len(command) == 0 {
		t.Fatalf("deploy/daemonset.yaml: the container has no command")
	}

	t.Run("the image holds the static binary and nothing else", func(t *testing.T) {
		checkRootfs(t, rootfs, command[0])
		checkStamp(t, filepath.Join(rootfs, command[0]), img)
		checkLabels(t, un.Config.Config.Labels, img)
		if un.Config.Architecture != runtime.GOARCH || un.Config.OS != "linux" || !un.Config.Created.Equal(img.created) {
			t.Errorf("image config: %s/%s created %v, want linux/%s created %v", un.Config.OS, un.Config.Architecture, un.Config.Created, runtime.GOARCH, img.created)
		}
	})
	t.Run("an image for each architecture the DaemonSet schedules on", func(t *testing.T) {
		for _, arch := range archs {
			dir := filepath.Join(work, "rootfs-"+arch)
			u := unpackImage(t, img, dir, arch)
			checkRootfs(t, dir, command[0])
			checkStamp(t, filepath.Join(dir, command[0]), img)
			f, err := elf.Open(filepath.Join(dir, command[0]))
			if err != nil {
				t.Fatal(err)
			}
			if f.Close(); u.Config.Architecture != arch || f.Machine != elfMachine[arch] || u.Index != un.Index {
				t.Errorf("linux/%s: config %s, binary %v, index %s (want %s)", arch, u.Config.Architecture, f.Machine, u.Index, un.Index)
			}
		}
		raw, err := exec.Command("skopeo", "inspect", "--raw", "oci-archive:"+img.archive+":latest").Output()
		if err != nil {
			t.Fatalf("skopeo inspect --raw: %v", exitStderr(err))
		}
		var index struct {
			Manifests []struct {
				Platform struct{ OS, Architecture string }
			}
		}
		if err := json.Unmarshal(raw, &index); err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range index.Manifests {
			got = append(got, m.Platform.Architecture)
		}
		if slices.Sort(got); !slices.Equal(got, archs) {
			t.Errorf("the index has images for %q; the DaemonSet schedules on %q", got, archs)
		}
	})
	t.Run("skopeo reads the archive as oci-archive and docker-archive", func(t *testing.T) {
		checkSkopeo(t, img, un.Index, archs, work)
	})

	t.Run("ctr images import", func(t *testing.T) {
		checkCtrImport(t, bed, img, un.Index)
	})
	t.Run("the DaemonSet's container run by runc proxies a ClusterIP", func(t *testing.T) {
		runImageProxy(t, bed, ds, un, work)
	})
}

// runImageProxy runs the DaemonSet's pod on a new node as kubelet would (init
// containers to completion, then the container) and drives traffic through it.
func runImageProxy(t *testing.T, bed *testbed.Bed, ds *appsv1.DaemonSet, un *unpacked, work string) {
	n := bed.AddNode("n1")
	pod := podInput(t, bed, n, ds, un, work)
	for _, init := range ds.Spec.Template.Spec.InitContainers {
		runInitContainer(t, n, init.Name, containerSpec(t, pod, init.Name))
	}
	main := ds.Spec.Template.Spec.Containers[0].Name
	spec := containerSpec(t, pod, main)
	ctr := n.RunContainer(main, spec)
	c := &cluster{t: t, bed: bed, client: bed.Client(), nodes: []*testbed.Node{n}, probe: testbed.ProbePath(t),
		proxy: map[string]*testbed.Process{n.Name: ctr.Process}, args: map[string][]string{n.Name: spec.Process.Args}, ns: "e2e"}
	waitSynced(t, n, ctr)
	checkContainerized(t, ctr, n, un.rootfs, spec.Process.Args)

	if _, err := c.client.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a, b := c.backend(0, "a"), c.backend(0, "b")
	client := n.AddPod("client")
	ips := c.service("web", 80, false, v1.ProtocolTCP)
	c.endpoints("web", backendPort, a, b)
	lines := c.eventually(client.Netns, "tcp", vip(ips, 80), 30, "answers from a and b", onlyFrom("a", "b"))
	t.Logf("through %v: %s", vip(ips, 80), summarize(lines))
	c.eventually(client.Netns, "tcp", vip(ips, 81), 2, "refused (no such port)", all("refused"))
}

// runInitContainer runs an init container and waits for it to exit 0, as kubelet
// does before it starts the pod's containers.
func runInitContainer(t *testing.T, n *testbed.Node, name string, spec *specs.Spec) {
	t.Helper()
	ctr := n.RunContainer(name, spec)
	select {
	case <-ctr.Done():
	case <-time.After(60 * time.Second):
		t.Fatalf("init container %s still running after 60s:\n%s", name, ctr.Log())
	}
	if err := ctr.Err(); err != nil {
		t.Fatalf("init container %s %q: %v\n%s", name, spec.Process.Args, err, ctr.Log())
	}
	t.Logf("init container %s %q exited 0", name, spec.Process.Args)
}

// waitSynced waits until the containerized nftproxy's /healthz on the node's address
// reports a completed sync and that it found its Node object (its
// --hostname-override=$(NODE_NAME) named the node), failing early if the container
// exits.
func waitSynced(t *testing.T, n *testbed.Node, ctr *testbed.Container) {
	t.Helper()
	url := "http://" + n.IPv4.String() + ":10256/healthz"
	var body string
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		select {
		case <-ctr.Done():
			t.Fatalf("the container exited (%v):\n%s", ctr.Err(), ctr.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		body, err = n.HTTPGet(ctx, url)
		cancel()
		// The top-level lastUpdated is the current time whenever healthy (as
		// upstream's): a family's tells when it was last synced.
		var st struct {
			NodeEligible bool `json:"nodeEligible"`
			Status       map[string]struct {
				LastUpdated time.Time `json:"lastUpdated"`
			} `json:"status"`
		}
		if err == nil && json.Unmarshal([]byte(body), &st) == nil && st.NodeEligible && st.Status["IPv4"].LastUpdated.Year() > 2000 {
			t.Logf("%s: %s", url, strings.TrimSpace(body))
			return
		}
	}
	t.Fatalf("%s never reported a sync: %v %s\ncontainer log:\n%s", url, err, body, ctr.Log())
}

// checkContainerized proves that the proxy is the image's binary, in the container,
// in the node's network namespace, with the derived command line.
func checkContainerized(t *testing.T, ctr *testbed.Container, n *testbed.Node, rootfs string, args []string) {
	t.Helper()
	status, pid, err := ctr.State()
	if err != nil || status != "running" {
		t.Fatalf("container %s: %q, %v", ctr.ID, status, err)
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	same := func(a, b string) bool {
		ia, errA := os.Stat(a)
		ib, errB := os.Stat(b)
		return errA == nil && errB == nil && os.SameFile(ia, ib)
	}
	if !same(filepath.Join(proc, "exe"), filepath.Join(rootfs, args[0])) {
		t.Errorf("pid %d does not run %s of the unpacked image", pid, args[0])
	}
	if !same(filepath.Join(proc, "ns", "net"), filepath.Join("/run/netns", n.NS)) {
		t.Errorf("pid %d is not in the network namespace of node %s", pid, n.Name)
	}
	if same(filepath.Join(proc, "ns", "mnt"), "/proc/self/ns/mnt") {
		t.Errorf("pid %d shares the test's mount namespace", pid)
	}
	cmdline, err := os.ReadFile(filepath.Join(proc, "cmdline"))
	if got := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00"); err != nil || !slices.Equal(got, args) {
		t.Errorf("pid %d runs %q (%v), want %q", pid, got, err, args)
	}
}

// podInput prepares what kubelet would for the DaemonSet's pod on node n (its
// volumes and service account token, /etc/hosts) and the facts it knows: everything
// ocispec needs but the container's name.
func podInput(t *testing.T, bed *testbed.Bed, n *testbed.Node, ds *appsv1.DaemonSet, un *unpacked, work string) ocispec.Input {
	t.Helper()
	pod := ds.Spec.Template
	dir := filepath.Join(work, "kubelet")
	hosts := filepath.Join(dir, "etc-hosts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n::1 localhost\n"+n.IPv4.String()+" "+n.Name+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	caps, err := ocispec.CurrentCapabilities()
	if err != nil {
		t.Fatal(err)
	}
	return ocispec.Input{
		Pod: metav1.ObjectMeta{Name: ds.Name + "-" + n.Name, Namespace: ds.Namespace, Labels: pod.Labels,
			UID: "00000000-0000-0000-0000-000000000001"},
		Spec:           pod.Spec,
		Image:          un.image(),
		Rootfs:         un.rootfs,
		Node:           nodeFacts(t, n),
		Volumes:        podVolumes(t, bed, pod.Spec, dir),
		ServiceAccount: serviceAccountVolume(t, bed, ds.Namespace, pod.Spec.ServiceAccountName, dir),
		EtcHosts:       hosts,
		// runc runs with the test's capabilities, as containerd would with its own.
		RuntimeCapabilities: caps,
	}
}

// containerSpec derives the runtime spec of the pod's container (or init
// container) name; no argument may still refer to a variable.
func containerSpec(t *testing.T, pod ocispec.Input, name string) *specs.Spec {
	t.Helper()
	pod.Container = name
	spec, err := ocispec.Derive(pod)
	if err != nil {
		t.Fatalf("derive the runtime spec of %s from deploy/daemonset.yaml: %v", name, err)
	}
	t.Logf("%s: runtime spec derived from deploy/daemonset.yaml: args %q, capabilities %v", name, spec.Process.Args, spec.Process.Capabilities.Effective)
	for _, arg := range spec.Process.Args {
		if strings.Contains(arg, "$(") {
			t.Errorf("%s: argument %q still refers to a variable", name, arg)
		}
	}
	limitCapabilities(t, spec, pod.RuntimeCapabilities)
	return spec
}

// limitCapabilities drops from the spec the capabilities the test itself lacks
// (root in a container may run without some): runc could not grant them and would
// refuse to start. Each one dropped is logged.
func limitCapabilities(t *testing.T, spec *specs.Spec, held []string) {
	t.Helper()
	c := spec.Process.Capabilities
	lacking := map[string]bool{}
	for _, set := range []*[]string{&c.Bounding, &c.Effective, &c.Permitted, &c.Inheritable, &c.Ambient} {
		*set = slices.DeleteFunc(*set, func(name string) bool {
			lacking[name] = !slices.Contains(held, name)
			return lacking[name]
		})
	}
	for name, lacks := range lacking {
		if lacks {
			t.Logf("the container asks for %s, which this test process lacks: runc runs it without", name)
		}
	}
}
