// Package traffic reports the kernel's counters of the dispatch maps
// and sets (--service-traffic-metrics, ruleset.Counters) as Prometheus
// metrics: new connections per Service port and frontend, and per
// endpoint; packets and bytes per Service port. It
// reads the counters when it is scraped, and keeps nothing between
// scrapes.
package traffic

import (
	"context"
	"errors"
	"fmt"
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

// scrapeTimeout bounds the reading of the counters of one scrape.
const scrapeTimeout = 10 * time.Second

// Collector is a prometheus.Collector of the traffic metrics.
type Collector struct {
	reader   Reader
	families []nft.Family
	hold     func() (release func())
}

// NewCollector returns a collector reading the counters of the families'
// tables with r. hold, if set, is called around each read, so that the
// proxy's commits wait for it (readers.Gate.Hold): a commit interrupts a
// dump, and the read starts over. The families' read errors are served
// at 0 from the first scrape.
func NewCollector(r Reader, families []nft.Family, hold func() (release func())) *Collector {
	if hold == nil {
		hold = func() func() { return func() {} }
	}
	for _, f := range families {
		metrics.TrafficScrapeErrors.WithLabelValues(f.IPFamily())
	}
	return &Collector{reader: r, families: families, hold: hold}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- metrics.ServiceNewConnections
	ch <- metrics.EndpointNewConnections
	ch <- metrics.ServicePackets
	ch <- metrics.ServiceBytes
	metrics.TrafficScrapeErrors.Describe(ch)
}

// portKey, serviceKey and endpointKey are the label values of one series.
type portKey struct {
	namespace, service, port, protocol string
}

type serviceKey struct {
	portKey
	frontend string
}

type endpointKey struct {
	portKey
	endpoint netip.AddrPort
}

// owned returns k with strings of its own (see counter).
func (k portKey) owned() portKey {
	k.namespace, k.service, k.port = strings.Clone(k.namespace), strings.Clone(k.service), strings.Clone(k.port)
	return k
}

func (k serviceKey) owned() serviceKey {
	k.portKey = k.portKey.owned()
	return k
}

func (k endpointKey) owned() endpointKey {
	k.portKey = k.portKey.owned()
	return k
}

// counts are the sums of one scrape.
type counts struct {
	services  map[serviceKey]*nftnl.Counter
	endpoints map[endpointKey]*nftnl.Counter
	traffic   map[portKey]*nftnl.Counter
}

func newCounts() counts {
	return counts{services: map[serviceKey]*nftnl.Counter{}, endpoints: map[endpointKey]*nftnl.Counter{},
		traffic: map[portKey]*nftnl.Counter{}}
}

// counter returns the sum of series k in m, a new one under k.owned() if
// k is new. k's strings may live in the reader's buffer: m is only read
// with k, since a store under a key equal to one in m would keep k's
// strings in place of the copies (Go updates a map's string keys).
func counter[K interface {
	comparable
	owned() K
}](m map[K]*nftnl.Counter, k K) *nftnl.Counter {
	if c := m[k]; c != nil {
		return c
	}
	c := new(nftnl.Counter)
	m[k.owned()] = c
	return c
}

// Collect implements prometheus.Collector: it reads every family's
// counters and sends one series per Service port and frontend, and per
// endpoint, summed over the families. A family whose counters cannot be
// read is left out (and counted in TrafficScrapeErrors).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	total := newCounts()
	for _, f := range c.families {
		if err := c.readFamily(ctx, f, total); err != nil {
			klog.ErrorS(err, "Cannot read the traffic counters", "ipFamily", f.IPFamily())
			metrics.TrafficScrapeErrors.WithLabelValues(f.IPFamily()).Inc()
			metrics.RulesetReadFailuresTotal.WithLabelValues(f.IPFamily(), metrics.ReaderCounters).Inc()
		}
	}
	for k, v := range total.services {
		ch <- prometheus.MustNewConstMetric(metrics.ServiceNewConnections, prometheus.CounterValue, float64(v.Packets),
			k.namespace, k.service, k.port, k.protocol, k.frontend)
	}
	for k, v := range total.endpoints {
		ch <- prometheus.MustNewConstMetric(metrics.EndpointNewConnections, prometheus.CounterValue, float64(v.Packets),
			k.namespace, k.service, k.port, k.protocol, k.endpoint.String())
	}
	for k, v := range total.traffic {
		ch <- prometheus.MustNewConstMetric(metrics.ServicePackets, prometheus.CounterValue, float64(v.Packets),
			k.namespace, k.service, k.port, k.protocol)
		ch <- prometheus.MustNewConstMetric(metrics.ServiceBytes, prometheus.CounterValue, float64(v.Bytes),
			k.namespace, k.service, k.port, k.protocol)
	}
	metrics.TrafficScrapeErrors.Collect(ch)
}

// readFamily adds one family's counters to total, once a read was not
// interrupted by a commit (another process's: the proxy's own wait for
// it), read again until ctx ends.
func (c *Collector) readFamily(ctx context.Context, f nft.Family, total counts) error {
	release := c.hold()
	defer release()
	for attempt := 1; ; attempt++ {
		read := newCounts()
		err := c.reader.ReadCounters(ctx, f, read.add)
		if err == nil {
			total.merge(read)
			return nil
		}
		if !errors.Is(err, nftnl.ErrInterrupted) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %d readings interrupted by commits: %w", err, attempt, ctx.Err())
		}
	}
}

// add counts one element: a frontend's of service-ips or
// service-nodeports (connections) or of service-traffic or
// nodeport-traffic (packets and bytes), or an endpoint's of an endpoints
// map. Elements without a Service port's comment are not counted. The
// element's comment lives in the reader's buffer: a new series' labels
// are copies of it.
func (t counts) add(s *nft.Set, e nft.Element, cnt nftnl.Counter) {
	ns, name, port, ok := ruleset.ParseComment(e.Comment)
	if !ok {
		return
	}
	series := func(proto uint8) portKey {
		return portKey{namespace: ns, service: name, port: port, protocol: nft.ProtoName(proto)}
	}
	var c *nftnl.Counter
	if s.EndpointsProto != 0 || s.PickProto != 0 {
		if len(e.Data) != 2 {
			return
		}
		c = counter(t.endpoints, endpointKey{series(s.EndpointsProto | s.PickProto), netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int))})
	} else if proto, ok := ruleset.CountedTraffic(s.Name, e); ok {
		c = counter(t.traffic, series(proto))
	} else if frontend, proto, ok := ruleset.CountedFrontend(s.Name, e); ok {
		c = counter(t.services, serviceKey{series(proto), frontend})
	} else {
		return
	}
	*c = c.Add(cnt)
}

func (t counts) merge(o counts) {
	mergeInto(t.services, o.services)
	mergeInto(t.endpoints, o.endpoints)
	mergeInto(t.traffic, o.traffic)
}

// mergeInto adds the series of src, whose keys are owned, to dst.
func mergeInto[K comparable](dst, src map[K]*nftnl.Counter) {
	for k, v := range src {
		if c := dst[k]; c != nil {
			*c = c.Add(*v)
		} else {
			dst[k] = v
		}
	}
}
