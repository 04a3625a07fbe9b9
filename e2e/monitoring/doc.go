// Package monitoring reads what deploy/monitoring/ ships (the Grafana
// dashboard, the PrometheusRule, the kustomization) and takes its PromQL
// apart, for the tests that prove every query works against nftproxy: the
// metric names and labels each query selects, its Grafana variables
// substituted, and an alert's expression without its threshold.
//
// It is a module of its own so that github.com/prometheus/prometheus (for
// its PromQL parser, at the version of the Debian prometheus package the
// end-to-end test runs: v2.42) and the kustomize API stay out of
// nftproxy's dependencies. Its replace directive builds nftproxy's
// packages from this repository, with the main module's versions of what
// they import (none of prometheus's requirements is newer); when the
// main module's dependencies change, `go mod tidy` here follows.
package monitoring
