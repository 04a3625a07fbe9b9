package metrics

import (
	"context"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// The client-go request metrics, named and labelled as
// k8s.io/component-base/metrics/prometheus/restclient names them (which is
// what kube-proxy serves). The "Kubernetes / Proxy" dashboard plots
// rest_client_requests_total by code and the GET and POST latencies.
var (
	// RESTClientRequestsTotal counts API requests. Labels: code, method,
	// host.
	RESTClientRequestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total",
		Help: alpha + "Number of HTTP requests, partitioned by status code, method, and host.",
	}, []string{"code", "method", "host"})

	// RESTClientRequestLatency is API request latency. Labels: verb, host.
	RESTClientRequestLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rest_client_request_duration_seconds",
		Help:    alpha + "Request latency in seconds. Broken down by verb, and host.",
		Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0},
	}, []string{"verb", "host"})
)

func init() {
	// client-go keeps the first registration only (sync.Once); nothing else
	// in nftproxy registers, so ours wins.
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestResult:  requestResultAdapter{},
		RequestLatency: requestLatencyAdapter{},
	})
}

func restClientCollectors() []prometheus.Collector {
	return []prometheus.Collector{RESTClientRequestsTotal, RESTClientRequestLatency}
}

// requestResultAdapter implements client-go's metrics.ResultMetric.
type requestResultAdapter struct{}

func (requestResultAdapter) Increment(_ context.Context, code, method, host string) {
	RESTClientRequestsTotal.WithLabelValues(code, method, host).Inc()
}

// requestLatencyAdapter implements client-go's metrics.LatencyMetric.
type requestLatencyAdapter struct{}

func (requestLatencyAdapter) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	RESTClientRequestLatency.WithLabelValues(verb, u.Host).Observe(latency.Seconds())
}
