package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
)

// syntheticRun is a run of n Services; kube-proxy's numbers are k times
// nftproxy's, and every latency list differs by n so that each legend
// (which quotes p50 and max) is unique in the figure.
func syntheticRun(n int, k float64, withUpstream bool) *benchdata.Run {
	f := float64(n) / 1000
	proxy := func(name string, m float64) benchdata.Proxy {
		return benchdata.Proxy{Proxy: name,
			ReadySeconds: 0.1 * f * m, RestartReadySeconds: 0.09 * f * m,
			IdleSeconds:     []float64{0.004 * f * m, 0.005 * f * m, 0.006 * f * m},
			ChurnSeconds:    []float64{0.2 * f * m, 0.3 * f * m, 0.9 * f * m},
			IdleSyncSeconds: []float64{0.001 * f * m, 0.002 * f * m, 0.003 * f * m},
			PeakRSSBytes:    int64(30*m) << 20, PeakRSSTreeBytes: int64(31*m) << 20, RestartPeakRSSBytes: int64(29*m) << 20,
		}
	}
	r := &benchdata.Run{Version: benchdata.Version, Date: time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC), Commit: "0123456789abcdef",
		Config:  benchdata.Config{Services: n, Endpoints: 5, Changes: 3, ChurnChanges: 3, ChurnRate: 50, Restart: true},
		Proxies: []benchdata.Proxy{proxy("nftproxy", 1)}}
	if withUpstream {
		r.Proxies = append(r.Proxies, proxy("kube-proxy", k))
	}
	return r
}

// TestPlots draws from a synthetic run of 1,000 and 10,000 Services with
// both proxies and 100,000 with nftproxy alone, and checks that each
// figure is well-formed SVG and shows every series it should, by its
// legend (and every panel, by its title).
func TestPlots(t *testing.T) {
	in, out := t.TempDir(), t.TempDir()
	for _, r := range []*benchdata.Run{syntheticRun(1000, 100, true), syntheticRun(10000, 300, true), syntheticRun(100000, 0, false)} {
		if err := benchdata.Write(filepath.Join(in, fmt.Sprintf("bench-%d.json", r.Config.Services)), r); err != nil {
			t.Fatal(err)
		}
	}
	written, err := run(out, []string{in})
	if err != nil {
		t.Fatal(err)
	}
	if len(written) != 4 {
		t.Errorf("wrote %v, want 4 files", written)
	}
	want := map[string][]string{
		"latency.svg": {
			"nftproxy: p50 5 ms, max 6 ms", "kube-proxy: p50 500 ms, max 600 ms", // 1,000, idle
			"nftproxy: p50 300 ms, max 900 ms", "kube-proxy: p50 30 s, max 90 s", // 1,000, churn
			"nftproxy: p50 50 ms, max 60 ms", "kube-proxy: p50 15 s, max 18 s", // 10,000, idle
			"nftproxy: p50 3 s, max 9 s", "kube-proxy: p50 900 s, max 2700 s", // 10,000, churn
			"nftproxy: p50 500 ms, max 600 ms", "nftproxy: p50 30 s, max 90 s", // 100,000
		},
		"cold-start.svg": {"nftproxy: start → rules programmed", "nftproxy: restart, API unchanged",
			"kube-proxy: start → rules programmed", "kube-proxy: restart, API unchanged"},
		"change-cost.svg": {"nftproxy: data path (API write → new pod answers)", "nftproxy: partial sync (own metric)",
			"kube-proxy: data path (API write → new pod answers)", "kube-proxy: partial sync (own metric)"},
		"peak-rss.svg": {"nftproxy: whole run, proxy + children (sampled)", "nftproxy: restarted process, API unchanged",
			"kube-proxy: whole run, proxy + children (sampled)", "kube-proxy: restarted process, API unchanged"},
	}
	// Axis labels and ticks, in every panel.
	labels := map[string][]string{
		"latency.svg": {"1,000 Services × 5 endpoints", "10,000 Services × 5 endpoints", "100,000 Services × 5 endpoints",
			"idle, 3 changes", "under churn of 50 updates/s, 3 changes", "fraction of changes ≤ latency", "latency (log scale)", "1 ms", "10 s"},
		"cold-start.svg":  {"Services (log scale)", "time (log scale)", "1,000", "10,000", "100,000"},
		"change-cost.svg": {"Services (log scale)", "time (log scale)", "1,000", "10,000", "100,000"},
		"peak-rss.svg":    {"Services (log scale)", "peak RSS (MB)", "1,000", "10,000", "100,000"},
	}
	for file, texts := range want {
		got := svgTexts(t, filepath.Join(out, file))
		for _, w := range texts {
			if n := got[w]; n != 1 {
				t.Errorf("%s: %q shown %d times, want once", file, w, n)
			}
		}
		for _, w := range labels[file] {
			if got[w] == 0 {
				t.Errorf("%s: %q not shown", file, w)
			}
		}
		if t.Failed() {
			t.Logf("%s: texts %v", file, got)
		}
	}
}

// svgTexts parses an SVG file and counts the strings of its <text>
// elements.
func svgTexts(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	texts := map[string]int{}
	d := xml.NewDecoder(f)
	inText := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: not well-formed: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			inText = tok.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts[strings.TrimSpace(string(tok))]++
			}
		case xml.EndElement:
			inText = false
		}
	}
	return texts
}

// TestSmokeRunIsLabelled: figures drawn from a smoke run say so.
func TestSmokeRunIsLabelled(t *testing.T) {
	r := syntheticRun(50, 10, true)
	r.Config.Smoke = true
	if got := provenance([]*benchdata.Run{r}); !strings.HasPrefix(got[0], "SMOKE RUN (50 Services × 5 endpoints, 3 changes)") {
		t.Errorf("provenance %q does not say it is a smoke run", got)
	}
	if got := provenance([]*benchdata.Run{syntheticRun(50, 10, true)}); strings.Contains(strings.Join(got, " "), "SMOKE") {
		t.Errorf("provenance %q calls a run that is not a smoke run one", got)
	}
}

// TestOneRunPerSize: two documents of the same size are two runs.
func TestOneRunPerSize(t *testing.T) {
	in := t.TempDir()
	for _, name := range []string{"a.json", "b.json"} {
		if err := benchdata.Write(filepath.Join(in, name), syntheticRun(1000, 10, true)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := run(t.TempDir(), []string{in}); err == nil || !strings.Contains(err.Error(), "both runs of 1000 Services") {
		t.Errorf("err = %v, want two runs of 1000 Services refused", err)
	}
}

// TestNothingMeasured: a run whose lists are empty and values zero (a
// proxy that measured nothing) still draws every figure.
func TestNothingMeasured(t *testing.T) {
	in := t.TempDir()
	r := syntheticRun(1000, 10, true)
	for i := range r.Proxies {
		r.Proxies[i] = benchdata.Proxy{Proxy: r.Proxies[i].Proxy}
	}
	if err := benchdata.Write(filepath.Join(in, "empty.json"), r); err != nil {
		t.Fatal(err)
	}
	written, err := run(t.TempDir(), []string{in})
	if err != nil || len(written) != 4 {
		t.Fatalf("wrote %v: %v", written, err)
	}
}
