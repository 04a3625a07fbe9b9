package proxier

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/traffic"
)

// BenchmarkProxierKernelTraffic is what --service-traffic-metrics costs at
// 10,000 Services × 5 endpoints, in a real kernel (a fresh namespace per
// value): cold-ms, the first sync into an empty table; change-ms, the
// median of 20 syncs that each move one endpoint of one Service; and,
// with counters, scrape-ms and scrape-allocs, the median of 10 reads of
// every counter and their series (traffic.Collector, on a read-only
// socket of its own) as a /metrics scrape does them. Run with
//
//	go test ./proxier -run '^$' -bench KernelTraffic -benchtime 1x
func BenchmarkProxierKernelTraffic(b *testing.B) {
	sz := benchstate.Size{Services: 10000, Endpoints: 5}
	for _, counters := range []ruleset.Counters{ruleset.CountNone, ruleset.CountServices, ruleset.CountEndpoints} {
		b.Run(counters.String(), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				ns := netns.New(b, "nftproxy-bt")
				backend := benchNetlink(b, ns.Fd)
				svcs, slices := benchstate.Cluster(sz)
				cfg := benchConfig
				cfg.TrafficCounters = counters
				p := benchProxierWith(b, cfg, map[nft.Family]nft.Backend{nft.IPv4: backend}, svcs, slices)
				start := time.Now()
				if err := p.sync(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(ms(time.Since(start)), "cold-ms")
				var changes []time.Duration
				for gen := 1; gen <= 20; gen++ {
					_, es := benchstate.Service(sz, gen*7919%sz.Services, gen)
					p.trackers.Slices.Set(model.SliceKey{Namespace: "bench", Name: es.Name}, es)
					start := time.Now()
					if err := p.sync(context.Background()); err != nil {
						b.Fatal(err)
					}
					changes = append(changes, time.Since(start))
				}
				b.ReportMetric(ms(median(changes)), "change-ms")
				if counters != ruleset.CountNone {
					d, allocs := benchScrape(b, ns.Fd)
					b.ReportMetric(ms(d), "scrape-ms")
					b.ReportMetric(allocs, "scrape-allocs")
				}
				b.StartTimer()
			}
		})
	}
}

// benchScrape returns the median time and the allocations of a gather of
// the traffic collector over the namespace's table.
func benchScrape(b *testing.B, nsFd int) (time.Duration, float64) {
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: nsFd, ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(traffic.NewCollector(n, []nft.Family{nft.IPv4}, nil))
	var times []time.Duration
	var before, after runtime.MemStats
	series := 0
	for range 10 {
		runtime.ReadMemStats(&before)
		start := time.Now()
		mfs, err := reg.Gather()
		times = append(times, time.Since(start))
		runtime.ReadMemStats(&after)
		if err != nil {
			b.Fatal(err)
		}
		series = 0
		for _, mf := range mfs {
			series += len(mf.GetMetric())
		}
	}
	b.ReportMetric(float64(series), "series")
	return median(times), float64(after.Mallocs - before.Mallocs)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return d.Seconds() * 1000 }
