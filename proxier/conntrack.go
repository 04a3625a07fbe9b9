package proxier

import (
	"context"
	"net/netip"
	"reflect"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// cleanConntrack deletes the conntrack flows that the sync just made stale:
// UDP and SCTP flows to a frontend of a changed Service that point at an
// endpoint that no longer serves it (or at no endpoint, created while it
// had none), and flows to frontends that are gone. It looks only at the
// Services whose UDP or SCTP ports changed, and does nothing (not even a
// dump) when there is none. before holds the affected Services' ports as
// they were programmed before the sync.
func (p *Proxier) cleanConntrack(ctx context.Context, f nft.Family, fs *familyState, before map[model.ServiceName][]model.ServicePortState) {
	if p.deps.Conntrack == nil {
		return
	}
	previous, current := conntrack.Frontends{}, conntrack.Frontends{}
	for name, old := range before {
		now := fs.services[name].ports
		if reflect.DeepEqual(old, now) || !hasDatagramPort(old) && !hasDatagramPort(now) {
			continue
		}
		addFrontends(previous, old)
		addFrontends(current, now)
	}
	if len(previous) == 0 && len(current) == 0 {
		return
	}
	// The metrics are the backend's to observe (conntrack.Netlink does).
	res, err := p.deps.Conntrack.Reconcile(ctx, conntrack.Family(f), previous, current, nodePortAddrMatcher(fs))
	if err != nil {
		// The rules are right; only old flows linger. Log and go on: the
		// next change of these Services tries again.
		klog.ErrorS(err, "Conntrack cleanup failed", "ipFamily", f.IPFamily(), "deleted", res.Deleted)
		return
	}
	klog.V(2).InfoS("Conntrack cleaned", "ipFamily", f.IPFamily(), "frontends", len(current), "dumped", res.Dumped,
		"deleted", res.Deleted, "elapsed", res.Elapsed)
}

func hasDatagramPort(ports []model.ServicePortState) bool {
	for _, sp := range ports {
		if sp.Name.Protocol == nft.ProtoUDP || sp.Name.Protocol == nft.ProtoSCTP {
			return true
		}
	}
	return false
}

// addFrontends adds the UDP and SCTP frontends of the ports: ClusterIP,
// external IPs, load balancer IPs and NodePort, each with every endpoint a
// flow to it may legitimately be DNATed to (cluster-wide and local ones:
// which applies depends on the client).
func addFrontends(out conntrack.Frontends, ports []model.ServicePortState) {
	for _, sp := range ports {
		proto := sp.Name.Protocol
		if proto != nft.ProtoUDP && proto != nft.ProtoSCTP {
			continue
		}
		eps := append(append([]netip.AddrPort(nil), sp.Endpoints...), sp.LocalEndpoints...)
		add := func(fe conntrack.Frontend) { out[fe] = append(out[fe], eps...) }
		add(conntrack.Frontend{Proto: proto, Addr: sp.ClusterIP, Port: sp.Port})
		for _, a := range sp.ExternalIPs {
			add(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
		}
		for _, a := range sp.LoadBalancerIPs {
			add(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
		}
		if sp.NodePort != 0 {
			add(conntrack.Frontend{Proto: proto, Port: sp.NodePort})
		}
	}
}

// nodePortAddrMatcher tells whether a flow's original destination is one of
// the addresses NodePorts answer on in this family.
func nodePortAddrMatcher(fs *familyState) func(netip.Addr) bool {
	np := fs.cfg.NodePorts
	return func(a netip.Addr) bool {
		if a.IsLoopback() {
			return false
		}
		for _, x := range np.Addresses {
			if x == a {
				return true
			}
		}
		for _, c := range np.CIDRs {
			if c.Contains(a) {
				return true
			}
		}
		return false
	}
}
