package main

import (
	"context"
	"fmt"
	"time"
)

// Listing the node's ruleset while the proxy commits: every commit makes
// a dump under way start over (docs/operations.md, "A busy node"), so a
// proxy that commits faster than a listing takes keeps `nft list` from
// ever finishing.

// listings is the number of listings timed, idle and under churn.
const listings = 5

// listTimeout bounds one listing under churn: twenty times its idle time,
// or a minute, whichever is more. A listing that takes longer counts as
// unfinished.
func listTimeout(idle time.Duration) time.Duration { return max(time.Minute, 20*idle) }

// proxyTable is the table a proxy of kind writes.
func proxyTable(kind string) string {
	if kind == "nftproxy" {
		return "nftproxy"
	}
	return "kube-proxy"
}

// listTable times `nft list table ip <table>` in the proxy's node, once,
// and reports whether it finished within limit.
func (s *started) listTable(limit time.Duration) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	_, err := s.node.Exec(ctx, "nft", "list", "table", "ip", proxyTable(s.kind))
	d := time.Since(start)
	if err != nil && ctx.Err() == nil {
		fmt.Printf("nft list table failed: %v\n", err)
	}
	return d, err == nil
}

// listIdle times listings of the proxy's table on the idle node.
func (b *bench) listIdle(s *started, r *result) {
	for range listings {
		d, ok := s.listTable(10 * time.Minute)
		if !ok {
			b.tb.Fatalf("%s: nft list table failed on the idle node", s.kind)
		}
		r.listIdle = append(r.listIdle, d)
	}
	fmt.Printf("nft list table ip %s, idle: median %v\n", proxyTable(s.kind), pct(r.listIdle, 0.5).Round(time.Millisecond))
}

// listUnderChurn times listings of the proxy's table one after the other,
// while single changes are timed (the change latency a listing costs).
// The churn must be running.
func (b *bench) listUnderChurn(s *started, r *result) {
	limit := listTimeout(pct(r.listIdle, 0.5))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range listings {
			d, ok := s.listTable(limit)
			if !ok {
				r.listTimeouts++
			}
			r.listChurn = append(r.listChurn, d)
		}
	}()
	for {
		select {
		case <-done:
			fmt.Printf("nft list table ip %s under churn: %v (%d of %d unfinished after %v); changes meanwhile p50 %v max %v\n",
				proxyTable(s.kind), roundAll(r.listChurn), r.listTimeouts, listings, limit,
				pct(r.churnListing, 0.5), pct(r.churnListing, 1))
			return
		default:
		}
		lat, failures, err := b.move(s.client)
		must(b.tb, err)
		r.probeFailures = r.probeFailures.merge(failures)
		r.churnListing = append(r.churnListing, lat)
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
