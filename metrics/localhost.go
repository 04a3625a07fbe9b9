package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of localhost NodePorts (feature gate
// KubeProxyNFTablesLocalhostNodePorts), named, labelled and described as
// kube-proxy v1.37 (pkg/proxy/metrics) has them. As upstream, they are
// served only with the gate on: RegisterLocalhostNodePorts.
var (
	// LocalhostNodePortListeners is the number of TCP NodePorts the
	// userspace proxy listens for on the family's loopback address
	// (proxier/localnodeport). Label: ip_family.
	LocalhostNodePortListeners = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "nftables_localhost_nodeport_listeners",
		Help:      alpha + "Number of active localhost NodePort userspace proxy listeners.",
	}, []string{"ip_family"})

	// LocalhostNodePortListenerCreationFailuresTotal counts the listeners
	// the userspace proxy could not open (each retried at the next sync).
	// Label: ip_family.
	LocalhostNodePortListenerCreationFailuresTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: kubeProxySubsystem,
		Name:      "nftables_localhost_nodeport_listener_creation_failures_total",
		Help:      alpha + "Number of localhost NodePort userspace proxy listener creation failures.",
	}, []string{"ip_family"})

	// LocalhostNodePortRejectedPackets: the packets of connections to a
	// NodePort on a loopback address that the rules refused, read from the
	// kernel's counters at each scrape (localnodeport.RejectedCollector).
	// Labels: ip_family, protocol (TCP, UDP, SCTP: upper case, as
	// upstream's).
	LocalhostNodePortRejectedPackets = prometheus.NewDesc(
		prometheus.BuildFQName("", kubeProxySubsystem, "nftables_localhost_nodeport_rejected_packets_total"),
		alpha+"Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running",
		[]string{"ip_family", "protocol"}, nil)
)

// RegisterLocalhostNodePorts serves the localhost NodePorts' metrics, the
// rejected packets read by rejected. The returned function stops serving
// rejected; after it, a second run in one process (tests) may register
// again (the other two metrics stay served).
func RegisterLocalhostNodePorts(rejected prometheus.Collector) (unregister func(), err error) {
	for _, c := range []prometheus.Collector{LocalhostNodePortListeners, LocalhostNodePortListenerCreationFailuresTotal} {
		if err := Registry.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
			return nil, err
		}
	}
	if err := Registry.Register(rejected); err != nil {
		return nil, err
	}
	return func() { Registry.Unregister(rejected) }, nil
}
