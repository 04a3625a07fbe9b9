package monitoring

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKustomization builds deploy/monitoring/ with kustomize and checks
// that its parts fit together: the dashboard ConfigMap is the JSON file
// with the Grafana sidecar's label; the ServiceMonitor finds the Service,
// which finds the DaemonSet's pods on the port nftproxy serves metrics on,
// and names the job kube-proxy.
func TestKustomization(t *testing.T) {
	objs, err := Render()
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string]map[string]any{}
	for _, o := range objs {
		kind := str(o, "kind")
		if _, dup := byKind[kind]; dup {
			t.Errorf("two %s objects: the checks below expect one", kind)
		}
		byKind[kind] = o
		if ns := str(o, "metadata", "namespace"); ns != "kube-system" {
			t.Errorf("%s %s in namespace %q, want kube-system (beside the DaemonSet)", kind, str(o, "metadata", "name"), ns)
		}
	}
	for _, kind := range []string{"ConfigMap", "Service", "ServiceMonitor", "PrometheusRule"} {
		if byKind[kind] == nil {
			t.Fatalf("no %s in the kustomization's output", kind)
		}
	}
	checkDashboardConfigMap(t, byKind["ConfigMap"])
	checkScrape(t, byKind["ServiceMonitor"], byKind["Service"])
	rule, err := LoadRule()
	if err != nil {
		t.Fatal(err)
	}
	var rendered PrometheusRule
	remarshal(t, byKind["PrometheusRule"], &rendered)
	if !reflect.DeepEqual(rendered.Spec, rule.Spec) {
		t.Error("the rendered PrometheusRule's groups differ from prometheusrule.yaml")
	}
}

func checkDashboardConfigMap(t *testing.T, cm map[string]any) {
	if got := str(cm, "metadata", "labels", "grafana_dashboard"); got != "1" {
		t.Errorf("dashboard ConfigMap label grafana_dashboard = %q, want \"1\" (what kube-prometheus-stack's Grafana sidecar looks for)", got)
	}
	if name := str(cm, "metadata", "name"); name != "nftproxy-dashboard" {
		t.Errorf("dashboard ConfigMap named %q: a hash suffix would leave old copies with the same uid behind", name)
	}
	file, err := os.ReadFile(filepath.Join(Dir(), DashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := cm["data"].(map[string]any)
	if len(data) != 1 || data["nftproxy.json"] != string(file) {
		t.Errorf("dashboard ConfigMap data has keys %v, want nftproxy.json holding %s", keys(data), DashboardFile)
	}
}

// checkScrape follows the ServiceMonitor to the Service and the Service to
// deploy/daemonset.yaml's pods.
func checkScrape(t *testing.T, sm, svc map[string]any) {
	svcLabels := stringMap(get(svc, "metadata", "labels"))
	if job := svcLabels[str(sm, "spec", "jobLabel")]; job != "kube-proxy" {
		t.Errorf("the ServiceMonitor's jobLabel %q gives job=%q, want kube-proxy", str(sm, "spec", "jobLabel"), job)
	}
	if sel := stringMap(get(sm, "spec", "selector", "matchLabels")); !subset(sel, svcLabels) {
		t.Errorf("ServiceMonitor selector %v does not select the Service (labels %v)", sel, svcLabels)
	}
	ports := map[string]string{}
	for _, p := range list(get(svc, "spec", "ports")) {
		ports[fmt.Sprint(p["name"])] = fmt.Sprint(p["targetPort"])
	}
	endpoints := list(get(sm, "spec", "endpoints"))
	if len(endpoints) == 0 {
		t.Fatal("ServiceMonitor without endpoints")
	}
	for _, ep := range endpoints {
		if target, ok := ports[fmt.Sprint(ep["port"])]; !ok || target != "10249" {
			t.Errorf("ServiceMonitor endpoint port %v: the Service's ports are %v, want one to 10249", ep["port"], ports)
		}
	}
	if str(svc, "spec", "clusterIP") != "None" {
		t.Error("the metrics Service is not headless: it needs no ClusterIP (and nftproxy would program one)")
	}
	ds := readYAML(t, filepath.Join(RepoRoot(), "deploy", "daemonset.yaml"))
	podLabels := stringMap(get(ds, "spec", "template", "metadata", "labels"))
	if sel := stringMap(get(svc, "spec", "selector")); len(sel) == 0 || !subset(sel, podLabels) {
		t.Errorf("the Service's selector %v does not select deploy/daemonset.yaml's pods (labels %v)", sel, podLabels)
	}
	if ns := str(ds, "metadata", "namespace"); ns != "kube-system" {
		t.Errorf("the DaemonSet is in %q, the Service in kube-system", ns)
	}
}

// TestAlertRules: every alert has a severity, a summary, a description and
// a runbook_url that points at a section of docs/monitoring.md.
func TestAlertRules(t *testing.T) {
	rule, err := LoadRule()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(RepoRoot(), "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	const runbooks = "https://github.com/nftproxy/nftproxy/blob/main/docs/monitoring.md#"
	for _, r := range rule.Rules() {
		if r.Alert == "" {
			continue
		}
		if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
			t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if strings.TrimSpace(r.Annotations[a]) == "" {
				t.Errorf("%s: no %s", r.Alert, a)
			}
		}
		url := r.Annotations["runbook_url"]
		if anchor, ok := strings.CutPrefix(url, runbooks); !ok || anchor != strings.ToLower(r.Alert) || !anchors[anchor] {
			t.Errorf("%s: runbook_url %s: want %s%s, a heading of docs/monitoring.md", r.Alert, url, runbooks, strings.ToLower(r.Alert))
		}
	}
}

// githubAnchor is the anchor GitHub gives a heading.
func githubAnchor(heading string) string {
	a := strings.ToLower(strings.TrimSpace(heading))
	a = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(a, "")
	return strings.ReplaceAll(a, " ", "-")
}

// TestInner: an alert's expression without its thresholds.
func TestInner(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`absent(up{job="kube-proxy"} == 1)`, []string{`up{job="kube-proxy"}`}},
		{`increase(x[10m]) > 0`, []string{`increase(x[10m])`}},
		{`2 < rate(x[1m])`, []string{`rate(x[1m])`}},
		{`(a > b) and (time() - b > 120)`, []string{`a`, `b`, `time() - b`}},
		{`sum by (k) (x) > 0`, []string{`sum by (k) (x)`}},
		{`a / b`, []string{`a / b`}},
	}
	for _, tt := range tests {
		got, err := Inner(tt.expr)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("Inner(%s) = %q, %v; want %q", tt.expr, got, err, tt.want)
		}
	}
}

func readYAML(t *testing.T, path string) map[string]any {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func remarshal(t *testing.T, from, to any) {
	raw, err := yaml.Marshal(from)
	if err == nil {
		err = yaml.Unmarshal(raw, to)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// get walks nested maps.
func get(m map[string]any, path ...string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

func str(m map[string]any, path ...string) string {
	s, _ := get(m, path...).(string)
	return s
}

func stringMap(v any) map[string]string {
	out := map[string]string{}
	m, _ := v.(map[string]any)
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

func list(v any) []map[string]any {
	var out []map[string]any
	l, _ := v.([]any)
	for _, e := range l {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

func subset(small, big map[string]string) bool {
	for k, v := range small {
		if big[k] != v {
			return false
		}
	}
	return true
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
