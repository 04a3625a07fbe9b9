package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// RepoRoot is the root of the nftproxy repository, found from this file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Dir is deploy/monitoring.
func Dir() string { return filepath.Join(RepoRoot(), "deploy", "monitoring") }

// DashboardFile and RuleFile are the files the kustomization is made of.
const (
	DashboardFile = "dashboard.json"
	RuleFile      = "prometheusrule.yaml"
)

// PrometheusRule is the part of a monitoring.coreos.com/v1 PrometheusRule
// the tests read.
type PrometheusRule struct {
	Spec struct {
		Groups []RuleGroup `json:"groups"`
	} `json:"spec"`
}

// RuleGroup is a Prometheus rule group, as Prometheus's rule files hold it.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Rule is an alerting or recording rule.
type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Name is the rule's alert or record name.
func (r Rule) Name() string {
	if r.Alert != "" {
		return r.Alert
	}
	return r.Record
}

// LoadRule reads deploy/monitoring/prometheusrule.yaml. Unknown fields
// are errors, so that a typo cannot hide a rule's part from the tests.
func LoadRule() (*PrometheusRule, error) {
	raw, err := os.ReadFile(filepath.Join(Dir(), RuleFile))
	if err != nil {
		return nil, err
	}
	var doc struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		PrometheusRule
	}
	if err := yaml.UnmarshalStrict(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", RuleFile, err)
	}
	if doc.Kind != "PrometheusRule" || len(doc.Spec.Groups) == 0 {
		return nil, fmt.Errorf("%s: kind %q with %d groups, want a PrometheusRule with groups", RuleFile, doc.Kind, len(doc.Spec.Groups))
	}
	return &doc.PrometheusRule, nil
}

// Rules returns every rule of every group.
func (p *PrometheusRule) Rules() []Rule {
	var out []Rule
	for _, g := range p.Spec.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

// RulesFile is the rule's groups as a Prometheus rule file (what the
// operator hands Prometheus), for prometheus and promtool.
func (p *PrometheusRule) RulesFile() ([]byte, error) {
	return yaml.Marshal(map[string]any{"groups": p.Spec.Groups})
}

// LoadDashboard reads deploy/monitoring/dashboard.json.
func LoadDashboard() (*Dashboard, error) {
	raw, err := os.ReadFile(filepath.Join(Dir(), DashboardFile))
	if err != nil {
		return nil, err
	}
	var d Dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", DashboardFile, err)
	}
	return &d, nil
}

// Render builds deploy/monitoring/ with kustomize's own engine (what
// `kubectl apply -k` runs) and returns the objects as YAML documents.
func Render() ([]map[string]any, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), Dir())
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", Dir(), err)
	}
	var out []map[string]any
	for _, r := range rm.Resources() {
		m, err := r.Map()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}
