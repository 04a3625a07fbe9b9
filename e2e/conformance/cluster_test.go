package conformance_test

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net"
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
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/conformance"
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
	// kubeadmProxyConf is config.conf of ConfigMap kube-system/kube-proxy
	// as kubeadm wrote it; a set's ProxyConfig is added to it.
	kubeadmProxyConf string
}

// startCluster brings up a dual-stack cluster (IPv4 first) as a user's would
// be: etcd and the API server (which reaches kubelets by their InternalIP
// with a client certificate), kube-controller-manager and kube-scheduler;
// kubeadm's kube-proxy and coredns addons; the proxy (nftproxy from
// deploy/, its image pulled from the local registry, or kubeadm's
// kube-proxy DaemonSet as it is; for TestHelm, kube-proxy with nftproxy's
// images in the registry), configured for the run's first set; two
// nodes with containerd, a kubelet, a pod network of both families and the
// test images; IPv4 first, or IPv6 (cfg.cluster). On flannel, flannel's DaemonSet routes the pods
// between the nodes (the bed routes them only from the control namespace).
// It returns once both nodes are Ready, the proxy's pods serve, flannel
// carries the pod network and CoreDNS answers for both families.
func startCluster(t *testing.T, cfg config, tl tools, images map[string]image, proxy string) *cluster {
	t.Helper()
	dir := t.TempDir()
	pki, err := kubenode.NewKubeletClientPKI(filepath.Join(dir, "pki"))
	if err != nil {
		t.Fatal(err)
	}
	flannelMode, flannel := cfg.cluster.CNI.Flannel()
	routes := testbed.PodRoutesEverywhere
	if flannel {
		// The API server and the test runner reach pods as from a
		// machine beside the cluster; flannel routes between the nodes.
		routes = testbed.PodRoutesFromControl
	}
	bed := testbed.Start(t, testbed.Options{PodRoutes: routes, IPv6Primary: cfg.cluster.IPv6Primary, APIServerFlags: append([]string{
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
	c.kubeadmProxyConf = c.proxyConfigMap().Data[proxyConfigKey]
	c.setProxyConfig(cfg.sets[0])
	if flannel {
		c.applyFlannel(flannelMode, images)
	}
	opts := kubenode.Options{
		CNI:          true,
		Flannel:      flannel,
		ClusterDNS:   bed.ClusterDNSIP(),
		Nameserver:   testbed.ControlIPv4, // nothing answers there: CoreDNS's forward fails fast, and nothing leaves the bed
		ClientCAFile: pki.CAFile,
	}
	for _, kind := range slices.Sorted(maps.Keys(images)) {
		opts.Images = append(opts.Images, images[kind].archive)
	}
	switch proxy {
	case proxyHelm:
		// kube-proxy runs until TestHelm replaces it; nftproxy's images
		// wait in the registry, where the chart goes too.
		c.daemonSet = proxyKubeProxy
		c.dropLibModules()
		c.startRegistry(filepath.Join(cfg.out, "images", "docker-registry"))
		c.pushNftproxy(cfg.prevImage, false)
		c.pushNftproxy(cfg.image, true)
		opts.Registry = registryAddr
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
	if flannel {
		c.installFlannelCNI()
	}
	c.waitNodesReady()
	c.waitDaemonSet()
	if flannel {
		c.checkFlannel(flannelMode)
	}
	c.waitCoreDNS()
	c.checkDNSBothFamilies()
	return c
}

// proxyConfigKey is the key of the KubeProxyConfiguration in kubeadm's
// ConfigMap kube-system/kube-proxy, which both proxies read.
const proxyConfigKey = "config.conf"

// proxyConfigMap returns ConfigMap kube-system/kube-proxy.
func (c *cluster) proxyConfigMap() *v1.ConfigMap {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cm, err := c.bed.Client().CoreV1().ConfigMaps("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return cm
}

// setProxyConfig writes kubeadm's KubeProxyConfiguration with set's
// ProxyConfig added into the ConfigMap both proxies read, and reports
// whether that changed it.
func (c *cluster) setProxyConfig(set conformance.Set) bool {
	c.t.Helper()
	want := c.kubeadmProxyConf
	if extra := set.ProxyConfig(); extra != nil {
		var conf map[string]any
		if err := yaml.Unmarshal([]byte(c.kubeadmProxyConf), &conf); err != nil {
			c.t.Fatalf("kubeadm's %s: %v", proxyConfigKey, err)
		}
		maps.Copy(conf, extra)
		b, err := yaml.Marshal(conf)
		if err != nil {
			c.t.Fatal(err)
		}
		want = string(b)
	}
	cm := c.proxyConfigMap()
	if cm.Data[proxyConfigKey] == want {
		return false
	}
	cm.Data[proxyConfigKey] = want
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.bed.Client().CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("%s: ConfigMap kube-system/kube-proxy for set %s: %v", c.proxy, set, set.ProxyConfig())
	return true
}

// configureProxy configures the running proxy for set: when its
// configuration changes, the DaemonSet is restarted (`kubectl rollout
// restart`) and waited for.
func (c *cluster) configureProxy(set conformance.Set) {
	c.t.Helper()
	if !c.setProxyConfig(set) {
		return
	}
	c.kubectl("--namespace", "kube-system", "rollout", "restart", "daemonset", c.daemonSet)
	c.waitRollout()
}

// checkDNSBothFamilies asks each CoreDNS pod, at each of its addresses, for
// the A and AAAA records of a dual-stack Service: the pods have addresses of
// both families, the bed routes both to them, and CoreDNS answers with the
// Service's ClusterIP of each family.
func (c *cluster) checkDNSBothFamilies() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	policy := v1.IPFamilyPolicyRequireDualStack
	svc, err := c.bed.Client().CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dns-check"},
		Spec: v1.ServiceSpec{IPFamilyPolicy: &policy,
			Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	defer c.bed.Client().CoreV1().Services("default").Delete(context.Background(), svc.Name, metav1.DeleteOptions{})
	if len(svc.Spec.ClusterIPs) != 2 {
		c.t.Fatalf("Service %s: ClusterIPs %v, want one of each family", svc.Name, svc.Spec.ClusterIPs)
	}
	pods, err := c.bed.Client().CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil {
		c.t.Fatal(err)
	}
	name := svc.Name + ".default.svc." + kubenode.ClusterDomain
	for _, p := range pods.Items {
		if len(p.Status.PodIPs) != 2 {
			c.t.Fatalf("CoreDNS pod %s: addresses %v, want one of each family", p.Name, p.Status.PodIPs)
		}
		for _, server := range p.Status.PodIPs {
			r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return c.bed.Ctl.DialContext(ctx, network, net.JoinHostPort(server.IP, "53"))
			}}
			var got []string
			for _, family := range []string{"ip4", "ip6"} {
				var ips []net.IP
				err := retry(ctx, func() (err error) { ips, err = r.LookupIP(ctx, family, name); return err })
				if err != nil {
					c.t.Fatalf("ask CoreDNS pod %s at %s for %s (%s): %v", p.Name, server.IP, name, family, err)
				}
				for _, ip := range ips {
					got = append(got, ip.String())
				}
			}
			want := slices.Clone(svc.Spec.ClusterIPs) // of the first family first
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				c.t.Fatalf("CoreDNS pod %s at %s: %s is %v, want %v", p.Name, server.IP, name, got, want)
			}
		}
	}
	c.t.Logf("CoreDNS answers A and AAAA at its pods' addresses of both families (%s: %v)", name, svc.Spec.ClusterIPs)
}

// retry calls f every half second until it succeeds or ctx ends.
func retry(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
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
