package monitoring

import (
	"fmt"
	"slices"
	"testing"
)

// scrapedInstance stands in for $instance: a target label, which a scrape
// does not hold, so any value does.
const scrapedInstance = "10.10.0.11:10249"

// TestDashboardQueriesServed: every metric, label and label value the
// dashboard's panels and variables read is served by a running nftproxy.
// Renaming a metric or a label, in metrics/ or in the dashboard, fails it.
func TestDashboardQueriesServed(t *testing.T) {
	d, err := LoadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	s := scrapeNftproxy(t)
	values := variableValues(t, d, s)
	for _, q := range d.Queries() {
		expr, err := Substitute(q.Expr, values, "5m")
		if err != nil {
			t.Errorf("%s: %v", q, err)
			continue
		}
		for _, gap := range gaps(t, s, expr) {
			t.Errorf("%s: %s\n\t%s", q, gap, expr)
		}
	}
}

// variableValues evaluates the dashboard's query variables (label_values)
// on the scrape, in order, each with the values of those before it. A
// variable that lists nothing is an error: every panel using it would be
// empty.
func variableValues(t *testing.T, d *Dashboard, s Served) map[string][]string {
	values := map[string][]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		selector, label, err := LabelValues(v.QueryString())
		if err != nil {
			t.Fatal(err)
		}
		expr, err := Substitute(selector, values, "5m")
		if err != nil {
			t.Fatalf("variable %s: %v", v.Name, err)
		}
		sels, err := Selections(expr)
		if err != nil || len(sels) != 1 {
			t.Fatalf("variable %s: selector %q: %v", v.Name, expr, err)
		}
		for _, gap := range s.Check(sels[0]) {
			t.Errorf("variable %s: %s", v.Name, gap)
		}
		switch {
		case slices.Contains(TargetLabels, label):
			values[v.Name] = []string{scrapedInstance}
		default:
			values[v.Name] = s.LabelValues(sels[0], label)
		}
		if len(values[v.Name]) == 0 {
			t.Errorf("variable %s: %s lists nothing", v.Name, v.QueryString())
		}
	}
	return values
}

// TestRulesServed: every metric, label and value the alerts read is served.
func TestRulesServed(t *testing.T) {
	rule, err := LoadRule()
	if err != nil {
		t.Fatal(err)
	}
	s := scrapeNftproxy(t)
	for _, r := range rule.Rules() {
		for _, gap := range gaps(t, s, r.Expr) {
			t.Errorf("alert %s: %s", r.Name(), gap)
		}
	}
}

// TestMixinQueriesServed: the kubernetes-mixin's "Kubernetes / Proxy"
// dashboard and KubeProxyDown alert read nothing that nftproxy does not
// serve, but for MixinGaps; each of those must still be a gap.
func TestMixinQueriesServed(t *testing.T) {
	s := scrapeNftproxy(t)
	values := map[string][]string{"cluster": {""}, "instance": {scrapedInstance}}
	found := map[Gap]bool{}
	check := func(what, expr string) {
		expr, err := Substitute(expr, values, "5m")
		if err != nil {
			t.Fatal(err)
		}
		for _, gap := range gaps(t, s, expr) {
			if _, known := MixinGaps[gap]; known {
				found[gap] = true
				continue
			}
			t.Errorf("%s: %s\n\t%s", what, gap, expr)
		}
	}
	for _, q := range MixinQueries {
		check(q.String(), q.Expr)
	}
	check("KubeProxyDown", MixinKubeProxyDown)
	selector, label, err := LabelValues(MixinInstanceVariable)
	if err != nil {
		t.Fatal(err)
	}
	check("variable instance", selector)
	if !slices.Contains(TargetLabels, label) {
		t.Errorf("the mixin's instance variable lists %s, not a target label", label)
	}
	for gap, why := range MixinGaps {
		if !found[gap] {
			t.Errorf("known gap %q (%s) is gone: remove it from MixinGaps", gap, why)
		}
	}
}

// gaps returns what expr reads that s does not serve.
func gaps(t *testing.T, s Served, expr string) []Gap {
	t.Helper()
	sels, err := Selections(expr)
	if err != nil {
		t.Error(err)
		return nil
	}
	var out []Gap
	for _, sel := range sels {
		for _, g := range s.Check(sel) {
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
	}
	return out
}

// TestServedCheck: the check finds a missing metric, label and value, and
// accepts what is there.
func TestServedCheck(t *testing.T) {
	s := Served{
		"a_total":  {{"ip_family": "IPv4", "result": "success"}},
		"h_bucket": {{"le": "1"}, {"le": "+Inf"}},
	}
	tests := []struct {
		expr string
		want []Gap
	}{
		{`sum by (result) (rate(a_total{job="kube-proxy", ip_family=~"IPv4|IPv6"}[5m]))`, nil},
		{`histogram_quantile(0.9, sum by (le, instance) (rate(h_bucket[1m])))`, nil},
		{`b_total`, []Gap{{Metric: "b_total"}}},
		{`a_total{result="failure"}`, []Gap{{Metric: "a_total", Label: "result", Value: "failure"}}},
		{`sum by (code) (a_total)`, []Gap{{Metric: "a_total", Label: "code"}}},
		{`a_total and on (instance, kind) h_bucket`, []Gap{{Metric: "a_total", Label: "kind"}, {Metric: "h_bucket", Label: "kind"}}},
		{`a_total{kind!="x"}`, nil}, // an absent label satisfies it
		{`up{job="kube-proxy"} == 0`, nil},
	}
	for _, tt := range tests {
		if got := gaps(t, s, tt.expr); fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: gaps %v, want %v", tt.expr, got, tt.want)
		}
	}
}
