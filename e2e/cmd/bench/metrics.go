package main

import (
	"context"
	"sort"
	"time"

	"github.com/nftproxy/nftproxy/e2e/promtext"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// scrapeMetrics fetches http://127.0.0.1:10249/metrics inside the node.
func scrapeMetrics(node *testbed.Node) (promtext.Scrape, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := node.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		return nil, err
	}
	return promtext.Parse(body), nil
}

// counters are the values the benchmark compares between two moments.
type counters struct {
	syncs          float64       // kubeproxy_sync_proxy_rules_duration_seconds_count, all families
	syncHist       promtext.Hist // the same histogram, IPv4 (the Services' family)
	partial        promtext.Hist // kubeproxy_sync_partial_proxy_rules_duration_seconds, IPv4
	nft            bool          // the nftproxy_* metrics exist
	kernelOps      float64       // nftproxy_sync_kernel_operations_sum, all families
	events         float64       // nftproxy_api_events_total, all kinds
	ruleChanges    float64       // nftproxy_service_rule_changes_total, all families
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
	all, _ := s.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", nil)
	c.syncs = all.Count
	c.syncHist, _ = s.Histogram("kubeproxy_sync_proxy_rules_duration_seconds", ipv4)
	c.partial, _ = s.Histogram("kubeproxy_sync_partial_proxy_rules_duration_seconds", ipv4)
	c.kernelOps, c.nft = s.Sum("nftproxy_sync_kernel_operations_sum", nil)
	c.events, _ = s.Sum("nftproxy_api_events_total", nil)
	c.ruleChanges, _ = s.Sum("nftproxy_service_rule_changes_total", nil)
	c.syncsByResult = map[string]float64{}
	for _, smp := range s {
		if smp.Name == "nftproxy_syncs_total" {
			r := smp.Labels["result"]
			if _, ok := c.syncsByResult[r]; !ok {
				c.syncsByResultK = append(c.syncsByResultK, r)
			}
			c.syncsByResult[r] += smp.Value
		}
	}
	sort.Strings(c.syncsByResultK)
	return c, nil
}
