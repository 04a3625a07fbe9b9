package main

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// proxyColor keeps each proxy's colour the same in every figure.
func proxyColor(proxy string) color.Color {
	switch proxy {
	case "nftproxy":
		return color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // blue
	case "kube-proxy":
		return color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // red
	}
	return color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
}

// styleLine colours a series by proxy; dashed marks a second measure of
// the same proxy.
func styleLine(l *plotter.Line, s *plotter.Scatter, proxy string, dashed bool) {
	c := proxyColor(proxy)
	l.Color, l.Width = c, vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	}
	if s != nil {
		s.Color, s.Radius = c, vg.Points(2.5)
		s.Shape = draw.CircleGlyph{}
		if dashed {
			s.Shape = draw.BoxGlyph{}
		}
	}
}

// fmtSeconds prints a time with a unit and 2–3 significant digits.
func fmtSeconds(s float64) string {
	switch {
	case s < 1e-3:
		return fmt.Sprintf("%.3g µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.3g ms", s*1e3)
	case s < 100:
		return fmt.Sprintf("%.3g s", s)
	default:
		return fmt.Sprintf("%.0f s", s)
	}
}

// decades sets a log axis to whole powers of ten around [lo, hi] with
// ticks labelled by label (major at each power, minor at 2…9 times it).
func decades(a *plot.Axis, lo, hi float64, label func(float64) string) {
	if !(lo > 0 && lo <= hi && !math.IsInf(hi, 1)) { // nothing to show: any range
		lo, hi = 1e-3, 1
	}
	first, last := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if last <= first {
		last = first + 1
	}
	a.Scale = plot.LogScale{}
	a.Min, a.Max = math.Pow(10, first), math.Pow(10, last)
	// Over one or two decades, 2× and 5× are labelled too: the powers
	// of ten alone leave the values hard to read.
	few := last-first <= 2
	a.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
		var ts []plot.Tick
		for e := first; e <= last; e++ {
			p := math.Pow(10, e)
			ts = append(ts, plot.Tick{Value: p, Label: label(p)})
			for k := 2.0; k < 10 && e < last; k++ {
				t := plot.Tick{Value: k * p}
				if few && (k == 2 || k == 5) {
					t.Label = label(k * p)
				}
				ts = append(ts, t)
			}
		}
		return ts
	})
}

// secondsLabel names a tick of a time axis: 1, 2 or 5 times a power of
// ten of seconds.
func secondsLabel(p float64) string {
	switch {
	case p < 1e-3:
		return fmt.Sprintf("%.0f µs", p*1e6)
	case p < 1:
		return fmt.Sprintf("%.0f ms", p*1e3)
	default:
		return fmt.Sprintf("%.0f s", p)
	}
}

// fmtCount prints a number of Services: 50, 1,000, 100,000.
func fmtCount(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
