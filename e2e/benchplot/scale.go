package main

import (
	"fmt"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
)

// measure is one series of a figure against the number of Services, per
// proxy; value returns false when the run did not measure it.
type measure struct {
	name   string
	dashed bool
	value  func(*benchdata.Run, benchdata.Proxy) (float64, bool)
}

func coldStartFigure(runs []*benchdata.Run) figure {
	return scaleFigure("cold-start.svg", "Cold start: process start → all rules in the kernel", runs, "time (log scale)", true,
		measure{"start → rules programmed", false, func(_ *benchdata.Run, p benchdata.Proxy) (float64, bool) {
			return p.ReadySeconds, p.ReadySeconds > 0
		}},
		measure{"restart, API unchanged", true, func(r *benchdata.Run, p benchdata.Proxy) (float64, bool) {
			return p.RestartReadySeconds, r.Config.Restart && p.RestartReadySeconds > 0
		}})
}

func changeCostFigure(runs []*benchdata.Run) figure {
	return scaleFigure("change-cost.svg", "Cost of a single change, proxy idle (medians)", runs, "time (log scale)", true,
		measure{"data path (API write → new pod answers)", false, func(_ *benchdata.Run, p benchdata.Proxy) (float64, bool) {
			xs := positive(p.IdleSeconds)
			if len(xs) == 0 {
				return 0, false
			}
			return quantile(xs, 0.5), true
		}},
		measure{"partial sync (own metric)", true, func(_ *benchdata.Run, p benchdata.Proxy) (float64, bool) {
			xs := positive(p.IdleSyncSeconds)
			if len(xs) == 0 {
				return 0, false
			}
			return quantile(xs, 0.5), true
		}})
}

func rssFigure(runs []*benchdata.Run) figure {
	return scaleFigure("peak-rss.svg", "Peak memory (RSS) of the proxy and its child processes", runs, "peak RSS (MB)", false,
		measure{"whole run, proxy + children (sampled)", false, func(_ *benchdata.Run, p benchdata.Proxy) (float64, bool) {
			return mb(max(p.PeakRSSTreeBytes, p.PeakRSSBytes)), p.PeakRSSBytes > 0
		}},
		measure{"restarted process, API unchanged", true, func(r *benchdata.Run, p benchdata.Proxy) (float64, bool) {
			return mb(p.RestartPeakRSSBytes), r.Config.Restart && p.RestartPeakRSSBytes > 0
		}})
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

// scaleFigure draws the measures of every proxy against the number of
// Services (log scale), one point per run.
func scaleFigure(file, title string, runs []*benchdata.Run, ylabel string, logY bool, ms ...measure) figure {
	p := plot.New()
	p.X.Label.Text = "Services (log scale)"
	p.Y.Label.Text = ylabel
	servicesAxis(&p.X, runs)
	p.Add(plotter.NewGrid())
	var legends []plot.Legend
	lo, hi := math.Inf(1), 0.0
	for _, proxy := range proxies(runs) {
		legend := plot.NewLegend()
		legend.Top, legend.Left = true, true
		legend.TextStyle.Font.Size = vg.Points(10)
		for _, m := range ms {
			var xys plotter.XYs
			for _, r := range runs {
				for _, px := range r.Proxies {
					if v, ok := m.value(r, px); px.Proxy == proxy && ok && v > 0 {
						xys = append(xys, plotter.XY{X: float64(r.Config.Services), Y: v})
						lo, hi = min(lo, v), max(hi, v)
					}
				}
			}
			if len(xys) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(xys)
			must(err)
			styleLine(line, points, proxy, m.dashed)
			p.Add(line, points)
			legend.Add(fmt.Sprintf("%s: %s", proxy, m.name), line, points)
		}
		legends = append(legends, legend)
	}
	if logY {
		decades(&p.Y, lo, hi, secondsLabel)
	} else {
		p.Y.Min, p.Y.Max = 0, max(hi, 1)*1.1
		p.Y.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
			ts := plot.DefaultTicks{}.Ticks(min, max)
			for i := range ts {
				if ts[i].Label != "" {
					ts[i].Label = fmt.Sprintf("%.0f", ts[i].Value)
				}
			}
			return ts
		})
	}
	return figure{file: file, width: 720, height: 400, heading: append([]string{title}, provenance(runs)...),
		plots: [][]*plot.Plot{{p}}, legends: legends}
}

// servicesAxis is a log axis with a tick at each run's number of
// Services and room either side.
func servicesAxis(a *plot.Axis, runs []*benchdata.Run) {
	var ticks []plot.Tick
	for _, r := range runs {
		ticks = append(ticks, plot.Tick{Value: float64(r.Config.Services), Label: fmtCount(r.Config.Services)})
	}
	a.Scale = plot.LogScale{}
	a.Min, a.Max = float64(runs[0].Config.Services)/2, float64(runs[len(runs)-1].Config.Services)*2
	a.Tick.Marker = plot.ConstantTicks(ticks)
}

// proxies are the proxies' names in the order the runs list them
// (nftproxy first).
func proxies(runs []*benchdata.Run) []string {
	var names []string
	seen := map[string]bool{}
	for _, r := range runs {
		for _, p := range r.Proxies {
			if !seen[p.Proxy] {
				seen[p.Proxy] = true
				names = append(names, p.Proxy)
			}
		}
	}
	return names
}
