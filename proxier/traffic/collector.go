// Package traffic reports the kernel's counters of the dispatch maps
// (--service-traffic-metrics, ruleset.Counters) as Prometheus metrics:
// new connections per Service port and frontend, and per endpoint. It
// reads the counters when it is scraped, and keeps nothing between
// scrapes.
package traffic

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// Reader reads the counters of a family's counted sets: nftnl.Netlink's
// ReadCounters (on a socket of the collector's own), or a fake.
type Reader interface {
	ReadCounters(ctx context.Context, f nft.Family, fn nftnl.CountedElement) error
}

// readAttempts bounds the reads of a family a scrape makes when commits
// keep interrupting them (nftnl.ErrInterrupted).
const readAttempts = 3

// scrapeTimeout bounds the reading of the counters of one scrape.
const scrapeTimeout = 10 * time.Second

// Collector is a prometheus.Collector of the traffic metrics.
type Collector struct {
	reader   Reader
	families []nft.Family
}

// NewCollector returns a collector reading the counters of the families'
// tables with r.
func NewCollector(r Reader, families []nft.Family) *Collector {
	return &Collector{reader: r, families: families}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- metrics.ServiceNewConnections
	ch <- metrics.EndpointNewConnections
	metrics.TrafficScrapeErrors.Describe(ch)
}

// serviceKey and endpointKey are the label values of one series.
type serviceKey struct {
	namespace, service, port, protocol, frontend string
}

type endpointKey struct {
	namespace, service, port, protocol string
	endpoint                           netip.AddrPort
}

// counts are the sums of one scrape.
type counts struct {
	services  map[serviceKey]uint64
	endpoints map[endpointKey]uint64
}

// Collect implements prometheus.Collector: it reads every family's
// counters and sends one series per Service port and frontend, and per
// endpoint, summed over the families. A family whose counters cannot be
// read is left out (and counted in TrafficScrapeErrors).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	total := counts{services: map[serviceKey]uint64{}, endpoints: map[endpointKey]uint64{}}
	for _, f := range c.families {
		if err := c.readFamily(ctx, f, total); err != nil {
			klog.ErrorS(err, "Cannot read the traffic counters", "ipFamily", f.IPFamily())
			metrics.TrafficScrapeErrors.WithLabelValues(f.IPFamily()).Inc()
		}
	}
	for k, v := range total.services {
		ch <- prometheus.MustNewConstMetric(metrics.ServiceNewConnections, prometheus.CounterValue, float64(v),
			k.namespace, k.service, k.port, k.protocol, k.frontend)
	}
	for k, v := range total.endpoints {
		ch <- prometheus.MustNewConstMetric(metrics.EndpointNewConnections, prometheus.CounterValue, float64(v),
			k.namespace, k.service, k.port, k.protocol, k.endpoint.String())
	}
	metrics.TrafficScrapeErrors.Collect(ch)
}

// readFamily adds one family's counters to total, once a read was not
// interrupted by a commit.
func (c *Collector) readFamily(ctx context.Context, f nft.Family, total counts) error {
	var err error
	for range readAttempts {
		read := counts{services: map[serviceKey]uint64{}, endpoints: map[endpointKey]uint64{}}
		if err = c.reader.ReadCounters(ctx, f, read.add); err == nil {
			total.merge(read)
			return nil
		}
		if !errors.Is(err, nftnl.ErrInterrupted) {
			return err
		}
	}
	return err
}

// add counts one element: a frontend's of service-ips or
// service-nodeports, or an endpoint's of an endpoints map. Elements
// without a Service port's comment are not counted. The element's comment
// lives in the reader's buffer: a new series' labels are copies of it.
func (t counts) add(s *nft.Set, e nft.Element, cnt nftnl.Counter) {
	ns, name, port, ok := ruleset.ParseComment(e.Comment)
	if !ok {
		return
	}
	if s.EndpointsProto != 0 {
		if len(e.Data) != 2 {
			return
		}
		k := endpointKey{namespace: ns, service: name, port: port, protocol: nft.ProtoName(s.EndpointsProto),
			endpoint: netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int))}
		if _, seen := t.endpoints[k]; !seen {
			k.namespace, k.service, k.port = strings.Clone(ns), strings.Clone(name), strings.Clone(port)
		}
		t.endpoints[k] += cnt.Packets
		return
	}
	frontend, proto, ok := ruleset.CountedFrontend(s.Name, e)
	if !ok {
		return
	}
	k := serviceKey{namespace: ns, service: name, port: port, protocol: nft.ProtoName(proto), frontend: frontend}
	if _, seen := t.services[k]; !seen {
		k.namespace, k.service, k.port = strings.Clone(ns), strings.Clone(name), strings.Clone(port)
	}
	t.services[k] += cnt.Packets
}

func (t counts) merge(o counts) {
	for k, v := range o.services {
		t.services[k] += v
	}
	for k, v := range o.endpoints {
		t.endpoints[k] += v
	}
}
