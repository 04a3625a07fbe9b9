package live

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/monitoring"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// operatorModule is the prometheus-operator release whose CRDs the API
// server gets; its module zip holds them in example/prometheus-operator-crd.
const operatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"

// operatorCRDs are the CRDs deploy/monitoring/ uses, and their names.
var operatorCRDs = map[string]string{
	"monitoring.coreos.com_servicemonitors.yaml": "servicemonitors.monitoring.coreos.com",
	"monitoring.coreos.com_prometheusrules.yaml": "prometheusrules.monitoring.coreos.com",
}

// kubectl runs the kubectl that e2e/tools/build.sh builds (the newest release of e2e/tools/versions)
// as the bed's admin, from the control namespace, with a discovery cache
// of its own.
type kubectl struct {
	bed      *testbed.Bed
	bin, dir string
}

func (k kubectl) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return k.bed.AdminExec(ctx, k.bin, slices.Concat(args, []string{"--cache-dir", filepath.Join(k.dir, "cache")})...)
}

// dryRunManifests installs the Prometheus operator's CRDs and runs
// `kubectl apply --dry-run=server -k deploy/monitoring/`: every object
// validated by the API server against its schema, unknown fields refused
// (kubectl's default strict validation), nothing stored. Two broken
// copies must be refused, showing that it validates.
func dryRunManifests(t *testing.T, k kubectl) {
	crds := crdDir(t)
	var names []string
	for file, name := range operatorCRDs {
		if out, err := k.run("create", "-f", filepath.Join(crds, file)); err != nil {
			t.Fatalf("install CRD %s: %v\n%s", file, err, out)
		}
		names = append(names, "crd/"+name)
	}
	if out, err := k.run(append([]string{"wait", "--for=condition=Established", "--timeout=60s"}, names...)...); err != nil {
		t.Fatalf("CRDs not established: %v\n%s", err, out)
	}
	out, err := k.run("apply", "--dry-run=server", "-k", monitoring.Dir())
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server -k %s: %v\n%s", monitoring.Dir(), err, out)
	}
	t.Logf("kubectl apply --dry-run=server -k deploy/monitoring/:\n%s", out)
	for _, obj := range []string{"configmap/nftproxy-dashboard", "service/nftproxy-metrics",
		"servicemonitor.monitoring.coreos.com/nftproxy", "prometheusrule.monitoring.coreos.com/nftproxy"} {
		if !strings.Contains(out, obj+" created (server dry run)") {
			t.Errorf("kubectl did not dry-run %s", obj)
		}
	}
	for name, broken := range brokenCopies(t) {
		path := filepath.Join(k.dir, strings.ReplaceAll(name, " ", "-")+".yaml")
		if err := os.WriteFile(path, broken, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := k.run("apply", "--dry-run=server", "-f", path); err == nil {
			t.Errorf("%s was accepted:\n%s", name, out)
		} else {
			t.Logf("%s refused: %v", name, err)
		}
	}
}

// brokenCopies returns deploy/monitoring's ServiceMonitor with a misspelt
// field and its PrometheusRule with a duration that is not one, as YAML.
func brokenCopies(t *testing.T) map[string][]byte {
	objs, err := monitoring.Render()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for _, o := range objs {
		spec, _ := o["spec"].(map[string]any)
		switch o["kind"] {
		case "ServiceMonitor":
			spec["jobLable"] = spec["jobLabel"]
			out["a ServiceMonitor with an unknown field"] = mustYAML(t, o)
		case "PrometheusRule":
			group := spec["groups"].([]any)[0].(map[string]any)
			group["rules"].([]any)[0].(map[string]any)["for"] = "fifteen minutes"
			out["a PrometheusRule with a bad duration"] = mustYAML(t, o)
		}
	}
	if len(out) != 2 {
		t.Fatalf("deploy/monitoring has no ServiceMonitor or no PrometheusRule")
	}
	return out
}

func mustYAML(t *testing.T, v any) []byte {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// crdDir downloads the prometheus-operator module (through the Go module
// proxy, into the module cache) and returns its CRD directory.
func crdDir(t *testing.T) string {
	cmd := exec.Command("go", "mod", "download", "-json", operatorModule)
	cmd.Dir = t.TempDir() // outside any module: nothing's go.mod changes
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); err != nil || jerr != nil || mod.Error != "" {
		t.Fatalf("go mod download %s: %v %s %s", operatorModule, err, mod.Error, stderr.String())
	}
	return filepath.Join(mod.Dir, "example", "prometheus-operator-crd")
}
