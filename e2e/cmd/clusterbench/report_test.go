package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{1, math.Inf(1), 2}, 2},
		{[]float64{7}, 7},
	} {
		if got := median(tc.in); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if !math.IsNaN(median(nil)) {
		t.Error("median of nothing is not NaN")
	}
}

// TestQuantile: arrivals' quantiles over every watcher or the real nodes
// only; a watcher that never arrived counts as infinitely late.
func TestQuantile(t *testing.T) {
	arr := []arrival{
		{Node: "hollow-0", After: 3 * time.Second},
		{Node: "hollow-1", After: time.Second},
		{Node: "hollow-2", Missing: true},
		{Node: "r1", Real: true, After: 2 * time.Second},
	}
	for _, tc := range []struct {
		q    float64
		real bool
		want float64
	}{
		{0.5, false, 2},
		{0.75, false, 3},
		{1, false, math.Inf(1)},
		{1, true, 2},
		{0.5, true, 2},
	} {
		if got := quantile(arr, tc.q, tc.real); got != tc.want {
			t.Errorf("quantile(q=%v, real=%v) = %v, want %v", tc.q, tc.real, got, tc.want)
		}
	}
	if got := quantile(arr[:1], 0.5, true); !math.IsNaN(got) {
		t.Errorf("quantile of no real node = %v, want NaN", got)
	}
}

// TestMarkdown: every phase's table has a column per proxy and their ratio,
// each figure the median of the runs, and rewriteDoc replaces only what is
// between the markers.
func TestMarkdown(t *testing.T) {
	c := defaultConfig()
	run := func(start, cpu float64) []columnResult {
		var cols []columnResult
		for i, name := range c.Columns {
			f := float64(i + 1)
			col := columnResult{Name: name}
			col.Start = phaseResult{Arrivals: []arrival{{Node: "r1", Real: true, After: time.Duration(start*f) * time.Second}},
				API: apiCost{CPUSeconds: cpu * f, PeakRSS: 500e6}}
			col.Churn.SLI = sli{Samples: 10, P50: 0.5 * f, P90: 0.9, P99: 1}
			cols = append(cols, col)
		}
		return cols
	}
	r := &results{Config: c, Machine: "test", Runs: [][]columnResult{run(1, 10), run(3, 30), run(2, 20)}}
	md := r.markdown()
	for _, want := range []string{
		"| | nftproxy | kube-proxy | kube-proxy / nftproxy |",
		"| real nodes' data path: median | 2.00 s | 4.00 s | 2.00× |",
		"| API server CPU | 20.0 s | 40.0 s | 2.00× |",
		"| NetworkProgrammingLatency p50 | 0.50 s | 1.00 s | 2.00× |",
		"the median of 3 runs",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("tables lack %q:\n%s", want, md)
		}
	}
	doc := filepath.Join(t.TempDir(), "scale.md")
	if err := os.WriteFile(doc, []byte("before\n"+docBegin+"\nold\n"+docEnd+"\nafter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.rewriteDoc(doc); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(doc)
	if s := string(got); !strings.HasPrefix(s, "before\n"+docBegin+"\n") || !strings.HasSuffix(s, docEnd+"\nafter\n") ||
		strings.Contains(s, "old") || !strings.Contains(s, md) {
		t.Errorf("rewritten page:\n%s", s)
	}
}
