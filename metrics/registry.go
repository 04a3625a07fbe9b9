package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry holds every metric nftproxy serves on /metrics. It is our own
// registry rather than prometheus.DefaultRegisterer so that libraries we
// import cannot add series behind our back, and so that tests see exactly
// what production serves.
var Registry = prometheus.NewRegistry()

func init() {
	Registry.MustRegister(kubeProxyCollectors()...)
	Registry.MustRegister(nftproxyCollectors()...)
	Registry.MustRegister(restClientCollectors()...)
	Registry.MustRegister(buildInfoCollectors()...)
	// process_resident_memory_bytes, process_cpu_seconds_total and
	// go_goroutines are on the kubernetes-mixin "Kubernetes / Proxy"
	// dashboard.
	Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
}

// Handler serves Registry in the Prometheus text exposition format, as
// kube-proxy does (no OpenMetrics, whose renaming of counter families and
// _created series would make our output differ from upstream's). A failing
// collector does not hide the other metrics.
func Handler() http.Handler {
	return promhttp.HandlerFor(Registry, promhttp.HandlerOpts{
		Registry:      Registry,
		ErrorHandling: promhttp.ContinueOnError,
	})
}
