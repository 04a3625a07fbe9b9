package metrics

import "github.com/prometheus/client_golang/prometheus"

// The traffic metrics (--service-traffic-metrics) are read from the
// kernel's counters at scrape time by a collector (proxier/traffic), which
// reports them with these descriptions. Only registered when the flag is
// on. Each series is a sum of element counters, over both IP families and
// over a frontend's addresses; an element's counter starts at zero when
// the element is added again (see docs/operations.md), which rate()
// treats as a counter reset.
var (
	// ServiceNewConnections: new connections per Service port and
	// frontend. Labels: namespace, service, port (the port's name, empty
	// for an unnamed port), protocol, frontend (cluster-ip, external,
	// node-port).
	ServiceNewConnections = prometheus.NewDesc(
		prometheus.BuildFQName(nftproxyNamespace, "", "service_new_connections_total"),
		"New connections dispatched to a Service port, by frontend (kernel counters of the service-ips and service-nodeports elements; an element replaced starts again at zero)",
		[]string{"namespace", "service", "port", "protocol", "frontend"}, nil)

	// ServicePackets and ServiceBytes: packets and bytes, both ways, of
	// the connections to a Service port, all frontends together. Labels:
	// namespace, service, port, protocol.
	ServicePackets = prometheus.NewDesc(
		prometheus.BuildFQName(nftproxyNamespace, "", "service_packets_total"),
		"Packets of the connections to a Service port, requests and replies (kernel counters of the service-traffic and nodeport-traffic elements; an element replaced starts again at zero)",
		[]string{"namespace", "service", "port", "protocol"}, nil)
	ServiceBytes = prometheus.NewDesc(
		prometheus.BuildFQName(nftproxyNamespace, "", "service_bytes_total"),
		"Bytes (IP packet lengths) of the connections to a Service port, requests and replies (kernel counters of the service-traffic and nodeport-traffic elements; an element replaced starts again at zero)",
		[]string{"namespace", "service", "port", "protocol"}, nil)

	// EndpointNewConnections: new connections per endpoint of a Service
	// port (--service-traffic-metrics=endpoints). Labels: namespace,
	// service, port, protocol, endpoint ("10.244.1.11:8080").
	EndpointNewConnections = prometheus.NewDesc(
		prometheus.BuildFQName(nftproxyNamespace, "", "endpoint_new_connections_total"),
		"New connections sent to an endpoint of a Service port (kernel counters of the endpoints maps' elements; they start again at zero when the Service's endpoints change)",
		[]string{"namespace", "service", "port", "protocol", "endpoint"}, nil)

	// TrafficScrapeErrors counts scrapes whose kernel counters could not
	// be read for a family. Label: ip_family.
	TrafficScrapeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: nftproxyNamespace,
		Name:      "traffic_counter_read_errors_total",
		Help:      "Number of scrapes in which the kernel's traffic counters of an IP family could not be read",
	}, []string{"ip_family"})
)
