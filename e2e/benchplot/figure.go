package main

import (
	"fmt"
	"image/color"
	"os"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
)

func init() {
	// Sans-serif reads better at the sizes of a web page's figures.
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
}

// figure is one SVG file: a heading over a grid of plots.
type figure struct {
	file    string
	heading []string // lines: a title, then where the numbers come from
	plots   [][]*plot.Plot
	width   vg.Length // per column
	height  vg.Length // per row
	// legends are drawn side by side in a strip below the plots (one per
	// proxy), clear of the data.
	legends []plot.Legend
}

const headingLine vg.Length = 16 // points

func (f figure) save(path string) error {
	rows, cols := len(f.plots), len(f.plots[0])
	head := vg.Length(len(f.heading))*headingLine + 8
	strip := f.legendHeight()
	w, h := f.width*vg.Length(cols), f.height*vg.Length(rows)+head+strip
	c := vgsvg.New(w, h)
	dc := draw.New(c)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	for i, line := range f.heading {
		sty := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, 13), Handler: plot.DefaultTextHandler,
			XAlign: draw.XCenter, YAlign: draw.YTop}
		if i > 0 {
			sty.Font = font.From(plot.DefaultFont, 10)
		}
		dc.FillText(sty, vg.Point{X: w / 2, Y: h - 4 - vg.Length(i)*headingLine}, line)
	}
	body := draw.Crop(dc, 0, 0, strip, -head)
	for i := range f.legends {
		// Columns of equal width, the first one's text about where the
		// data area begins, right of the Y axis's labels.
		const indent = 50
		col := w / vg.Length(len(f.legends))
		lc := draw.Crop(dc, indent+vg.Length(i)*col, -(w - vg.Length(i+1)*col), 4, -(h - strip))
		f.legends[i].Draw(lc)
	}
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: 12, PadY: 12, PadTop: 4, PadBottom: 4, PadLeft: 4, PadRight: 8}
	canvases := plot.Align(f.plots, tiles, body)
	for i := range f.plots {
		for j, p := range f.plots[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// legendHeight is the height of the strip the legends need.
func (f figure) legendHeight() vg.Length {
	var most vg.Length
	for i := range f.legends {
		l := &f.legends[i]
		r := l.Rectangle(draw.Canvas{Rectangle: vg.Rectangle{Max: vg.Point{X: 1000, Y: 1000}}})
		most = max(most, r.Size().Y)
	}
	if most == 0 {
		return 0
	}
	return most + 12
}

// figures are every figure drawn from runs (ordered by size).
func figures(runs []*benchdata.Run) []figure {
	return []figure{latencyFigure(runs), coldStartFigure(runs), changeCostFigure(runs), rssFigure(runs)}
}

// provenance is the heading's lines under the title: when and at which
// commit, and first a warning when a run was a smoke run (too small to be
// a benchmark).
func provenance(runs []*benchdata.Run) []string {
	dates, commits := map[string]bool{}, map[string]bool{}
	var lines []string
	for _, r := range runs {
		dates[r.Date.UTC().Format(time.DateOnly)] = true
		c := "unknown commit"
		if r.Commit != "" {
			c = r.Commit[:min(7, len(r.Commit))]
			if r.Dirty {
				c += " (modified)"
			}
		}
		commits[c] = true
		if r.Config.Smoke && lines == nil {
			lines = append(lines, fmt.Sprintf("SMOKE RUN (%d Services × %d endpoints, %d changes): shows the pipeline, not a benchmark",
				r.Config.Services, r.Config.Endpoints, r.Config.Changes))
		}
	}
	return append(lines, fmt.Sprintf("e2e/cmd/bench, %s, at %s; the proxies one after the other on the same API state",
		strings.Join(keys(dates), ", "), strings.Join(keys(commits), ", ")))
}

func keys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
