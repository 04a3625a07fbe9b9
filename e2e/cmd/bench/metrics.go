package main

import (
	"context"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// A minimal reader of the Prometheus text format, enough for the proxies'
// /metrics: no timestamps, label values without newlines.

type sample struct {
	name   string
	labels map[string]string
	value  float64
}

type scrape []sample

// scrapeMetrics fetches http://127.0.0.1:10249/metrics inside the node.
func scrapeMetrics(node *testbed.Node) (scrape, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := node.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		return nil, err
	}
	return parseMetrics(body), nil
}

func parseMetrics(body string) scrape {
	var s scrape
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

func parseLine(line string) (sample, bool) {
	var smp sample
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return smp, false
	}
	smp.name = line[:i]
	rest := line[i:]
	if rest[0] == '{' {
		smp.labels = map[string]string{}
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
			smp.labels[key] = val.String()
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
	smp.value = v
	return smp, true
}

func (smp sample) matches(match map[string]string) bool {
	for k, v := range match {
		if smp.labels[k] != v {
			return false
		}
	}
	return true
}

// sum adds the values of every series of name whose labels include match;
// ok is false when there is no such series.
func (s scrape) sum(name string, match map[string]string) (total float64, ok bool) {
	for _, smp := range s {
		if smp.name == name && smp.matches(match) {
			total += smp.value
			ok = true
		}
	}
	return total, ok
}

// hist is a Prometheus histogram (possibly several series added up).
type hist struct {
	count, sum float64
	le, cum    []float64 // upper bounds (ascending, +Inf last) and cumulative counts
}

// histogram adds up the series of histogram name whose labels include match.
func (s scrape) histogram(name string, match map[string]string) (hist, bool) {
	var h hist
	buckets := map[float64]float64{}
	found := false
	for _, smp := range s {
		if !smp.matches(match) {
			continue
		}
		switch smp.name {
		case name + "_count":
			h.count += smp.value
			found = true
		case name + "_sum":
			h.sum += smp.value
		case name + "_bucket":
			le, err := strconv.ParseFloat(smp.labels["le"], 64)
			if err == nil {
				buckets[le] += smp.value
			}
		}
	}
	for le := range buckets {
		h.le = append(h.le, le)
	}
	sort.Float64s(h.le)
	for _, le := range h.le {
		h.cum = append(h.cum, buckets[le])
	}
	return h, found
}

// minus is h with o's observations taken out (same buckets).
func (h hist) minus(o hist) hist {
	d := hist{count: h.count - o.count, sum: h.sum - o.sum, le: h.le}
	for i := range h.cum {
		c := h.cum[i]
		if i < len(o.cum) {
			c -= o.cum[i]
		}
		d.cum = append(d.cum, c)
	}
	return d
}

// quantile estimates the q-quantile like PromQL's histogram_quantile: linear
// interpolation inside the bucket that holds it (from 0 for the first); in
// the +Inf bucket it returns the largest finite bound.
func (h hist) quantile(q float64) float64 {
	if h.count <= 0 || len(h.le) == 0 {
		return math.NaN()
	}
	rank := q * h.cum[len(h.cum)-1]
	for i, c := range h.cum {
		if c < rank {
			continue
		}
		if math.IsInf(h.le[i], 1) {
			if i == 0 {
				return math.NaN()
			}
			return h.le[i-1]
		}
		lo, prev := 0.0, 0.0
		if i > 0 {
			lo, prev = h.le[i-1], h.cum[i-1]
		}
		if c == prev {
			return h.le[i]
		}
		return lo + (h.le[i]-lo)*(rank-prev)/(c-prev)
	}
	return h.le[len(h.le)-1]
}

// counters are the values the benchmark compares between two moments.
type counters struct {
	syncs          float64 // kubeproxy_sync_proxy_rules_duration_seconds_count, all families
	syncHist       hist    // the same histogram, IPv4 (the Services' family)
	partial        hist    // kubeproxy_sync_partial_proxy_rules_duration_seconds, IPv4
	nft            bool    // the nftproxy_* metrics exist
	kernelOps      float64 // nftproxy_sync_kernel_operations_sum, all families
	events         float64 // nftproxy_api_events_total, all kinds
	ruleChanges    float64 // nftproxy_service_rule_changes_total, all families
	syncsByResult  map[string]float64
	syncsByResultK []string
}

var ipv4 = map[string]string{"ip_family": "IPv4"}

func readCounters(node *testbed.Node) (counters, error) {
	s, err := scrapeMetrics(node)
	if err != nil {
		return counters{}, err
	}
	var c counters
	all, _ := s.histogram("kubeproxy_sync_proxy_rules_duration_seconds", nil)
	c.syncs = all.count
	c.syncHist, _ = s.histogram("kubeproxy_sync_proxy_rules_duration_seconds", ipv4)
	c.partial, _ = s.histogram("kubeproxy_sync_partial_proxy_rules_duration_seconds", ipv4)
	c.kernelOps, c.nft = s.sum("nftproxy_sync_kernel_operations_sum", nil)
	c.events, _ = s.sum("nftproxy_api_events_total", nil)
	c.ruleChanges, _ = s.sum("nftproxy_service_rule_changes_total", nil)
	c.syncsByResult = map[string]float64{}
	for _, smp := range s {
		if smp.name == "nftproxy_syncs_total" {
			r := smp.labels["result"]
			if _, ok := c.syncsByResult[r]; !ok {
				c.syncsByResultK = append(c.syncsByResultK, r)
			}
			c.syncsByResult[r] += smp.value
		}
	}
	sort.Strings(c.syncsByResultK)
	return c, nil
}
