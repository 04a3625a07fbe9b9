package metrics

import "github.com/prometheus/client_golang/prometheus"

// BuildInfo is upstream's kubernetes_build_info (component-base's version
// metric, which kube-proxy serves): constant 1, labelled with the build of
// the running binary, here nftproxy's. Dashboards that show the proxy's
// version per node read it; its name, help text and labels are upstream's.
var BuildInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "kubernetes_build_info",
	Help: "[BETA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
}, []string{"major", "minor", "git_version", "git_commit", "git_tree_state", "build_date", "go_version", "compiler", "platform"})

func buildInfoCollectors() []prometheus.Collector {
	return []prometheus.Collector{BuildInfo}
}
