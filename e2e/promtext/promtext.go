// Package promtext is a minimal reader of the Prometheus text format, enough
// for the metrics the benchmarks read (the proxies', the API server's): no
// timestamps, label values without newlines; sums of series, histograms and
// their quantiles as PromQL's histogram_quantile estimates them.
package promtext

import (
	"math"
	"sort"
	"strconv"
	"strings"
)

type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Scrape is every sample of one exposition, in order.
type Scrape []Sample

// Parse reads an exposition; lines it cannot read are skipped.
func Parse(body string) Scrape {
	var s Scrape
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		smp, ok := parseLine(line)
		if ok {
			s = append(s, smp)
		}
	}
	return s
}

func parseLine(line string) (Sample, bool) {
	var smp Sample
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return smp, false
	}
	smp.Name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		smp.Labels = map[string]string{}
		j := 1
		for {
			for j < len(rest) && (rest[j] == ',' || rest[j] == ' ') {
				j++
			}
			if j >= len(rest) {
				return smp, false
			}
			if rest[j] == '}' {
				j++
				break
			}
			eq := strings.IndexByte(rest[j:], '=')
			if eq < 0 || j+eq+1 >= len(rest) || rest[j+eq+1] != '"' {
				return smp, false
			}
			key := rest[j : j+eq]
			j += eq + 2
			var val strings.Builder
			for j < len(rest) && rest[j] != '"' {
				if rest[j] == '\\' && j+1 < len(rest) {
					j++
					switch rest[j] {
					case 'n':
						val.WriteByte('\n')
					default:
						val.WriteByte(rest[j])
					}
				} else {
					val.WriteByte(rest[j])
				}
				j++
			}
			if j >= len(rest) {
				return smp, false
			}
			j++ // closing quote
			smp.Labels[key] = val.String()
		}
		rest = rest[j:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return smp, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return smp, false
	}
	smp.Value = v
	return smp, true
}

func (smp Sample) matches(match map[string]string) bool {
	for k, v := range match {
		if smp.Labels[k] != v {
			return false
		}
	}
	return true
}

// Sum adds the values of every series of name whose labels include match;
// ok is false when there is no such series.
func (s Scrape) Sum(name string, match map[string]string) (total float64, ok bool) {
	for _, smp := range s {
		if smp.Name == name && smp.matches(match) {
			total += smp.Value
			ok = true
		}
	}
	return total, ok
}

// Hist is a Prometheus histogram (possibly several series added up).
type Hist struct {
	Count, Sum float64
	Le, Cum    []float64 // upper bounds (ascending, +Inf last) and cumulative counts
}

// Histogram adds up the series of histogram name whose labels include match.
func (s Scrape) Histogram(name string, match map[string]string) (Hist, bool) {
	var h Hist
	buckets := map[float64]float64{}
	found := false
	for _, smp := range s {
		if !smp.matches(match) {
			continue
		}
		switch smp.Name {
		case name + "_count":
			h.Count += smp.Value
			found = true
		case name + "_sum":
			h.Sum += smp.Value
		case name + "_bucket":
			le, err := strconv.ParseFloat(smp.Labels["le"], 64)
			if err == nil {
				buckets[le] += smp.Value
			}
		}
	}
	for le := range buckets {
		h.Le = append(h.Le, le)
	}
	sort.Float64s(h.Le)
	for _, le := range h.Le {
		h.Cum = append(h.Cum, buckets[le])
	}
	return h, found
}

// Minus is h with o's observations taken out (same buckets).
func (h Hist) Minus(o Hist) Hist {
	d := Hist{Count: h.Count - o.Count, Sum: h.Sum - o.Sum, Le: h.Le}
	for i := range h.Cum {
		c := h.Cum[i]
		if i < len(o.Cum) {
			c -= o.Cum[i]
		}
		d.Cum = append(d.Cum, c)
	}
	return d
}

// Quantile estimates the q-quantile like PromQL's histogram_quantile: linear
// interpolation inside the bucket that holds it (from 0 for the first); in
// the +Inf bucket it returns the largest finite bound.
func (h Hist) Quantile(q float64) float64 {
	if h.Count <= 0 || len(h.Le) == 0 {
		return math.NaN()
	}
	rank := q * h.Cum[len(h.Cum)-1]
	for i, c := range h.Cum {
		if c < rank {
			continue
		}
		if math.IsInf(h.Le[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.Le[i-1]
		}
		lo, prev := 0.0, 0.0
		if i > 0 {
			lo, prev = h.Le[i-1], h.Cum[i-1]
		}
		if c == prev {
			return h.Le[i]
		}
		return lo + (h.Le[i]-lo)*(rank-prev)/(c-prev)
	}
	return h.Le[len(h.Le)-1]
}

// Plus is h with o's observations added (same buckets; either may be
// empty).
func (h Hist) Plus(o Hist) Hist {
	if len(h.Le) == 0 {
		return o
	}
	d := Hist{Count: h.Count + o.Count, Sum: h.Sum + o.Sum, Le: h.Le}
	for i := range h.Cum {
		c := h.Cum[i]
		if i < len(o.Cum) {
			c += o.Cum[i]
		}
		d.Cum = append(d.Cum, c)
	}
	return d
}
