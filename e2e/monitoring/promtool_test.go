package monitoring

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	"sigs.k8s.io/yaml"
)

// promtoolTests is testdata/alerts_test.yaml: promtool's unit tests of the
// alerts.
const promtoolTests = "alerts_test.yaml"

// ruleTests is the part of a promtool test file this test reads.
type ruleTests struct {
	Tests []struct {
		Name  string `json:"name"`
		Evals []struct {
			EvalTime  string           `json:"eval_time"`
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// evalKey names one alert check of a promtool test.
type evalKey struct{ test, alert, time string }

// TestAlertsPromtool runs `promtool test rules` on the alerts of
// deploy/monitoring/prometheusrule.yaml and the cases of
// testdata/alerts_test.yaml, which must pass. Then, alert by alert, it
// shows that the cases can fail: with the alert's expression replaced by
// one that never fires, each of its firing checks fails; with one that
// always fires at once, each of its quiet checks fails.
func TestAlertsPromtool(t *testing.T) {
	promtool := RequireTool(t, "promtool")
	rule, err := LoadRule()
	if err != nil {
		t.Fatal(err)
	}
	fire, quiet := casesByAlert(t, rule)
	if failed, out := runPromtool(t, promtool, rule); len(failed) > 0 || out == "" {
		t.Fatalf("promtool test rules failed:\n%s", out)
	}
	for _, r := range rule.Rules() {
		if r.Alert == "" {
			continue
		}
		t.Run(r.Alert, func(t *testing.T) {
			for _, m := range []struct {
				name, expr, forDuration string
				mustFail                []evalKey
			}{
				{"never fires", "vector(1) > 2", r.For, fire[r.Alert]},
				{"always fires", "vector(1)", "", quiet[r.Alert]},
			} {
				failed, out := runPromtool(t, promtool, withExpr(rule, r.Alert, m.expr, m.forDuration))
				for _, k := range m.mustFail {
					if !failed[k] {
						t.Errorf("with an expression that %s, %s at %s did not fail:\n%s", m.name, k.test, k.time, out)
					}
				}
			}
		})
	}
}

// casesByAlert reads the promtool tests and returns each alert's checks
// that expect it to fire and that expect it quiet. Every alert needs both,
// and every check must name an alert of the rule.
func casesByAlert(t *testing.T, rule *PrometheusRule) (fire, quiet map[string][]evalKey) {
	raw, err := os.ReadFile(filepath.Join("testdata", promtoolTests))
	if err != nil {
		t.Fatal(err)
	}
	var tests ruleTests
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	fire, quiet = map[string][]evalKey{}, map[string][]evalKey{}
	var alerts []string
	for _, r := range rule.Rules() {
		alerts = append(alerts, r.Alert)
	}
	for _, tc := range tests.Tests {
		for _, ev := range tc.Evals {
			at, err := model.ParseDuration(ev.EvalTime)
			if err != nil {
				t.Fatalf("%s: eval_time: %v", tc.Name, err)
			}
			// As promtool prints it (80m is 1h20m).
			k := evalKey{tc.Name, ev.Alertname, at.String()}
			switch {
			case !slices.Contains(alerts, ev.Alertname):
				t.Errorf("%s: alert %s is not in %s", tc.Name, ev.Alertname, RuleFile)
			case len(ev.ExpAlerts) > 0:
				fire[ev.Alertname] = append(fire[ev.Alertname], k)
			default:
				quiet[ev.Alertname] = append(quiet[ev.Alertname], k)
			}
		}
	}
	for _, a := range alerts {
		if a != "" && (len(fire[a]) == 0 || len(quiet[a]) == 0) {
			t.Errorf("alert %s: %d firing and %d quiet cases in testdata/%s, want both", a, len(fire[a]), len(quiet[a]), promtoolTests)
		}
	}
	return fire, quiet
}

// withExpr returns a copy of rule whose alert has expression expr and
// for duration forDuration.
func withExpr(rule *PrometheusRule, alert, expr, forDuration string) *PrometheusRule {
	out := &PrometheusRule{}
	for _, g := range rule.Spec.Groups {
		g.Rules = slices.Clone(g.Rules)
		for i := range g.Rules {
			if g.Rules[i].Alert == alert {
				g.Rules[i].Expr, g.Rules[i].For = expr, forDuration
			}
		}
		out.Spec.Groups = append(out.Spec.Groups, g)
	}
	return out
}

// promtoolFailure matches a failed check in promtool's output.
var promtoolFailure = regexp.MustCompile(`name: (.*),\s*alertname: (\w+), time: (\S+),`)

// runPromtool writes rule's groups and the promtool tests to a directory
// of their own, runs `promtool check rules` (which must pass) and
// `promtool test rules`, and returns the checks that failed and the output.
func runPromtool(t *testing.T, promtool string, rule *PrometheusRule) (map[evalKey]bool, string) {
	t.Helper()
	dir := t.TempDir()
	rules, err := rule.RulesFile()
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", promtoolTests))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"rules.yaml": rules, promtoolTests: tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	check := exec.Command(promtool, "check", "rules", "rules.yaml")
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	cmd := exec.Command(promtool, "test", "rules", promtoolTests)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	failed := map[evalKey]bool{}
	for _, m := range promtoolFailure.FindAllStringSubmatch(string(out), -1) {
		failed[evalKey{m[1], m[2], m[3]}] = true
	}
	if _, isExit := err.(*exec.ExitError); err != nil && !isExit {
		t.Fatalf("promtool: %v", err)
	}
	if (err != nil) != (len(failed) > 0) {
		t.Fatalf("promtool exit %v, but %d failed checks found in its output:\n%s", err, len(failed), out)
	}
	return failed, string(out)
}
