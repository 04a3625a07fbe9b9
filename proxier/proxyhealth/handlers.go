package proxyhealth

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/configz"

	"github.com/nftproxy/nftproxy/metrics"
)

// ProxyMode is what /proxyMode answers: the upstream mode nftproxy replaces.
const ProxyMode = "nftables"

// HealthMux serves /healthz and /livez from h, for the health port.
//
// /healthz also fails when the node is being deleted, so that load
// balancers (which probe it for externalTrafficPolicy=Cluster Services)
// drain the node; /livez ignores the node, so kubelet does not restart a
// proxier that is merely on a departing node.
func HealthMux(h *Health) *http.ServeMux {
	// Both answers' series exist from the start, at 0: an alert on the
	// increase of 503s then sees the first one (a series born at 1 has no
	// increase), and a healthy proxy shows 0 rather than no data.
	for _, code := range []string{strconv.Itoa(http.StatusOK), strconv.Itoa(http.StatusServiceUnavailable)} {
		metrics.ProxyHealthzTotal.WithLabelValues(code)
		metrics.ProxyLivezTotal.WithLabelValues(code)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		st := h.Status()
		eligible := h.NodeEligible()
		st.NodeEligible = &eligible
		writeStatus(w, st, st.Healthy && eligible, metrics.ProxyHealthzTotal)
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		st := h.Status()
		writeStatus(w, st, st.Healthy, metrics.ProxyLivezTotal)
	})
	return mux
}

// writeStatus answers 200 or 503 with st as JSON and counts the answer.
func writeStatus(w http.ResponseWriter, st Status, healthy bool, counter *prometheus.CounterVec) {
	code := http.StatusServiceUnavailable
	if healthy {
		code = http.StatusOK
		// Upstream reports "now" when healthy: older releases' lastUpdated
		// meant "the sync loop ran recently", and probes still read it so.
		st.LastUpdated = st.CurrentTime
	}
	counter.WithLabelValues(strconv.Itoa(code)).Inc()
	body, err := json.Marshal(st)
	if err != nil { // cannot happen: Status holds only times, bools, strings
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// MetricsMux serves, for the metrics port, /metrics (metricsHandler),
// /proxyMode (plain text "nftables", which tools and the Kubernetes e2e tests
// read to learn the proxy mode), /healthz (plain "ok": upstream installs
// that generic liveness check on the metrics port too) and /configz
// (component-base's: the configurations registered with it, as JSON keyed
// by name; nftproxy registers its effective KubeProxyConfiguration under
// "kubeproxy.config.k8s.io", as upstream). With profiling it
// also serves Go's profiles under /debug/pprof/, as upstream does with
// --profiling (enableProfiling).
func MetricsMux(metricsHandler http.Handler, profiling bool) *http.ServeMux {
	mux := http.NewServeMux()
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	mux.Handle("/metrics", metricsHandler)
	configz.InstallHandler(mux)
	mux.HandleFunc("/proxyMode", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(ProxyMode))
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}
