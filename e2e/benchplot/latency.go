package main

import (
	"fmt"
	"math"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
)

// condition is one column of the latency figure.
type condition struct {
	name      string
	latencies func(benchdata.Proxy) []float64
	changes   func(benchdata.Config) int
}

var conditions = []condition{
	{"idle", func(p benchdata.Proxy) []float64 { return p.IdleSeconds }, func(c benchdata.Config) int { return c.Changes }},
	{"under churn", func(p benchdata.Proxy) []float64 { return p.ChurnSeconds }, func(c benchdata.Config) int { return c.ChurnChanges }},
}

// latencyFigure is single-change latency in the data path: a row per
// number of Services, idle and under churn side by side, an empirical
// CDF per proxy. Every panel has the same time axis, so that rows and
// columns compare by eye.
func latencyFigure(runs []*benchdata.Run) figure {
	lo, hi := math.Inf(1), 0.0
	for _, r := range runs {
		for _, p := range r.Proxies {
			for _, c := range conditions {
				for _, s := range c.latencies(p) {
					if s > 0 {
						lo, hi = min(lo, s), max(hi, s)
					}
				}
			}
		}
	}
	f := figure{file: "latency.svg", width: 400, height: 270, heading: append([]string{
		"Single change (an EndpointSlice update) → visible in the data path"}, provenance(runs)...)}
	for _, r := range runs {
		var row []*plot.Plot
		for _, c := range conditions {
			row = append(row, latencyPlot(r, c, lo, hi))
		}
		f.plots = append(f.plots, row)
	}
	return f
}

func latencyPlot(r *benchdata.Run, c condition, lo, hi float64) *plot.Plot {
	p := plot.New()
	rate := ""
	if c.name == "under churn" {
		rate = fmt.Sprintf(" of %.0f updates/s", r.Config.ChurnRate)
	}
	p.Title.Text = fmt.Sprintf("%s Services × %d endpoints\n%s%s, %d changes",
		fmtCount(r.Config.Services), r.Config.Endpoints, c.name, rate, c.changes(r.Config))
	p.X.Label.Text = "latency (log scale)"
	p.Y.Label.Text = "fraction of changes ≤ latency"
	decades(&p.X, lo, hi, secondsLabel)
	// Room above 1 for the legend, clear of the curves.
	p.Y.Min, p.Y.Max = 0, 1.4
	p.Y.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 0, Label: "0"}, {Value: 0.25}, {Value: 0.5, Label: "0.5"}, {Value: 0.75}, {Value: 1, Label: "1"}})
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	for _, px := range r.Proxies {
		xs := positive(c.latencies(px))
		if len(xs) == 0 {
			continue
		}
		line, points := ecdf(xs)
		styleLine(line, points, px.Proxy, false)
		p.Add(line, points)
		p.Legend.Add(fmt.Sprintf("%s: p50 %s, max %s", px.Proxy, fmtSeconds(quantile(xs, 0.5)), fmtSeconds(quantile(xs, 1))), line, points)
	}
	return p
}

// ecdf is the empirical CDF of xs as a step line and its points.
func ecdf(xs []float64) (*plotter.Line, *plotter.Scatter) {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := float64(len(s))
	steps := plotter.XYs{{X: s[0], Y: 0}}
	var pts plotter.XYs
	for i, x := range s {
		steps = append(steps, plotter.XY{X: x, Y: float64(i+1) / n})
		pts = append(pts, plotter.XY{X: x, Y: float64(i+1) / n})
	}
	line, err := plotter.NewLine(steps)
	must(err)
	line.StepStyle = plotter.PostStep
	scatter, err := plotter.NewScatter(pts)
	must(err)
	return line, scatter
}

// positive is xs without the values a log axis cannot show.
func positive(xs []float64) []float64 {
	var ps []float64
	for _, x := range xs {
		if x > 0 {
			ps = append(ps, x)
		}
	}
	return ps
}

// quantile is the q-quantile of xs by nearest rank, as the bench's table.
func quantile(xs []float64, q float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	k := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// must panics on errors that only a bug can cause (plotter constructors
// reject NaN and Inf, which the callers filter out).
func must(err error) {
	if err != nil {
		panic(err)
	}
}
