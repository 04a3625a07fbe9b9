package monitoring

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// Dashboard is the part of a Grafana dashboard the tests read.
type Dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a Grafana panel or row (a collapsed row holds its panels).
type Panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *Datasource `json:"datasource"`
	GridPos    GridPos     `json:"gridPos"`
	Targets    []Target    `json:"targets"`
	Panels     []Panel     `json:"panels"`
}

// Datasource names a Grafana data source, here the dashboard's
// ${datasource} variable.
type Datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// GridPos places a panel on the dashboard's 24-column grid.
type GridPos struct {
	H int `json:"h"`
	W int `json:"w"`
	X int `json:"x"`
	Y int `json:"y"`
}

// Target is one query of a panel.
type Target struct {
	RefID        string      `json:"refId"`
	Expr         string      `json:"expr"`
	LegendFormat string      `json:"legendFormat"`
	Datasource   *Datasource `json:"datasource"`
}

// Variable is a template variable.
type Variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Multi      bool            `json:"multi"`
	IncludeAll bool            `json:"includeAll"`
	AllValue   string          `json:"allValue"`
}

// QueryString is the variable's query, which Grafana stores either as a
// string or as an object with a query field.
func (v Variable) QueryString() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var obj struct {
		Query string `json:"query"`
	}
	_ = json.Unmarshal(v.Query, &obj)
	return obj.Query
}

// AllPanels returns every panel, the ones inside collapsed rows included.
func (d *Dashboard) AllPanels() []Panel {
	var out []Panel
	var walk func([]Panel)
	walk = func(ps []Panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// Query is one PromQL query of a panel.
type Query struct {
	Panel string // the panel's title
	RefID string
	Expr  string // as written, Grafana variables and all
}

func (q Query) String() string { return fmt.Sprintf("%q %s", q.Panel, q.RefID) }

// Queries returns every panel's queries.
func (d *Dashboard) Queries() []Query {
	var out []Query
	for _, p := range d.AllPanels() {
		for _, t := range p.Targets {
			out = append(out, Query{Panel: p.Title, RefID: t.RefID, Expr: t.Expr})
		}
	}
	return out
}

// Variable returns the template variable called name.
func (d *Dashboard) Variable(name string) (Variable, bool) {
	for _, v := range d.Templating.List {
		if v.Name == name {
			return v, true
		}
	}
	return Variable{}, false
}

// variableRef matches $name, ${name} and [[name]].
var variableRef = regexp.MustCompile(`\$\{(\w+)\}|\$(\w+)|\[\[(\w+)\]\]`)

// VariablesIn returns the names of the variables expr refers to, Grafana's
// built-in ones ($__rate_interval…) included, in order, once each.
func VariablesIn(expr string) []string {
	var names []string
	seen := map[string]bool{}
	for _, m := range variableRef.FindAllStringSubmatch(expr, -1) {
		name := m[1] + m[2] + m[3]
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	return names
}

// Substitute replaces the variables in expr as Grafana's Prometheus data
// source does: a variable's values, regular-expression escaped, as one
// value or as (v1|v2|…); interval is what $__rate_interval, $__interval and
// $__range become (a PromQL duration such as "90s"). A variable without
// values is an error.
func Substitute(expr string, values map[string][]string, interval string) (string, error) {
	var missing []string
	out := variableRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		switch name {
		case "__rate_interval", "__interval", "__range":
			return interval
		}
		vs := values[name]
		if len(vs) == 0 {
			missing = append(missing, name)
			return ref
		}
		escaped := make([]string, len(vs))
		for i, v := range vs {
			// Escaped for the regular expression, then for the PromQL
			// string literal it sits in.
			escaped[i] = strings.ReplaceAll(regexp.QuoteMeta(v), `\`, `\\`)
		}
		if len(escaped) == 1 {
			return escaped[0]
		}
		return "(" + strings.Join(escaped, "|") + ")"
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("no value for variable(s) %v in %s", missing, expr)
	}
	return out, nil
}

// labelValuesQuery matches Grafana's label_values(selector, label).
var labelValuesQuery = regexp.MustCompile(`^\s*label_values\((.*),\s*(\w+)\s*\)\s*$`)

// LabelValues splits a variable query label_values(selector, label) into
// its series selector and label name.
func LabelValues(query string) (selector, label string, err error) {
	m := labelValuesQuery.FindStringSubmatch(query)
	if m == nil {
		return "", "", fmt.Errorf("variable query %q is not label_values(selector, label)", query)
	}
	return m[1], m[2], nil
}
