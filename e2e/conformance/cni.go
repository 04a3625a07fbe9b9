package conformance

import (
	"fmt"
	"slices"
	"strings"
)

// CNI is the conformance cluster's pod network.
type CNI string

const (
	// CNIBridge is the bed's own: Debian's bridge and host-local plugins,
	// the pod CIDRs routed between the nodes by the bed, no netfilter
	// rule of its own.
	CNIBridge CNI = "bridge"
	// CNIFlanneliptables and CNIFlannelnftables are flanneld from
	// flannel's manifest, vxlan backend, in its iptables and its nftables
	// mode (net-conf.json's EnableNFTables).
	CNIFlanneliptables CNI = "flannel-iptables"
	CNIFlannelnftables CNI = "flannel-nftables"
)

// CNIs are the pod networks a run can use.
var CNIs = []CNI{CNIBridge, CNIFlanneliptables, CNIFlannelnftables}

// ParseCNI parses CONFORMANCE_CNI.
func ParseCNI(s string) (CNI, error) {
	if slices.Contains(CNIs, CNI(s)) {
		return CNI(s), nil
	}
	return "", fmt.Errorf("unknown CNI %q: want one of %v", s, CNIs)
}

// Flannel reports whether the network is flannel's, and in which mode
// ("iptables" or "nftables").
func (c CNI) Flannel() (mode string, ok bool) {
	return strings.CutPrefix(string(c), "flannel-")
}

// Dir is the run's output directory under make conformance's, before the
// set's: none for the bridge, which came first.
func (c CNI) Dir() string {
	if c == CNIBridge {
		return ""
	}
	return string(c)
}
