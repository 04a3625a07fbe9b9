package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value is the value of the one counter or gauge c collects (a Counter, a
// Gauge, or one child of a vector: WithLabelValues), read as a scrape
// reads it. It fails the test when c collects no series or several, or one
// that is neither.
func Value(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() { c.Collect(ch); close(ch) }()
	var collected []prometheus.Metric
	for m := range ch {
		collected = append(collected, m)
	}
	if len(collected) != 1 {
		t.Fatalf("%d series collected, want 1", len(collected))
	}
	var m dto.Metric
	if err := collected[0].Write(&m); err != nil {
		t.Fatal(err)
	}
	v, ok := value(&m)
	if !ok {
		t.Fatalf("%s: neither a counter nor a gauge", collected[0].Desc())
	}
	return v
}

// Served is the value of the series name{labels} that g serves (for a
// registry: what its /metrics shows), and whether g serves it at all.
// labels names every label of the series.
func Served(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if sameLabels(m.GetLabel(), labels) {
				v, ok := value(m)
				if !ok {
					t.Fatalf("%s: neither a counter nor a gauge", name)
				}
				return v, true
			}
		}
	}
	return 0, false
}

func value(m *dto.Metric) (float64, bool) {
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue(), true
	case m.Gauge != nil:
		return m.GetGauge().GetValue(), true
	case m.Untyped != nil:
		return m.GetUntyped().GetValue(), true
	}
	return 0, false
}

func sameLabels(pairs []*dto.LabelPair, want map[string]string) bool {
	if len(pairs) != len(want) {
		return false
	}
	for _, p := range pairs {
		if v, ok := want[p.GetName()]; !ok || v != p.GetValue() {
			return false
		}
	}
	return true
}
