package testbed

import (
	"net/netip"
	"strings"
	"testing"
)

// TestNodePodCIDRsInsideClusterCIDRs: every node's pod CIDRs lie inside the
// cluster CIDRs (PodCIDRs) with the node mask sizes the controller-manager
// is given, which may be at most 16 bits longer than the cluster CIDR (the
// node CIDR allocator and kubeadm refuse more); a node's IPv6 pod CIDR
// outside the /48 stopped the controller-manager of the dual-stack
// conformance cluster at start.
func TestNodePodCIDRsInsideClusterCIDRs(t *testing.T) {
	var cluster []netip.Prefix
	for _, s := range strings.Split(PodCIDRs, ",") {
		cluster = append(cluster, netip.MustParsePrefix(s))
	}
	masks := []int{NodeCIDRMaskSizeIPv4, NodeCIDRMaskSizeIPv6}
	seen := map[netip.Prefix]int{}
	for i := 1; i <= 200; i++ {
		for f, p := range nodePodCIDRs(i) {
			c := cluster[f]
			if p.Addr().Is4() != c.Addr().Is4() || !c.Contains(p.Addr()) || p.Bits() != masks[f] || p.Bits()-c.Bits() > 16 {
				t.Errorf("node %d: pod CIDR %s: want a /%d inside %s, at most 16 bits longer", i, p, masks[f], c)
			}
			if j, ok := seen[p]; ok {
				t.Errorf("nodes %d and %d share pod CIDR %s", j, i, p)
			}
			seen[p] = i
		}
	}
}
