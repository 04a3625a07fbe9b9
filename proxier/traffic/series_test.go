package traffic

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// TestReadErrorsFromStart: a family's read errors are served at 0 from the
// first scrape, before any read failed.
func TestReadErrorsFromStart(t *testing.T) {
	metrics.TrafficScrapeErrors.Reset()
	r := &fakeReader{rulesets: map[nft.Family]*nft.Ruleset{
		nft.IPv4: build(nft.IPv4, ruleset.CountServices), nft.IPv6: build(nft.IPv6, ruleset.CountServices)},
		counts: map[string]uint64{}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(r, []nft.Family{nft.IPv4, nft.IPv6}, nil))
	for _, fam := range []string{"IPv4", "IPv6"} {
		labels := map[string]string{"ip_family": fam}
		if v, ok := testutil.Served(t, reg, "nftproxy_traffic_counter_read_errors_total", labels); !ok || v != 0 {
			t.Errorf("read errors of %s: served %v, value %v; want served at 0", fam, ok, v)
		}
	}
}
