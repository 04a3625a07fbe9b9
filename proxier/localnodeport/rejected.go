package localnodeport

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// CounterReader reads the counters of named counted sets:
// nftnl.Netlink's ReadSetCounters (on a read-only socket), or a fake.
type CounterReader interface {
	ReadSetCounters(ctx context.Context, f nft.Family, names []string, fn nftnl.CountedElement) error
}

// rejectedReadTimeout bounds the reading of one scrape (upstream's).
const rejectedReadTimeout = 2 * time.Second

// RejectedCollector is the prometheus.Collector of
// kubeproxy_nftables_localhost_nodeport_rejected_packets_total: at each
// scrape it reads, per family, the counters of the elements of
// localhost-nodeport-rejected (one per protocol refused, see
// ruleset.LocalhostNodePorts). A family without the table, or without the
// set, has no series.
type RejectedCollector struct {
	reader   CounterReader
	families []nft.Family
	hold     func() (release func())
}

// NewRejectedCollector returns a collector reading the families' tables
// with r. hold, if set, is called around each read, so that the proxy's
// commits wait for it (readers.Gate.Hold), as the traffic collector does.
func NewRejectedCollector(r CounterReader, families []nft.Family, hold func() (release func())) *RejectedCollector {
	if hold == nil {
		hold = func() func() { return func() {} }
	}
	return &RejectedCollector{reader: r, families: families, hold: hold}
}

// Describe implements prometheus.Collector.
func (c *RejectedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- metrics.LocalhostNodePortRejectedPackets
}

// Collect implements prometheus.Collector. A family whose counters
// cannot be read is logged and left out.
func (c *RejectedCollector) Collect(ch chan<- prometheus.Metric) {
	for _, f := range c.families {
		packets, err := c.read(f)
		if err != nil {
			klog.ErrorS(err, "Cannot read the counters of refused localhost NodePort connections", "ipFamily", f.IPFamily())
			metrics.RulesetReadFailuresTotal.WithLabelValues(f.IPFamily(), metrics.ReaderCounters).Inc()
			continue
		}
		for proto, n := range packets {
			ch <- prometheus.MustNewConstMetric(metrics.LocalhostNodePortRejectedPackets, prometheus.CounterValue, float64(n),
				f.IPFamily(), strings.ToUpper(nft.ProtoName(proto)))
		}
	}
}

// read returns the packets refused per protocol in family f, read again
// while commits interrupt the dump, until the timeout.
func (c *RejectedCollector) read(f nft.Family) (map[uint8]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), rejectedReadTimeout)
	defer cancel()
	release := c.hold()
	defer release()
	for {
		packets := map[uint8]uint64{}
		err := c.reader.ReadSetCounters(ctx, f, []string{ruleset.LocalhostRejectedSet}, func(s *nft.Set, e nft.Element, n nftnl.Counter) {
			if proto, ok := ruleset.LocalhostRejected(s.Name, e); ok {
				packets[proto] += n.Packets
			}
		})
		if err == nil {
			return packets, nil
		}
		if !errors.Is(err, nftnl.ErrInterrupted) || ctx.Err() != nil {
			return nil, err
		}
	}
}
