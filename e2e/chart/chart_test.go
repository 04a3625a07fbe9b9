package chart_test

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/chart"
	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

var update = flag.Bool("update", false, "rewrite docs/installing.md's values table and the golden renderings in testdata/")

// tools are the binaries the tests run: kubectl and helm of both majors.
type tools struct{ kubectl, helm3, helm4 string }

func ensureTools(t *testing.T) tools {
	t.Helper()
	bin := testbed.EnsureBinaries(t)
	return tools{kubectl: filepath.Join(bin, "kubectl"), helm3: filepath.Join(bin, "helm3"), helm4: filepath.Join(bin, "helm4")}
}

// helms are both majors, by name.
func (tl tools) helms() map[string]string {
	return map[string]string{"helm3": tl.helm3, "helm4": tl.helm4}
}

func chartDir() string { return filepath.Join(kubebin.RepoRoot(), chart.Dir) }

// template renders the chart for the Kubernetes release the tests run
// (helm v3's default is far older), without its test hooks, which no
// kustomization has.
func template(t *testing.T, helm string, args ...string) map[string]chart.Object {
	t.Helper()
	objs, err := chart.Template(helm, chartDir(), append([]string{"--skip-tests", "--kube-version", kubebin.Pinned().Kubernetes}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func kustomize(t *testing.T, kubectl string, dirs ...string) map[string]chart.Object {
	t.Helper()
	all := map[string]chart.Object{}
	for _, d := range dirs {
		objs, err := chart.Kustomize(kubectl, d)
		if err != nil {
			t.Fatal(err)
		}
		for k, o := range objs {
			all[k] = o
		}
	}
	return all
}

// TestChartRendersDeploy holds the chart to the kustomizations, object by
// object: its defaults render deploy/; the three monitoring switches add
// deploy/monitoring/; config.create with the values the component's EDIT
// lines name renders deploy/ with components/without-kubeadm (its two files
// compared as what they parse to: the chart writes no comments into them).
func TestChartRendersDeploy(t *testing.T) {
	tl := ensureTools(t)
	root := kubebin.RepoRoot()
	deploy := filepath.Join(root, "deploy")
	withComponent := t.TempDir()
	if err := chart.Overlay(withComponent, deploy, filepath.Join(deploy, "components", "without-kubeadm")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		dirs []string
	}{
		{"defaults", nil, []string{deploy}},
		{"monitoring", []string{"--set", "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true"},
			[]string{deploy, filepath.Join(deploy, "monitoring")}},
		{"config.create", []string{"--set", "config.create=true,config.apiServer=https://EDIT-control-plane-endpoint:6443",
			"--set", "config.kubeProxyConfiguration.clusterCIDR=10.244.0.0/16"}, []string{withComponent}},
	}
	for name, helm := range tl.helms() {
		for _, c := range cases {
			t.Run(name+"/"+c.name, func(t *testing.T) {
				got, want := template(t, helm, c.args...), kustomize(t, tl.kubectl, c.dirs...)
				parseConfFiles(t, got)
				parseConfFiles(t, want)
				if d := chart.Diff(got, want); d != "" {
					t.Errorf("helm template %v differs from kubectl kustomize %v:\n%s", c.args, c.dirs, d)
				}
			})
		}
	}
}

// parseConfFiles replaces each ConfigMap's *.conf data by what it parses to.
func parseConfFiles(t *testing.T, objs map[string]chart.Object) {
	t.Helper()
	for key, o := range objs {
		if o["kind"] != "ConfigMap" {
			continue
		}
		data, _ := o["data"].(map[string]any)
		for name, v := range data {
			s, ok := v.(string)
			if !ok || !strings.HasSuffix(name, ".conf") {
				continue
			}
			var parsed any
			if err := yaml.Unmarshal([]byte(s), &parsed); err != nil {
				t.Fatalf("%s: %s: %v", key, name, err)
			}
			data[name] = parsed
		}
	}
}

// TestChartPodsNotAdopted: no Pod the chart makes (helm test's) carries
// the labels the DaemonSet selects: the DaemonSet would adopt it and
// delete it as surplus on its node (found by TestHelm on real kubelets).
func TestChartPodsNotAdopted(t *testing.T) {
	tl := ensureTools(t)
	for name, helm := range tl.helms() {
		objs, err := chart.Template(helm, chartDir(), "--kube-version", kubebin.Pinned().Kubernetes)
		if err != nil {
			t.Fatal(err)
		}
		ds, ok := objs["DaemonSet kube-system/nftproxy"]
		if !ok {
			t.Fatalf("%s: no DaemonSet kube-system/nftproxy among %d objects", name, len(objs))
		}
		sel := field(ds, "spec", "selector", "matchLabels")
		pods := 0
		for key, o := range objs {
			if o["kind"] != "Pod" {
				continue
			}
			pods++
			labels := field(o, "metadata", "labels")
			matches := len(sel) > 0
			for k, v := range sel {
				if labels[k] != v {
					matches = false
				}
			}
			if matches {
				t.Errorf("%s: %s has the DaemonSet's selector %v among its labels %v", name, key, sel, labels)
			}
		}
		if pods == 0 {
			t.Errorf("%s: the chart makes no test pod", name)
		}
	}
}

// field returns the map at path in o (nil if there is none).
func field(o chart.Object, path ...string) map[string]any {
	m := map[string]any(o)
	for _, p := range path {
		m, _ = m[p].(map[string]any)
	}
	return m
}

// TestChartRefusesBadValues: values.schema.json refuses each bad value
// before anything renders, naming the field, with both helm majors.
func TestChartRefusesBadValues(t *testing.T) {
	tl := ensureTools(t)
	create := []string{"--set", "config.create=true,config.apiServer=https://control-plane:6443"}
	cases := []struct {
		set, field string
		args       []string
	}{
		{"config.kubeProxyConfiguration.nftables.syncPeriod=-1s", "/config/kubeProxyConfiguration/nftables/syncPeriod", create},
		{"config.kubeProxyConfiguration.conntrack.tcpCloseWaitTimeout=1 hour", "/config/kubeProxyConfiguration/conntrack/tcpCloseWaitTimeout", create},
		{"config.kubeProxyConfiguration.mode=ipvs", "/config/kubeProxyConfiguration/mode", create},
		{"config.kubeProxyConfiguration.nftables.masqueradeBit=32", "/config/kubeProxyConfiguration/nftables/masqueradeBit", create},
		{"config.kubeProxyConfiguration.nftables.sycnPeriod=1s", "'sycnPeriod'", create},
		{"config.kubeProxyConfiguration.featureGates.SomeGate=maybe", "/config/kubeProxyConfiguration/featureGates/SomeGate", create},
		{"metricsOnNodeIP=yes", "/metricsOnNodeIP", nil},
		{"image.pullPolicy=Sometimes", "/image/pullPolicy", nil},
		{"image.digest=latest", "/image/digest", nil},
		{"extraArgs[0]=v=2", "/extraArgs/0", nil},
		{"config.apiServer=10.96.0.1", "/config/apiServer", nil},
		{"tolerance=1", "'tolerance'", nil},
	}
	for name, helm := range tl.helms() {
		for _, c := range cases {
			args := append([]string{"template", "nftproxy", chartDir(), "--namespace", "kube-system",
				"--kube-version", kubebin.Pinned().Kubernetes, "--set", c.set}, c.args...)
			out, err := chart.Run(helm, args...)
			if err == nil {
				t.Errorf("%s: --set %s rendered:\n%s", name, c.set, out)
				continue
			}
			if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") || !strings.Contains(err.Error(), c.field) {
				t.Errorf("%s: --set %s: refused without naming %s by the schema: %v", name, c.set, c.field, err)
			}
		}
	}
	// What the templates refuse: a release outside kubeadm's ConfigMap's
	// namespace, a created ConfigMap without the API server's address.
	for name, helm := range tl.helms() {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"--namespace", "default"}, "install the release there"},
			{[]string{"--namespace", "kube-system", "--set", "config.create=true"}, "config.apiServer"},
		} {
			args := append([]string{"template", "nftproxy", chartDir(), "--kube-version", kubebin.Pinned().Kubernetes}, c.args...)
			if _, err := chart.Run(helm, args...); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s %v: want a refusal naming %q, got %v", name, c.args, c.want, err)
			}
		}
	}
}

// TestChartLint runs `helm lint --strict` with the defaults and with every
// switch on, with both majors: no warning, no error.
func TestChartLint(t *testing.T) {
	tl := ensureTools(t)
	for name, helm := range tl.helms() {
		for _, args := range [][]string{nil, {"--set", "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true," +
			"config.create=true,config.apiServer=https://control-plane:6443,config.kubeProxyConfiguration.clusterCIDR=10.244.0.0/16"}} {
			out, err := chart.Run(helm, append([]string{"lint", "--strict", "--namespace", "kube-system", "--kube-version", kubebin.Pinned().Kubernetes, chartDir()}, args...)...)
			if err != nil {
				t.Errorf("%s lint %v: %v\n%s", name, args, err, out)
				continue
			}
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, "[WARNING]") || strings.Contains(l, "[ERROR]") {
					t.Errorf("%s lint %v: %s", name, args, l)
				}
			}
		}
	}
}

// TestChartGolden compares `helm template` (test hooks included) of both
// majors with the renderings in testdata/MAJOR/ (the majors space documents
// differently), text for text: the defaults and every switch on. -update
// rewrites them; a review of their diff is a review of what operators will
// apply.
func TestChartGolden(t *testing.T) {
	tl := ensureTools(t)
	cases := map[string][]string{
		"defaults.yaml": nil,
		"everything.yaml": {"--set", "monitoring.serviceMonitor.enabled=true,monitoring.prometheusRule.enabled=true,monitoring.dashboard.enabled=true," +
			"config.create=true,config.apiServer=https://control-plane:6443,config.kubeProxyConfiguration.clusterCIDR=10.244.0.0/16\\,fd00:244::/48," +
			"extraArgs={--v=2},image.digest=sha256:" + strings.Repeat("ab", 32)},
	}
	for name, helm := range tl.helms() {
		for file, args := range cases {
			out, err := chart.Run(helm, append([]string{"template", "nftproxy", chartDir(), "--namespace", "kube-system",
				"--kube-version", kubebin.Pinned().Kubernetes}, args...)...)
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", name, file)
			if *update {
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test ./e2e/chart -run TestChartGolden -update writes it)", err)
			}
			if string(out) != string(want) {
				t.Errorf("%s template %v differs from %s (-update rewrites it):\n%s", name, args, golden, firstDiff(string(out), string(want)))
			}
		}
	}
}

// firstDiff shows the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return "line " + strconv.Itoa(i+1) + ":\n got: " + gl + "\nwant: " + wl
		}
	}
	return ""
}

// Markers of docs/installing.md's values table.
const (
	tableBegin = "<!-- values table: made from deploy/helm/nftproxy/values.schema.json and values.yaml by TestValuesTable (go test ./e2e/chart -run TestValuesTable -update) -->\n"
	tableEnd   = "<!-- end of values table -->\n"
)

// TestValuesTable keeps docs/installing.md's table of the chart's values in
// step with values.schema.json and values.yaml (-update rewrites it); every
// value must have a description.
func TestValuesTable(t *testing.T) {
	table, err := chart.ValuesTable(chartDir())
	if err != nil {
		t.Fatal(err)
	}
	doc := filepath.Join(kubebin.RepoRoot(), "docs", "installing.md")
	raw, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(raw), tableBegin)
	_, after, ok2 := strings.Cut(rest, tableEnd)
	if !ok || !ok2 {
		t.Fatalf("%s: no values table between %q and %q", doc, tableBegin, tableEnd)
	}
	want := before + tableBegin + table + tableEnd + after
	if want == string(raw) {
		return
	}
	if *update {
		if err := os.WriteFile(doc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the values table is not the chart's; go test ./e2e/chart -run TestValuesTable -update rewrites it:\n%s", doc, table)
}

// TestDiffWholeValues: Diff compares whole values, not the shortened text
// its messages show (a dashboard differing after its first bytes).
func TestDiffWholeValues(t *testing.T) {
	long := strings.Repeat("x", 500)
	obj := func(data string) map[string]chart.Object {
		return map[string]chart.Object{"ConfigMap ns/d": {"kind": "ConfigMap", "data": map[string]any{"d.json": data}}}
	}
	if d := chart.Diff(obj(long+"a"), obj(long+"b")); !strings.Contains(d, "ConfigMap ns/d.data.d.json") {
		t.Errorf("values differing after 500 bytes: diff %q", d)
	}
	if d := chart.Diff(obj(long), obj(long)); d != "" {
		t.Errorf("equal values: diff %q", d)
	}
}
