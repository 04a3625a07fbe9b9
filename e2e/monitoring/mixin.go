package monitoring

// The queries of the kubernetes-mixin's "Kubernetes / Proxy" dashboard
// (github.com/kubernetes-monitoring/kubernetes-mixin,
// dashboards/proxy.libsonnet) and its KubeProxyDown alert, with the mixin's
// default kubeProxySelector job="kube-proxy". nftproxy replaces kube-proxy
// under that job, so these must keep working unchanged.
const mixinSel = `cluster="$cluster", job="kube-proxy", instance=~"$instance"`

// MixinQueries are the dashboard's panel queries.
var MixinQueries = []Query{
	{Panel: "Up", RefID: "A", Expr: `sum(up{cluster="$cluster", job="kube-proxy"})`},
	{Panel: "Rules Sync Rate", RefID: "A", Expr: `sum(rate(kubeproxy_sync_proxy_rules_duration_seconds_count{` + mixinSel + `}[5m]))`},
	{Panel: "Rule Sync Latency 99th Quantile", RefID: "A", Expr: `histogram_quantile(0.99,rate(kubeproxy_sync_proxy_rules_duration_seconds_bucket{` + mixinSel + `}[5m]))`},
	{Panel: "Network Programming Rate", RefID: "A", Expr: `sum(rate(kubeproxy_network_programming_duration_seconds_count{` + mixinSel + `}[5m]))`},
	{Panel: "Network Programming Latency 99th Quantile", RefID: "A", Expr: `histogram_quantile(0.99, sum(rate(kubeproxy_network_programming_duration_seconds_bucket{` + mixinSel + `}[5m])) by (instance, le))`},
	{Panel: "Kube API Request Rate", RefID: "A", Expr: `sum(rate(rest_client_requests_total{` + mixinSel + `,code=~"2.."}[5m]))`},
	{Panel: "Kube API Request Rate", RefID: "B", Expr: `sum(rate(rest_client_requests_total{` + mixinSel + `,code=~"3.."}[5m]))`},
	{Panel: "Kube API Request Rate", RefID: "C", Expr: `sum(rate(rest_client_requests_total{` + mixinSel + `,code=~"4.."}[5m]))`},
	{Panel: "Kube API Request Rate", RefID: "D", Expr: `sum(rate(rest_client_requests_total{` + mixinSel + `,code=~"5.."}[5m]))`},
	{Panel: "Post Request Latency 99th Quantile", RefID: "A", Expr: `histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{` + mixinSel + `,verb="POST"}[5m])) by (verb, url, le))`},
	{Panel: "Get Request Latency 99th Quantile", RefID: "A", Expr: `histogram_quantile(0.99, sum(rate(rest_client_request_duration_seconds_bucket{` + mixinSel + `, verb="GET"}[5m])) by (verb, url, le))`},
	{Panel: "Memory", RefID: "A", Expr: `process_resident_memory_bytes{` + mixinSel + `}`},
	{Panel: "CPU usage", RefID: "A", Expr: `rate(process_cpu_seconds_total{` + mixinSel + `}[5m])`},
	{Panel: "Goroutines", RefID: "A", Expr: `go_goroutines{` + mixinSel + `}`},
}

// MixinInstanceVariable is the dashboard's $instance query: it lists the
// instances that have observed a network programming latency.
const MixinInstanceVariable = `label_values(kubeproxy_network_programming_duration_seconds_bucket{cluster="$cluster", job="kube-proxy"}, instance)`

// MixinKubeProxyDown is the mixin's KubeProxyDown alert expression.
const MixinKubeProxyDown = `absent(up{job="kube-proxy"} == 1)`

// MixinGaps are what the mixin's queries read that nftproxy does not
// serve, and why that is right. A test fails when one of them is no
// longer true, so the list cannot go stale.
var MixinGaps = map[Gap]string{
	{Metric: "rest_client_request_duration_seconds_bucket", Label: "url"}: "client-go's request latency is labelled by host, not url, in kube-proxy v1.36 " +
		"as in nftproxy (component-base/metrics/prometheus/restclient): the panel groups by an absent label",
	{Metric: "rest_client_request_duration_seconds_bucket", Label: "verb", Value: "POST"}: "nftproxy makes no POST requests: " +
		"kube-proxy's are the Events its event recorder writes, and nftproxy records no Events",
}
