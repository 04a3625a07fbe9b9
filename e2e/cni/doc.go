// Package cni tests nftproxy beside a real CNI on the e2e bed (docs/cnis.md).
//
// flanneld, built from the pinned module by e2e/tools/build.sh --flannel,
// runs on each node of a bed whose pod CIDRs the bed leaves unrouted
// (testbed.Options.PodRoutes): flannel routes them over VXLAN, and
// writes its own rules at the hooks and priorities nftproxy writes at, in
// its iptables mode (iptables-nft) or its nftables mode (tables
// flannel-ipv4 and flannel-ipv6). The neighbour checks drive traffic
// through both and look at what each left and what reached the pods.
package cni
