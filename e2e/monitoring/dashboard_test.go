package monitoring

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDashboardStructure checks what Grafana would take badly or show
// wrong without complaint: panels without the dashboard's data source,
// duplicate ids, overlapping or off-grid panels, undefined variables, and
// multi-value variables outside a regular-expression matcher (Grafana
// writes several values as (a|b), which only =~ reads as meant).
func TestDashboardStructure(t *testing.T) {
	d, err := LoadDashboard()
	if err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both needed (the uid keeps links stable)", d.UID, d.Title)
	}
	checkVariables(t, d)
	ids := map[int]string{}
	var placed []Panel
	for _, p := range d.AllPanels() {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panel %q has the id of %q", p.Title, other)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v is off the 24-column grid", p.Title, g)
		}
		for _, o := range placed {
			if overlap(o.GridPos, g) {
				t.Errorf("panels %q and %q overlap", o.Title, p.Title)
			}
		}
		placed = append(placed, p)
		if p.Type != "row" {
			checkPanel(t, d, p)
		}
	}
}

func checkPanel(t *testing.T, d *Dashboard, p Panel) {
	if p.Title == "" || len(p.Targets) == 0 {
		t.Errorf("panel %d %q: needs a title and queries", p.ID, p.Title)
	}
	if !usesDatasourceVariable(p.Datasource) {
		t.Errorf("panel %q: data source %+v, want the ${datasource} variable", p.Title, p.Datasource)
	}
	refs := map[string]bool{}
	for _, tg := range p.Targets {
		if tg.RefID == "" || refs[tg.RefID] {
			t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
		}
		refs[tg.RefID] = true
		if !usesDatasourceVariable(tg.Datasource) {
			t.Errorf("panel %q %s: data source %+v, want the ${datasource} variable", p.Title, tg.RefID, tg.Datasource)
		}
		checkVariableUse(t, d, p.Title+" "+tg.RefID, tg.Expr)
	}
}

func usesDatasourceVariable(ds *Datasource) bool {
	return ds != nil && ds.Type == "prometheus" && ds.UID == "${datasource}"
}

// checkVariables: a Prometheus data source variable, and query variables
// of the label_values form that only use variables defined before them.
func checkVariables(t *testing.T, d *Dashboard) {
	ds, ok := d.Variable("datasource")
	if !ok || ds.Type != "datasource" || ds.QueryString() != "prometheus" {
		t.Errorf("no datasource variable of type prometheus: %+v", ds)
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		selector, _, err := LabelValues(v.QueryString())
		if err != nil {
			t.Error(err)
			continue
		}
		checkVariableUse(t, d, "variable "+v.Name, selector)
		for _, used := range VariablesIn(selector) {
			if used == v.Name {
				t.Errorf("variable %s refers to itself", v.Name)
			}
		}
	}
}

// regexUse matches a variable reference right after =~" (possibly after
// other text of the same regular expression).
var regexUse = regexp.MustCompile(`=~"[^"]*$`)

// checkVariableUse: every variable in expr is defined (or one of
// Grafana's), and multi-value ones sit in a =~ matcher.
func checkVariableUse(t *testing.T, d *Dashboard, what, expr string) {
	for _, loc := range variableRef.FindAllStringSubmatchIndex(expr, -1) {
		ref := expr[loc[0]:loc[1]]
		name := strings.Trim(ref, "${}[]")
		if slices.Contains([]string{"__rate_interval", "__interval", "__range"}, name) {
			continue
		}
		v, ok := d.Variable(name)
		if !ok {
			t.Errorf("%s: variable %s is not defined", what, ref)
			continue
		}
		if (v.Multi || v.IncludeAll) && !regexUse.MatchString(expr[:loc[0]]) {
			t.Errorf("%s: multi-value variable %s outside a =~ matcher", what, ref)
		}
	}
}

func overlap(a, b GridPos) bool {
	return a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H
}

// TestSubstitute: variables become what Grafana's Prometheus data source
// writes.
func TestSubstitute(t *testing.T) {
	values := map[string][]string{"instance": {"10.0.0.1:10249"}, "ip_family": {"IPv4", "IPv6"}}
	got, err := Substitute(`rate(x{instance=~"$instance", ip_family=~"${ip_family}"}[$__rate_interval])`, values, "90s")
	want := `rate(x{instance=~"10\\.0\\.0\\.1:10249", ip_family=~"(IPv4|IPv6)"}[90s])`
	if err != nil || got != want {
		t.Errorf("got %s, %v\nwant %s", got, err, want)
	}
	if _, err := Substitute(`x{a=~"$unknown"}`, values, "1m"); err == nil {
		t.Error("an unknown variable was substituted")
	}
}
