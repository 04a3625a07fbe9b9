package conformance_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/kubenode"
	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// kubeProxyConfig is added to the KubeProxyConfiguration of kubeadm's
// ConfigMap: nftables mode (kubeadm v1.37 writes iptables for an unset mode;
// nftproxy would read that as nftables, kube-proxy would not), and
// conntrack.maxPerCore 0, which leaves nf_conntrack_max alone: it is global
// to the machine (the TCP timeouts are per network namespace, and both
// proxies set them in the node's).
const kubeProxyConfig = "mode: nftables\nconntrack:\n  maxPerCore: 0\n"

// registryAddr is the local registry, in the control namespace.
const registryAddr = testbed.ControlIPv4 + ":5000"

// readyTimeout bounds each wait of the cluster's start (nodes Ready, the
// proxy's pods, CoreDNS).
const readyTimeout = 5 * time.Minute

// cluster is the bed, its two kubelet nodes and the proxy under test.
type cluster struct {
	t     *testing.T
	bed   *testbed.Bed
	tools tools
	nodes []*kubenode.Node
	// proxy is proxyNftproxy or proxyKubeProxy; daemonSet its DaemonSet
	// in kube-system.
	proxy, daemonSet string
	dir              string
}

// startCluster brings up a cluster as a user's would be: etcd and the API
// server (which reaches kubelets by their InternalIP with a client
// certificate), kube-controller-manager and kube-scheduler; kubeadm's
// kube-proxy and coredns addons; the proxy (nftproxy from deploy/, its image
// pulled from the local registry, or kubeadm's kube-proxy DaemonSet as it
// is); two nodes with containerd, a kubelet, a pod network and the test
// images. It returns once both nodes are Ready and the proxy's pods and
// CoreDNS serve.
func startCluster(t *testing.T, cfg config, tl tools, images map[string]image, proxy string) *cluster {
	t.Helper()
	dir := t.TempDir()
	pki, err := kubenode.NewKubeletClientPKI(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	bed := testbed.Start(t, testbed.Options{APIServerFlags: append([]string{
		"--allow-privileged=true", // deploy/'s init container and kube-proxy are privileged
		// The Node's Hostname address ("node1") would be looked up in the
		// machine's DNS from the control namespace.
		"--kubelet-preferred-address-types=InternalIP",
	}, pki.APIServerFlags()...)})
	kubenode.CheckMachineUntouched(t, bed.Prefix)
	c := &cluster{t: t, bed: bed, tools: tl, proxy: proxy, dir: dir, daemonSet: proxy}
	// Before the controllers: the bed writes each Node's status right after
	// creating it.
	nodes := []*testbed.Node{bed.AddNode("node1"), bed.AddNode("node2")}

	bed.KubeadmAddons(t, tl.Kubeadm, dir, kubeProxyConfig, "kube-proxy", "coredns")
	opts := kubenode.Options{
		CNI:          true,
		ClusterDNS:   testbed.ClusterDNSIP,
		Nameserver:   testbed.ControlIPv4, // nothing answers there: CoreDNS's forward fails fast, and nothing leaves the bed
		ClientCAFile: pki.CAFile,
	}
	for _, kind := range slices.Sorted(maps.Keys(images)) {
		opts.Images = append(opts.Images, images[kind].archive)
	}
	switch proxy {
	case proxyNftproxy:
		// Both archives tag their image latest too: the previous release's
		// must not take that name from this one's.
		if cfg.reg {
			c.startRegistry(filepath.Join(cfg.out, "images", "docker-registry"))
			if cfg.prevImage != "" {
				c.pushNftproxy(cfg.prevImage, false)
			}
			c.pushNftproxy(cfg.image, true)
			opts.Registry = registryAddr
		} else {
			if cfg.prevImage != "" {
				opts.Images = append(opts.Images, cfg.prevImage)
			}
			opts.Images = append(opts.Images, cfg.image)
		}
		c.kubectl("--namespace", "kube-system", "delete", "daemonset", "kube-proxy")
		c.kubectl("apply", "-k", filepath.Join(kubebin.RepoRoot(), "deploy"))
	case proxyKubeProxy:
		c.dropLibModules()
	}
	kubenode.StartControllers(t, bed, tl.Binaries)
	for _, n := range nodes {
		start := time.Now()
		c.nodes = append(c.nodes, kubenode.Start(t, bed, n, tl.Binaries, opts))
		t.Logf("%s: containerd and kubelet up, %d image archives imported, in %v", n.Name, len(opts.Images), time.Since(start).Round(time.Second))
	}
	c.waitNodesReady()
	c.waitDaemonSet()
	c.waitCoreDNS()
	return c
}

// run runs a tool against the cluster as its admin, from the control
// namespace, and returns its output.
func (c *cluster) run(tool string, args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := c.bed.AdminExec(ctx, tool, args...)
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", filepath.Base(tool), strings.Join(args, " "), err, out)
	}
	return out
}

func (c *cluster) kubectl(args ...string) string {
	c.t.Helper()
	return c.run(c.tools.Kubectl, args...)
}

// dropLibModules removes the /lib/modules volume from kubeadm's kube-proxy
// DaemonSet: kubeadm mounts it as a hostPath without a type, the runtime
// fails on a missing source, and this machine has no /lib/modules (its
// modules are built in; the root file system is read-only to the nodes).
// nftables mode does not read it. Nothing else of kubeadm's DaemonSet
// changes.
func (c *cluster) dropLibModules() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dsc := c.bed.Client().AppsV1().DaemonSets("kube-system")
	ds, err := dsc.Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	spec := &ds.Spec.Template.Spec
	var dropped []string
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v v1.Volume) bool {
		if v.HostPath != nil && v.HostPath.Path == "/lib/modules" {
			dropped = append(dropped, v.Name)
			return true
		}
		return false
	})
	if len(dropped) != 1 {
		c.t.Fatalf("kubeadm's kube-proxy DaemonSet: want one /lib/modules volume, found %v", dropped)
	}
	for i := range spec.Containers {
		spec.Containers[i].VolumeMounts = slices.DeleteFunc(spec.Containers[i].VolumeMounts, func(m v1.VolumeMount) bool {
			return m.Name == dropped[0]
		})
	}
	if _, err := dsc.Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// startRegistry runs Debian's docker-registry (its binary, unpacked by
// e2e/cmd/testimages) in the control namespace on registryAddr, storing in
// the bed's directory.
func (c *cluster) startRegistry(binary string) {
	c.t.Helper()
	dir := filepath.Join(c.bed.Dir, "registry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), registryAddr)
	cfgPath := filepath.Join(dir, "config.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		c.t.Fatal(err)
	}
	p := c.bed.Ctl.Start(confined(dir, binary, "serve", cfgPath)...)
	hc := &http.Client{Transport: &http.Transport{DialContext: c.bed.Ctl.DialContext}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Get("http://" + registryAddr + "/v2/")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		select {
		case <-p.Done():
			c.t.Fatalf("docker-registry exited: %v\n%s", p.Err(), p.Log())
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("docker-registry not answering on %s: %v\n%s", registryAddr, err, p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// confined wraps a command line so that it sees the machine's root file
// system read-only but for dir (also its TMPDIR) and an empty /var/tmp, in
// the mount namespace `ip netns exec` gives it: skopeo unpacks archives in
// /var/tmp whatever TMPDIR says, and keeps a blob cache in
// /var/lib/containers when it can create it (it does without when not).
func confined(dir string, args ...string) []string {
	q := "'" + strings.ReplaceAll(dir, "'", `'\''`) + "'"
	script := "mount --bind " + q + " " + q + " && mount -t tmpfs tmp /var/tmp && mount -o remount,bind,ro / && TMPDIR=" + q + ` exec "$@"`
	return append([]string{"sh", "-c", script, "sh"}, args...)
}

// pushNftproxy copies an nftproxy image archive to the local registry under
// each of its tags (but latest, unless withLatest), as library/nftproxy: what
// docker.io/library/nftproxy resolves to through the nodes' hosts.toml. The
// whole image index goes, as docs/image.md tells users to push it; the nodes'
// containerd pulls their platform's image of it.
func (c *cluster) pushNftproxy(archive string, withLatest bool) {
	c.t.Helper()
	_, all, err := archiveNames(archive)
	if err != nil {
		c.t.Fatal(err)
	}
	refs := slices.DeleteFunc(all, func(r string) bool { return r == "latest" && !withLatest })
	for _, ref := range refs {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		out, err := c.bed.Ctl.Exec(ctx, confined(c.dir, "skopeo", "copy", "--all", "--quiet", "--insecure-policy", "--dest-tls-verify=false",
			"oci-archive:"+archive+":"+ref, "docker://"+registryAddr+"/library/nftproxy:"+ref)...)
		cancel()
		if err != nil {
			c.t.Fatalf("push %s:%s to the registry (skopeo: Debian package skopeo): %v\n%s", archive, ref, err, out)
		}
	}
	c.t.Logf("registry: nftproxy:%s from %s", strings.Join(refs, ", nftproxy:"), archive)
}

// poll calls check every second until it returns nil or timeout passes; then
// it fails the test with check's last error and what kube-system looks like.
func (c *cluster) poll(what string, timeout time.Duration, check func(ctx context.Context) error) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := check(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not after %v: %v\n%s", what, timeout, err, c.describe("kube-system"))
		}
		time.Sleep(time.Second)
	}
}

func (c *cluster) waitNodesReady() {
	c.t.Helper()
	c.poll("both nodes Ready", readyTimeout, func(ctx context.Context) error {
		for _, n := range c.nodes {
			node, err := c.bed.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range node.Status.Conditions {
				if cond.Type == v1.NodeReady && (cond.Status != v1.ConditionTrue || cond.Reason == "TestBed") {
					return fmt.Errorf("node %s: Ready=%s %s %s", n.Name, cond.Status, cond.Reason, cond.Message)
				}
			}
		}
		return nil
	})
}

// waitDaemonSet waits until the proxy's DaemonSet has an up-to-date, ready
// pod on every node.
func (c *cluster) waitDaemonSet() {
	c.t.Helper()
	c.poll("DaemonSet "+c.daemonSet+" ready on both nodes", readyTimeout, func(ctx context.Context) error {
		ds, err := c.bed.Client().AppsV1().DaemonSets("kube-system").Get(ctx, c.daemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return daemonSetDone(ds, len(c.nodes))
	})
}

// daemonSetDone is `kubectl rollout status`'s test for a DaemonSet.
func daemonSetDone(ds *appsv1.DaemonSet, nodes int) error {
	st := ds.Status
	if ds.Generation > st.ObservedGeneration || int(st.DesiredNumberScheduled) != nodes ||
		st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberAvailable != st.DesiredNumberScheduled {
		return fmt.Errorf("DaemonSet %s: generation %d observed %d, desired %d, updated %d, available %d",
			ds.Name, ds.Generation, st.ObservedGeneration, st.DesiredNumberScheduled, st.UpdatedNumberScheduled, st.NumberAvailable)
	}
	return nil
}

func (c *cluster) waitCoreDNS() {
	c.t.Helper()
	c.poll("Deployment coredns available", readyTimeout, func(ctx context.Context) error {
		d, err := c.bed.Client().AppsV1().Deployments("kube-system").Get(ctx, "coredns", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Spec.Replicas == nil || d.Status.ReadyReplicas != *d.Spec.Replicas || d.Status.UpdatedReplicas != *d.Spec.Replicas {
			return fmt.Errorf("coredns: %d of %d ready", d.Status.ReadyReplicas, *d.Spec.Replicas)
		}
		return nil
	})
}

// describe lists a namespace's pods (phase, node, containers' states) and
// events: what a failed wait reports.
func (c *cluster) describe(ns string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var b strings.Builder
	pods, err := c.bed.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s: %s on %q\n", p.Name, p.Status.Phase, p.Spec.NodeName)
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			state := "none"
			switch s := cs.State; {
			case s.Waiting != nil:
				state = "waiting: " + s.Waiting.Reason + " " + s.Waiting.Message
			case s.Running != nil:
				state = "running"
			case s.Terminated != nil:
				state = fmt.Sprintf("terminated: %s %d %s", s.Terminated.Reason, s.Terminated.ExitCode, s.Terminated.Message)
			}
			fmt.Fprintf(&b, "  %s: ready=%v restarts=%d %s\n", cs.Name, cs.Ready, cs.RestartCount, state)
		}
	}
	events, err := c.bed.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "event %s %s/%s: %s %s (x%d)\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, e.Count)
		}
	}
	return b.String()
}
