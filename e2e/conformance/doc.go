// Package conformance runs upstream Kubernetes' [sig-network] e2e tests
// (e2e.test, built by e2e/tools/build.sh --conformance) on a two-node
// cluster of the bed, once with nftproxy as the cluster's proxy (make image,
// kubectl apply -k deploy/) and once with upstream kube-proxy in nftables
// mode (kubeadm's DaemonSet), and measures what nftproxy's own disruptions
// (rollout restart, upgrade, pod deletion, kubelet restart) cost live
// connections. `make conformance` runs it; docs/conformance.md has the
// results and how they are made.
//
// The pure parts live here (which tests run and why others do not, the
// JUnit reports and the table made of them); the run itself is
// TestConformance, which needs NFTPROXY_CONFORMANCE=1.
package conformance
