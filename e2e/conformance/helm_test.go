package conformance_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/chart"
	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// helmEnv=1 runs TestHelm (make helm-e2e).
const helmEnv = "NFTPROXY_HELM_E2E"

// release is the Helm release's name; the chart's objects keep their own.
const release = "nftproxy"

// TestHelm installs nftproxy with its chart (deploy/helm/nftproxy), as an
// operator would, with real helm of both majors in turn on the conformance
// cluster (dual-stack, two kubelets, kubeadm's kube-proxy at the start), from
// the bed's registry as an OCI artifact: a bad value refused with nothing
// applied; kube-proxy's DaemonSet deleted (before the first install only);
// `helm install` of the chart packaged for the previous release's image;
// then under load (the disruption cases' client: new and held connections
// to a ClusterIP with endpoints on both nodes) `helm upgrade` to this
// build's chart, `helm upgrade` of one value, `helm rollback` to the first
// revision and `helm uninstall`, each with 0 connections lost; `helm test`
// between them; after the uninstall, nothing of the chart's left in the API
// but kubeadm's ConfigMap as it was, and on each node nftproxy's tables
// still serving (docs/migrating-from-kube-proxy.md: stopping a proxy
// leaves its rules). helm v3 uses client-side apply, helm v4 its default,
// server-side apply (docs/installing.md says why).
func TestHelm(t *testing.T) {
	if os.Getenv(helmEnv) != "1" {
		t.Skipf("set %s=1 (make helm-e2e) to install the chart with helm on a two-node cluster", helmEnv)
	}
	testbed.RequirePrivileges(t)
	cfg := readConfig(t)
	if cfg.prevImage == "" {
		t.Fatalf("%s: the previous release's image is needed for the upgrade", prevImageEnv)
	}
	tl := ensureTools(t, cfg.cluster.CNI)
	images := buildImages(t, tl, filepath.Join(cfg.out, "images"))
	testImage := agnhostImage(t, images)
	c := startCluster(t, cfg, tl, images, proxyHelm)
	kubeadmConf := c.proxyConfigMap().Data
	clusterIP := c.deployBackends()
	prev, cur := versionTag(t, cfg.prevImage), versionTag(t, cfg.image)
	var results []disruptionResult
	for i, major := range []string{"helm3", "helm4"} {
		h := c.newHelm(major)
		prevChart, curChart := h.push(prev), h.push(cur)
		h.refuseBadValue(prevChart)
		if i == 0 {
			c.kubectl("--namespace", "kube-system", "delete", "daemonset", "kube-proxy", "--wait")
			t.Logf("kube-proxy's DaemonSet deleted")
		}
		h.run("install", release, prevChart.ref, "--version", prevChart.version, "--plain-http", "--set", "tests.image="+testImage)
		c.proxy, c.daemonSet = proxyNftproxy, "nftproxy"
		c.waitDaemonSet()
		c.checkImage("nftproxy:" + prev)
		c.checkApply(major == "helm4")
		h.test()
		cases := []disruption{
			{name: fmt.Sprintf("%s upgrade: chart %s → %s (image nftproxy:%s → nftproxy:%s)", major, prevChart.version, curChart.version, prev, cur),
				disrupt: func() {
					h.run("upgrade", release, curChart.ref, "--version", curChart.version, "--plain-http", "--reuse-values")
					c.waitRollout()
					c.checkImage("nftproxy:" + cur)
				}},
			{name: major + " upgrade of a value (`--set extraArgs={--v=2}`)",
				disrupt: func() {
					h.run("upgrade", release, curChart.ref, "--version", curChart.version, "--plain-http", "--reuse-values", "--set", "extraArgs={--v=2}")
					c.waitRollout()
					c.checkArg("--v=2", true)
				}},
			{name: major + " rollback to revision 1",
				disrupt: func() {
					h.run("rollback", release, "1")
					c.waitRollout()
					c.checkImage("nftproxy:" + prev)
					c.checkArg("--v=2", false)
				}},
			{name: major + " uninstall",
				disrupt: func() {
					h.run("uninstall", release)
					c.waitGone(kubeadmConf)
				}},
		}
		for j, d := range cases {
			r := c.underLoad(fmt.Sprintf("%s-client-%d", major, j), clusterIP, d)
			t.Logf("%s: %s (done after %v)", d.name, r.load, r.took.Round(100*time.Millisecond))
			if r.load.Failed > 0 || r.load.Broken > 0 {
				t.Errorf("%s: %d of %d new connections failed %v, %d of %d held ones broke",
					d.name, r.load.Failed, r.load.Attempted, r.load.Failures, r.load.Broken, r.load.Held)
			}
			if r.outside {
				t.Errorf("%s took %v, beyond the load's window (%v)", d.name, r.took, loadWindow)
			}
			results = append(results, r)
			if j < len(cases)-1 {
				h.test()
			}
		}
		c.checkTablesLeft()
	}
	writeDisruption(t, filepath.Join(cfg.out, "helm.md"), "nftproxy (Helm chart)", results)
}

// agnhostImage is the agnhost image the nodes have, for `helm test`: the
// chart's default when they have it (that of e2e.test's release).
func agnhostImage(t *testing.T, images map[string]image) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(kubebin.RepoRoot(), chart.Dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Tests struct{ Image string } `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	names := images["agnhost"].names
	if slices.Contains(names, values.Tests.Image) {
		return values.Tests.Image
	}
	for _, n := range names {
		if strings.Contains(n, "/agnhost:") {
			t.Logf("the chart's tests.image %s is not e2e.test's; helm test runs %s", values.Tests.Image, n)
			return n
		}
	}
	t.Fatalf("no agnhost image among the test images")
	return ""
}

// helmRunner runs one helm binary against the cluster, with its own
// configuration, cache and registry login files.
type helmRunner struct {
	c     *cluster
	major string
	bin   string
	env   []string
	// repo is the chart's OCI repository of this major's pushes.
	repo string
}

// packagedChart is a chart pushed to the registry.
type packagedChart struct{ ref, version string }

func (c *cluster) newHelm(major string) *helmRunner {
	home := filepath.Join(c.bed.Dir, major)
	h := &helmRunner{c: c, major: major, bin: filepath.Join(filepath.Dir(c.tools.Kubectl), major),
		repo: "oci://" + registryAddr + "/charts/" + major}
	for _, d := range []string{"config", "cache", "data"} {
		p := filepath.Join(home, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			c.t.Fatal(err)
		}
		h.env = append(h.env, "HELM_"+strings.ToUpper(d)+"_HOME="+p)
	}
	h.env = append(h.env, "HOME="+home)
	return h
}

// run runs `helm ARGS` in kube-system, waiting for the objects (helm's
// --wait: a DaemonSet's pods ready), and returns its output.
func (h *helmRunner) run(args ...string) string {
	h.c.t.Helper()
	out, err := h.try(append(args, "--namespace", "kube-system", "--wait", "--timeout", "5m")...)
	if err != nil {
		h.c.t.Fatalf("%s %s: %v\n%s", h.major, strings.Join(args, " "), err, out)
	}
	h.c.t.Logf("%s %s", h.major, strings.Join(args, " "))
	return out
}

// try runs helm with args as the cluster's admin from the control namespace.
func (h *helmRunner) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	return h.c.bed.AdminExec(ctx, "env", slices.Concat(h.env, []string{h.bin}, args)...)
}

// push packages the chart of this tree for the image tag and pushes it to
// the registry, as `make chart` packages it: version 0.1.0-g<tag>,
// appVersion the tag.
func (h *helmRunner) push(tag string) packagedChart {
	t := h.c.t
	t.Helper()
	version := "0.1.0-g" + strings.ReplaceAll(tag, ".", "-")
	dir := filepath.Join(h.c.bed.Dir, h.major, "packages")
	if out, err := chart.Run(h.bin, "package", filepath.Join(kubebin.RepoRoot(), chart.Dir),
		"--version", version, "--app-version", tag, "--destination", dir); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	pkg := filepath.Join(dir, "nftproxy-"+version+".tgz")
	if out, err := h.try("push", pkg, h.repo, "--plain-http"); err != nil {
		t.Fatalf("%s push %s: %v\n%s", h.major, pkg, err, out)
	}
	return packagedChart{ref: h.repo + "/nftproxy", version: version}
}

// refuseBadValue: an install with a negative sync period is refused by
// the schema, naming the field, and leaves no release and no object.
func (h *helmRunner) refuseBadValue(ch packagedChart) {
	t := h.c.t
	t.Helper()
	out, err := h.try("install", release, ch.ref, "--version", ch.version, "--namespace", "kube-system", "--plain-http",
		"--set", "config.create=true,config.configMapName=nftproxy-config,config.apiServer=https://"+testbed.ControlIPv4+":6443",
		"--set", "config.kubeProxyConfiguration.nftables.syncPeriod=-30s")
	if err == nil {
		t.Fatalf("%s install with nftables.syncPeriod=-30s succeeded:\n%s", h.major, out)
	}
	if !strings.Contains(err.Error(), "/config/kubeProxyConfiguration/nftables/syncPeriod") {
		t.Errorf("%s: the refusal does not name the field: %v", h.major, err)
	}
	if out, err := h.try("status", release, "--namespace", "kube-system"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("%s status after the refused install: want release not found, got %v\n%s", h.major, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, get := range []func() error{
		func() error {
			_, err := h.c.bed.Client().AppsV1().DaemonSets("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
			return err
		},
		func() error {
			_, err := h.c.bed.Client().CoreV1().ConfigMaps("kube-system").Get(ctx, "nftproxy-config", metav1.GetOptions{})
			return err
		},
	} {
		if err := get(); !apierrors.IsNotFound(err) {
			t.Errorf("%s: after the refused install: %v, want not found", h.major, err)
		}
	}
	t.Logf("%s: a negative sync period refused, nothing applied: %s", h.major, lastLine(err.Error()))
}

// test runs `helm test` (the chart's pod connects to the kubernetes
// Service through its node's rules).
func (h *helmRunner) test() {
	h.c.t.Helper()
	out, err := h.try("test", release, "--namespace", "kube-system", "--timeout", "2m", "--logs")
	if err != nil {
		logs, _ := h.c.bed.Client().CoreV1().Pods("kube-system").GetLogs("nftproxy-test-connect", &v1.PodLogOptions{}).DoRaw(context.Background())
		h.c.t.Fatalf("%s test: %v\n%s\ntest pod's log: %s\n%s", h.major, err, out, logs, h.c.describe("kube-system"))
	}
	h.c.t.Logf("%s test: %s", h.major, strings.Join(strings.Fields(grepLine(out, "Phase:")), " "))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}

// checkImage checks that every container of the DaemonSet runs image
// (the name the registry serves it under).
func (c *cluster) checkImage(image string) {
	c.t.Helper()
	ds := c.daemonSetObject()
	for _, ct := range slices.Concat(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers) {
		if ct.Image != image {
			c.t.Errorf("DaemonSet %s: container %s runs %s, want %s", ds.Name, ct.Name, ct.Image, image)
		}
	}
}

// checkApply checks how helm wrote the DaemonSet: server-side apply (an
// Apply entry in its managed fields) with helm v4's default, a client-side
// update with helm v3.
func (c *cluster) checkApply(serverSide bool) {
	c.t.Helper()
	ds := c.daemonSetObject()
	var managers []string
	applied := false
	for _, m := range ds.ManagedFields {
		managers = append(managers, m.Manager+"/"+string(m.Operation))
		applied = applied || m.Operation == metav1.ManagedFieldsOperationApply
	}
	if applied != serverSide {
		c.t.Errorf("DaemonSet %s: managed fields %v: server-side apply %v, want %v", ds.Name, managers, applied, serverSide)
	}
	c.t.Logf("DaemonSet %s written by %v", ds.Name, managers)
}

// checkArg checks whether the nftproxy container's command has arg.
func (c *cluster) checkArg(arg string, want bool) {
	c.t.Helper()
	ds := c.daemonSetObject()
	for _, ct := range ds.Spec.Template.Spec.Containers {
		if ct.Name == "nftproxy" && slices.Contains(ct.Command, arg) != want {
			c.t.Errorf("DaemonSet %s: command %v: has %s: %v, want %v", ds.Name, ct.Command, arg, !want, want)
		}
	}
}

func (c *cluster) daemonSetObject() *appsv1.DaemonSet {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ds, err := c.bed.Client().AppsV1().DaemonSets("kube-system").Get(ctx, c.daemonSet, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	return ds
}

// waitGone waits until the chart's objects and pods are gone, and checks
// that kubeadm's ConfigMap is as it was.
func (c *cluster) waitGone(kubeadmConf map[string]string) {
	c.t.Helper()
	client := c.bed.Client()
	c.poll("the chart's objects gone", readyTimeout, func(ctx context.Context) error {
		checks := map[string]func() error{
			"DaemonSet": func() error {
				_, err := client.AppsV1().DaemonSets("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
				return err
			},
			"ServiceAccount": func() error {
				_, err := client.CoreV1().ServiceAccounts("kube-system").Get(ctx, "nftproxy", metav1.GetOptions{})
				return err
			},
			"ClusterRole": func() error {
				_, err := client.RbacV1().ClusterRoles().Get(ctx, "nftproxy", metav1.GetOptions{})
				return err
			},
			"ClusterRoleBinding": func() error {
				_, err := client.RbacV1().ClusterRoleBindings().Get(ctx, "nftproxy", metav1.GetOptions{})
				return err
			},
		}
		for what, get := range checks {
			if err := get(); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s nftproxy: %v", what, err)
			}
		}
		pods, err := client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=nftproxy"})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d nftproxy pods left", len(pods.Items))
		}
		return nil
	})
	if got := c.proxyConfigMap().Data; !maps.Equal(got, kubeadmConf) {
		c.t.Errorf("kubeadm's ConfigMap kube-system/kube-proxy changed by the chart: %v, was %v", got, kubeadmConf)
	}
}

// checkTablesLeft checks that each node still has nftproxy's tables of both
// families after the uninstall, and no kube-proxy table.
func (c *cluster) checkTablesLeft() {
	c.t.Helper()
	for _, n := range c.nodes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := n.Exec(ctx, "nft", "list", "tables")
		cancel()
		if err != nil {
			c.t.Fatalf("%s: nft list tables: %v", n.Name, err)
		}
		tables := strings.Split(strings.TrimSpace(out), "\n")
		for _, want := range []string{"table ip nftproxy", "table ip6 nftproxy"} {
			if !slices.Contains(tables, want) {
				c.t.Errorf("%s after helm uninstall: no %q among %q", n.Name, want, tables)
			}
		}
		for _, gone := range []string{"table ip kube-proxy", "table ip6 kube-proxy"} {
			if slices.Contains(tables, gone) {
				c.t.Errorf("%s after helm uninstall: kube-proxy's %q is still there", n.Name, gone)
			}
		}
		c.t.Logf("%s after helm uninstall: %s", n.Name, strings.Join(tables, ", "))
	}
}
