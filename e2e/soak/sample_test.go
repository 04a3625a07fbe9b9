package soak

import (
	"context"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// A soak sample: the proxy's resident memory, its live heap right after a
// collection, and its goroutines.
type soakSample struct {
	at               time.Duration // since the soak began
	rss, live, gorts float64
}

// sample reads the proxy's figures about forty times over d, then closes
// stop.
func sample(t *testing.T, n *testbed.Node, d time.Duration, stop chan<- struct{}) []soakSample {
	t.Helper()
	every := min(max(d/40, 5*time.Second), time.Minute)
	start := time.Now()
	var out []soakSample
	for time.Since(start) < d {
		time.Sleep(every)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		// A heap profile with gc=1 collects first: the heap figure read
		// next is what is live.
		_, err := n.HTTPGet(ctx, "http://127.0.0.1:10249/debug/pprof/heap?gc=1")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		s := soakSample{at: time.Since(start)}
		for _, m := range []struct {
			name string
			v    *float64
		}{
			{"process_resident_memory_bytes", &s.rss},
			{"go_memstats_heap_alloc_bytes", &s.live},
			{"go_goroutines", &s.gorts},
		} {
			if *m.v, err = testbed.Metric(n.Netns, m.name); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("SOAK sample %v: RSS %.1f MB, live heap %.1f MB, %v goroutines", s.at.Round(time.Second), s.rss/1e6, s.live/1e6, s.gorts)
		out = append(out, s)
	}
	close(stop)
	return out
}

// judge fits a line to each figure after a warm-up (the first fifth) and
// fails the test if one grows: over the rest of the soak, the fitted
// growth may not exceed a small allowance for noise (a collection's
// sawtooth, a few goroutines of the informers coming and going).
func judge(t *testing.T, samples []soakSample, d time.Duration) {
	t.Helper()
	if len(samples) < 10 {
		t.Fatalf("%d samples: too few to judge", len(samples))
	}
	rest := samples[len(samples)/5:]
	window := rest[len(rest)-1].at - rest[0].at
	for _, f := range []struct {
		name      string
		get       func(soakSample) float64
		unit      float64
		unitName  string
		allowance func(mean float64) float64
	}{
		{"RSS", func(s soakSample) float64 { return s.rss }, 1e6, "MB", func(m float64) float64 { return 10e6 + 0.1*m }},
		{"live heap", func(s soakSample) float64 { return s.live }, 1e6, "MB", func(m float64) float64 { return 2e6 + 0.05*m }},
		{"goroutines", func(s soakSample) float64 { return s.gorts }, 1, "", func(float64) float64 { return 5 }},
	} {
		slope, mean := fit(rest, f.get) // per second
		growth := slope * window.Seconds()
		t.Logf("SOAK %s: mean %.1f%s, slope %+.2f%s/h, fitted growth %+.2f%s over %v",
			f.name, mean/f.unit, f.unitName, slope*3600/f.unit, f.unitName, growth/f.unit, f.unitName, window.Round(time.Second))
		if growth > f.allowance(mean) {
			t.Errorf("%s grows: %+.2f%s over %v of a %v soak", f.name, growth/f.unit, f.unitName, window.Round(time.Second), d)
		}
	}
}

// fit returns the least-squares slope (per second) and the mean of get over
// samples.
func fit(samples []soakSample, get func(soakSample) float64) (slope, mean float64) {
	var sx, sy, sxx, sxy float64
	n := float64(len(samples))
	for _, s := range samples {
		x, y := s.at.Seconds(), get(s)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx), sy / n
}

// TestFit: the fit finds a slope that is there and none where there is
// none. (No test bed needed.)
func TestFit(t *testing.T) {
	var flat, rising []soakSample
	for i := range 20 {
		at := time.Duration(i) * 10 * time.Second
		flat = append(flat, soakSample{at: at, rss: 50e6 + float64(i%2)*1e6})
		rising = append(rising, soakSample{at: at, rss: 50e6 + float64(i)*1e5})
	}
	rss := func(s soakSample) float64 { return s.rss }
	// A sawtooth of 1 MB fits a growth well under it over the window.
	if slope, _ := fit(flat, rss); slope*190 > 0.5e6 || slope*190 < -0.5e6 {
		t.Errorf("flat: slope %v/s", slope)
	}
	if slope, mean := fit(rising, rss); slope < 9.9e3 || slope > 10.1e3 || mean < 50e6 {
		t.Errorf("rising 10 kB/s: slope %v/s, mean %v", slope, mean)
	}
}
