// Package proxier runs nftproxy's sync loop: it checks out the changes the
// watchers recorded, derives the node-local model, builds the desired
// rulesets, diffs them against what was committed, applies the difference in
// one transaction per family, and records metrics and health.
package proxier

import (
	"net/netip"
	"time"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// Config is everything the proxier needs to know, already validated and
// parsed by cmd/nftproxy.
type Config struct {
	// NodeName is this node's name (--hostname-override or the hostname).
	NodeName string
	// ClusterCIDRs are the pod CIDRs of the cluster (--cluster-cidr): traffic
	// to a ClusterIP from outside them is masqueraded. Empty: no
	// masquerading of ClusterIP traffic (as upstream without a detector).
	ClusterCIDRs []netip.Prefix
	// LocalDetect says how traffic from this node's pods is recognised
	// (--detect-local-mode); the zero value is ClusterCIDR mode.
	LocalDetect LocalDetect
	// NodePortCIDRs (--nodeport-addresses, its keywords "localhost" and
	// "all" expanded): NodePorts answer on this node's addresses inside
	// them. NodePortPrimary ("primary", the default), or no CIDRs at all:
	// also on the node's primary IPs, from its Node object. An IP family
	// that neither names answers on all its addresses, as upstream's
	// (kube-proxy adds 0.0.0.0/0 or ::/0 for it). Loopback addresses are
	// never served by the kernel's rules (see nodePortAddresses).
	NodePortCIDRs   []netip.Prefix
	NodePortPrimary bool
	// ServiceCIDRs are the fallback service CIDRs (--service-cidr), used when
	// the ServiceCIDR API is not available: traffic to an unallocated
	// address inside them is dropped.
	ServiceCIDRs []netip.Prefix
	// MasqueradeBit is the packet mark bit (0-31) used to mark traffic for
	// masquerading (default 14, mark 0x4000).
	MasqueradeBit int
	// MasqueradeAll masquerades all traffic to Service IPs.
	MasqueradeAll bool
	// IPv4, IPv6 enable the families to program.
	IPv4, IPv6 bool
	// TrafficCounters says which dispatch maps count new connections
	// (--service-traffic-metrics; see ruleset.Counters).
	TrafficCounters ruleset.Counters
	// LocalhostNodePorts is the feature gate
	// KubeProxyNFTablesLocalhostNodePorts: NodePort connections to the
	// node's loopback addresses are refused, or for TCP in a family whose
	// NodePortCIDRs name a loopback CIDR, proxied in userspace
	// (LocalhostProxied, Deps.LocalhostNodePorts).
	LocalhostNodePorts bool

	// SyncPeriod is the longest time between two syncs (default 30 s);
	// MinSyncPeriod the shortest (0: see SyncBusyShare); FullSyncPeriod
	// how often the whole ruleset is rebuilt and checked against the
	// table read back from the kernel, repairing any drift, even without
	// failures (default 1 h).
	SyncPeriod     time.Duration
	MinSyncPeriod  time.Duration
	FullSyncPeriod time.Duration
	// SyncBusyShare, without a MinSyncPeriod, spaces syncs by their cost
	// so that they take at most about this share of the time
	// (runner.Config.BusyShare); 0 with no MinSyncPeriod syncs on every
	// change.
	SyncBusyShare float64
	// MaxReaderWait bounds how long a sync waits for other processes'
	// reads of the ruleset (Deps.Readers; 0: it does not wait); at most
	// MaxReaderWaitLimit.
	MaxReaderWait time.Duration
	// ResyncPeriod is the Node informer's resync period, and how often the
	// ServiceCIDR discovery asks again (--config-sync-period). Services and
	// EndpointSlices are not resynced: their reflectors write into the
	// trackers, which a resync would hand what they hold already.
	ResyncPeriod time.Duration
}

// syncBusyCap bounds the gap SyncBusyShare puts after a slow sync
// (runner.Config.BusyCap): upstream's default minimum sync period, so that
// the share never makes a change wait longer than kube-proxy would.
const syncBusyCap = time.Second

// MaxReaderWaitLimit is the longest MaxReaderWait with which a sync that
// waits for readers leaves /healthz true. Health fails when an update
// stays unapplied for 2 × SyncPeriod (upstream's rule, Deps.Health), and
// an update waits for the least gap between syncs, then for readers, then
// for its sync: the limit leaves the sync a whole SyncPeriod.
func MaxReaderWaitLimit(c Config) time.Duration {
	gap := c.MinSyncPeriod
	if gap == 0 && c.SyncBusyShare > 0 {
		gap = syncBusyCap
	}
	return max(c.SyncPeriod-gap, 0)
}

// Local traffic detection modes (--detect-local-mode).
const (
	DetectClusterCIDR         = "ClusterCIDR"
	DetectNodeCIDR            = "NodeCIDR"
	DetectBridgeInterface     = "BridgeInterface"
	DetectInterfaceNamePrefix = "InterfaceNamePrefix"
)

// LocalDetect is how traffic from this node's pods is told from other
// traffic: by source CIDR (the cluster's, ClusterCIDRs, or the node's pod
// CIDRs from its Node object) or by input interface.
type LocalDetect struct {
	Mode                string // "" means DetectClusterCIDR
	BridgeInterface     string // for DetectBridgeInterface
	InterfaceNamePrefix string // for DetectInterfaceNamePrefix
}

// rulesetConfig is the builder's configuration for family f, and the node
// as last seen.
func (p *Proxier) rulesetConfig(f nft.Family) (ruleset.Config, model.Node) {
	p.mu.Lock()
	apiServiceCIDRs, node := p.apiServiceCIDRs, p.node
	p.mu.Unlock()
	return rulesetConfig(p.cfg, f, node, apiServiceCIDRs)
}

// rulesetConfig is the builder's configuration for family f on the node
// whose object is node (zero: not seen), with the service CIDRs of the
// ServiceCIDR objects (none: cfg's), and the node the model is derived
// with.
func rulesetConfig(c Config, f nft.Family, node model.Node, apiServiceCIDRs []netip.Prefix) (ruleset.Config, model.Node) {
	serviceCIDRs := c.ServiceCIDRs
	if len(apiServiceCIDRs) > 0 {
		serviceCIDRs = apiServiceCIDRs
	}
	if node.Name == "" {
		node.Name = c.NodeName // endpoints are local by name before the Node is seen
	}
	cfg := ruleset.Config{
		ServiceCIDRs:   ofFamily(f, serviceCIDRs),
		MasqueradeMark: 1 << c.MasqueradeBit,
		MasqueradeAll:  c.MasqueradeAll,
		Counters:       c.TrafficCounters,
	}
	switch d := c.LocalDetect; d.Mode {
	case DetectNodeCIDR:
		cfg.LocalTraffic.CIDRs = ofFamily(f, node.PodCIDRs)
	case DetectBridgeInterface:
		cfg.LocalTraffic.Interface = d.BridgeInterface
	case DetectInterfaceNamePrefix:
		cfg.LocalTraffic.Interface, cfg.LocalTraffic.InterfacePrefix = d.InterfaceNamePrefix, true
	default:
		cfg.LocalTraffic.CIDRs = ofFamily(f, c.ClusterCIDRs)
	}
	cfg.NodePorts = nodePortAddresses(c, f, node)
	cfg.LocalhostNodePorts = ruleset.LocalhostNodePorts{Reject: c.localhostRejected(f)}
	return cfg, node
}

// LocalhostProxied reports whether family f's TCP NodePorts are served on
// its loopback address by a userspace proxy (proxier/localnodeport), as
// upstream's with the gate on: when NodePortCIDRs hold a CIDR of the
// family whose network address is a loopback one (127.0.0.0/8,
// 127.0.0.1/32, ::1/128; not 0.0.0.0/0, which only contains them).
func (c Config) LocalhostProxied(f nft.Family) bool {
	if !c.LocalhostNodePorts {
		return false
	}
	for _, p := range ofFamily(f, c.NodePortCIDRs) {
		if p.Masked().Addr().IsLoopback() {
			return true
		}
	}
	return false
}

// localhostRejected are the protocols whose NodePorts refuse connections
// to family f's loopback addresses: none without the gate, UDP and SCTP
// where the userspace proxy serves TCP, else all three.
func (c Config) localhostRejected(f nft.Family) []uint8 {
	switch {
	case !c.LocalhostNodePorts:
		return nil
	case c.LocalhostProxied(f):
		return []uint8{nft.ProtoUDP, nft.ProtoSCTP}
	}
	return []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP}
}

// primaryNodePorts reports whether NodePorts answer on the node's primary
// IPs.
func (c Config) primaryNodePorts() bool { return c.NodePortPrimary || len(c.NodePortCIDRs) == 0 }

// nodePortAddresses are the destinations of family f on which the kernel's
// rules serve NodePorts: the node's primary IPs of the family (see
// primaryNodePorts), and its local addresses inside the family's CIDRs,
// or inside 0.0.0.0/0 (::/0) when the list names neither. Loopback CIDRs
// (127.0.0.0/8, ::1/128) are left out: the kernel never DNATs traffic to
// a loopback address, which would then leave the node with a source it
// cannot answer; upstream's rules leave it alone too, and what happens to
// it is the localhost NodePorts' business.
func nodePortAddresses(c Config, f nft.Family, node model.Node) ruleset.NodePortAddresses {
	var np ruleset.NodePortAddresses
	cidrs := ofFamily(f, c.NodePortCIDRs)
	if c.primaryNodePorts() {
		for _, a := range node.Addresses {
			if f.Contains(a) {
				np.Addresses = append(np.Addresses, a)
			}
		}
	} else if len(cidrs) == 0 {
		cidrs = []netip.Prefix{netip.PrefixFrom(f.Unspecified(), 0)}
	}
	lo := f.Loopback()
	for _, p := range cidrs {
		if !lo.Overlaps(p) || p.Bits() < lo.Bits() {
			np.CIDRs = append(np.CIDRs, p)
		}
	}
	return np
}

func ofFamily(f nft.Family, ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if f.Contains(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}
