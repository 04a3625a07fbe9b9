// Package live runs deploy/monitoring/ against the real things on the e2e
// test bed: its manifests through a kube-apiserver with the Prometheus
// operator's CRDs (server-side dry-run), and its dashboard's queries and
// alert expressions through a real Prometheus (Debian's prometheus
// package) scraping nftproxy while Services change. Its tests need root
// and the bed's binaries, like e2e/scenarios.
package live
