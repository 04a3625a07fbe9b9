package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestValueAndServed(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "h"}, []string{"code"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "h"})
	reg.MustRegister(c, g)
	c.WithLabelValues("200").Add(3)
	g.Set(-2)
	if got := Value(t, c.WithLabelValues("200")); got != 3 {
		t.Errorf("Value(counter) = %v, want 3", got)
	}
	if got := Value(t, g); got != -2 {
		t.Errorf("Value(gauge) = %v, want -2", got)
	}
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   float64
		served bool
	}{
		{"c_total", map[string]string{"code": "200"}, 3, true},
		{"c_total", map[string]string{"code": "503"}, 0, false},
		{"c_total", nil, 0, false},
		{"g", nil, -2, true},
		{"absent", nil, 0, false},
	} {
		if v, ok := Served(t, reg, tt.name, tt.labels); v != tt.want || ok != tt.served {
			t.Errorf("Served(%s%v) = %v, %v; want %v, %v", tt.name, tt.labels, v, ok, tt.want, tt.served)
		}
	}
}
