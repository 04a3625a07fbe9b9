package conformance

import (
	"fmt"
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
func ParseCNI(s string) (CNI, error) { return oneOf("CNI", CNIs, s) }

// Flannel reports whether the network is flannel's, and in which mode
// ("iptables" or "nftables").
func (c CNI) Flannel() (mode string, ok bool) {
	if mode, ok := strings.CutPrefix(string(c), "flannel-"); ok {
		return mode, true
	}
	return "", false
}

// Cluster is the conformance cluster's shape: its pod network and its
// first family (dual-stack either way).
type Cluster struct {
	CNI CNI
	// IPv6Primary lists IPv6 first: Service ranges, cluster CIDRs, the
	// Nodes' pod CIDRs and addresses; the suite then takes IPv6 as the
	// cluster's family.
	IPv6Primary bool
}

// ParseCluster parses CONFORMANCE_CNI and CONFORMANCE_PRIMARY (ipv4 or
// ipv6).
func ParseCluster(cni, primary string) (Cluster, error) {
	c, err := ParseCNI(cni)
	if err != nil {
		return Cluster{}, err
	}
	switch primary {
	case "ipv4", "":
		return Cluster{CNI: c}, nil
	case "ipv6":
		return Cluster{CNI: c, IPv6Primary: true}, nil
	}
	return Cluster{}, fmt.Errorf("unknown primary family %q: want ipv4 or ipv6", primary)
}

// Name is the shape's name: the CNI's, with "-ipv6" for IPv6 first.
func (c Cluster) Name() string {
	if c.IPv6Primary {
		return string(c.CNI) + "-ipv6"
	}
	return string(c.CNI)
}

// bridgeIPv4 is the cluster the project's tables started with.
func (c Cluster) bridgeIPv4() bool { return c == Cluster{CNI: CNIBridge} }

// Dir is the run's output directory under make conformance's, before the
// set's: none for the IPv4-first bridge, which came first.
func (c Cluster) Dir() string {
	if c.bridgeIPv4() {
		return ""
	}
	return c.Name()
}
