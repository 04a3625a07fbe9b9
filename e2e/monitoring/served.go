package monitoring

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
)

// Served is what one scrape of /metrics holds, as Prometheus stores it:
// the label sets of every sample name (a histogram's _bucket with le,
// _sum and _count).
type Served map[string][]map[string]string

// ParseExposition reads the text exposition format.
func ParseExposition(r io.Reader) (Served, error) {
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse /metrics: %w", err)
	}
	s := Served{}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			s.addMetric(name, mf.GetType(), m)
		}
	}
	return s, nil
}

func (s Served) addMetric(name string, typ dto.MetricType, m *dto.Metric) {
	base := map[string]string{}
	for _, l := range m.GetLabel() {
		base[l.GetName()] = l.GetValue()
	}
	with := func(k, v string) map[string]string {
		ls := maps(base)
		ls[k] = v
		return ls
	}
	switch typ {
	case dto.MetricType_HISTOGRAM:
		for _, b := range m.GetHistogram().GetBucket() {
			s[name+"_bucket"] = append(s[name+"_bucket"], with("le", formatFloat(b.GetUpperBound())))
		}
		s[name+"_bucket"] = append(s[name+"_bucket"], with("le", "+Inf"))
		s[name+"_sum"] = append(s[name+"_sum"], base)
		s[name+"_count"] = append(s[name+"_count"], base)
	case dto.MetricType_SUMMARY:
		for _, q := range m.GetSummary().GetQuantile() {
			s[name] = append(s[name], with("quantile", formatFloat(q.GetQuantile())))
		}
		s[name+"_sum"] = append(s[name+"_sum"], base)
		s[name+"_count"] = append(s[name+"_count"], base)
	default:
		s[name] = append(s[name], base)
	}
}

func maps(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

func formatFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// TargetLabels are the labels Prometheus adds to every series of a target
// (with the ServiceMonitor of deploy/monitoring, or the end-to-end test's
// static scrape configuration), and up is the series it writes itself.
var TargetLabels = []string{"job", "instance"}

// Check returns what of sel the scrape does not serve: the metric; a
// label a matcher or a grouping names (other than TargetLabels); a value
// an equality matcher asks for. Regular-expression matchers are checked
// for the label only: a dashboard's "5.." may well match nothing today.
func (s Served) Check(sel Selection) []Gap {
	if sel.Metric == "up" {
		return s.checkUp(sel)
	}
	series, ok := s[sel.Metric]
	if !ok {
		return []Gap{{Metric: sel.Metric}}
	}
	var gaps []Gap
	has := func(label string) bool {
		return slices.ContainsFunc(series, func(ls map[string]string) bool { _, ok := ls[label]; return ok })
	}
	for _, m := range sel.Matchers {
		if slices.Contains(TargetLabels, m.Name) || m.Matches("") {
			continue // a matcher that an absent label satisfies asks for nothing
		}
		if !has(m.Name) {
			gaps = append(gaps, Gap{Metric: sel.Metric, Label: m.Name})
			continue
		}
		if m.Type == labels.MatchEqual && !slices.ContainsFunc(series, func(ls map[string]string) bool { return ls[m.Name] == m.Value }) {
			gaps = append(gaps, Gap{Metric: sel.Metric, Label: m.Name, Value: m.Value})
		}
	}
	for _, g := range sel.Grouping {
		if !slices.Contains(TargetLabels, g) && !has(g) {
			gaps = append(gaps, Gap{Metric: sel.Metric, Label: g})
		}
	}
	return gaps
}

// checkUp: up has only the target labels.
func (s Served) checkUp(sel Selection) []Gap {
	var gaps []Gap
	for _, m := range sel.Matchers {
		if !slices.Contains(TargetLabels, m.Name) && !m.Matches("") {
			gaps = append(gaps, Gap{Metric: "up", Label: m.Name})
		}
	}
	for _, g := range sel.Grouping {
		if !slices.Contains(TargetLabels, g) {
			gaps = append(gaps, Gap{Metric: "up", Label: g})
		}
	}
	return gaps
}

// Names returns the sample names served, sorted.
func (s Served) Names() []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Gap is something a query reads that a scrape does not serve: a metric
// (Label empty), a label of it (Value empty) or a value of that label.
type Gap struct {
	Metric, Label, Value string
}

func (g Gap) String() string {
	switch {
	case g.Label == "":
		return fmt.Sprintf("metric %s not served", g.Metric)
	case g.Value == "":
		return fmt.Sprintf("%s has no label %s", g.Metric, g.Label)
	}
	return fmt.Sprintf("%s has no series with %s=%q", g.Metric, g.Label, g.Value)
}

// LabelValues returns the values label takes on the series sel selects,
// sorted, as Grafana's label_values(selector, label) lists them (target
// labels aside: they are not in a scrape).
func (s Served) LabelValues(sel Selection, label string) []string {
	var values []string
	for _, ls := range s[sel.Metric] {
		if v, ok := ls[label]; ok && matchesAll(sel.Matchers, ls) && !slices.Contains(values, v) {
			values = append(values, v)
		}
	}
	slices.Sort(values)
	return values
}

// matchesAll reports whether ls satisfies every matcher that is not on a
// target label.
func matchesAll(ms []*labels.Matcher, ls map[string]string) bool {
	for _, m := range ms {
		if !slices.Contains(TargetLabels, m.Name) && !m.Matches(ls[m.Name]) {
			return false
		}
	}
	return true
}
