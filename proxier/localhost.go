package proxier

// The TCP NodePorts a family's userspace proxy serves on its loopback
// address (Config.LocalhostProxied), gathered per Service as a sync goes
// through the Services, and handed over after each successful sync.

import (
	"cmp"
	"maps"
	"reflect"
	"slices"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/localnodeport"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// LocalhostNodePortProxy serves TCP NodePorts on a family's loopback
// address (proxier/localnodeport.Proxy).
type LocalhostNodePortProxy interface {
	// Sync makes the listeners those of ports, by NodePort.
	Sync(ports map[uint16]localnodeport.Port) error
	// Pending reports that the last Sync could not bind a port, to be
	// tried again.
	Pending() bool
}

// localhostPort is one TCP NodePort of a Service for the proxy.
type localhostPort struct {
	nodePort uint16
	port     localnodeport.Port
}

// syncLocalhostPorts records the TCP NodePorts of a Service's ports for
// family f's userspace proxy, if it has one: each goes to the endpoints
// its external traffic goes to (this node's with externalTrafficPolicy:
// Local), as upstream's.
func (p *Proxier) syncLocalhostPorts(f nft.Family, fs *familyState, name model.ServiceName, ports []model.ServicePortState) {
	if p.deps.LocalhostNodePorts[f] == nil {
		return
	}
	var lp []localhostPort
	for _, sp := range ports {
		if sp.NodePort == 0 || sp.Name.Protocol != nft.ProtoTCP {
			continue
		}
		eps := sp.Endpoints
		if sp.ExternalLocal {
			eps = sp.LocalEndpoints
		}
		lp = append(lp, localhostPort{nodePort: sp.NodePort,
			port: localnodeport.Port{Service: sp.Name.String(), Endpoints: eps, AffinityTimeout: sp.AffinityTimeout}})
	}
	if reflect.DeepEqual(fs.localhostPorts[name], lp) {
		return
	}
	fs.localhostChanged = true
	if len(lp) == 0 {
		delete(fs.localhostPorts, name)
	} else {
		fs.localhostPorts[name] = lp
	}
}

// syncLocalhostNodePorts hands family f's TCP NodePorts to its userspace
// proxy when they changed, or when a port could not be bound at the last
// handover. Ports that cannot be bound are logged and counted by the
// proxy and retried; they do not fail the sync. Two Services claiming one
// NodePort (the API's allocator prevents it) serve the first by name.
func (p *Proxier) syncLocalhostNodePorts(f nft.Family, fs *familyState) {
	lp := p.deps.LocalhostNodePorts[f]
	if lp == nil || !fs.localhostChanged && !lp.Pending() {
		return
	}
	ports := make(map[uint16]localnodeport.Port, len(fs.localhostPorts))
	names := slices.SortedFunc(maps.Keys(fs.localhostPorts), func(a, b model.ServiceName) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, name := range names {
		for _, l := range fs.localhostPorts[name] {
			if other, taken := ports[l.nodePort]; taken {
				klog.V(2).InfoS("Two Services claim one NodePort; the localhost proxy serves the first", "ipFamily", f.IPFamily(),
					"nodePort", l.nodePort, "served", other.Service, "ignored", l.port.Service)
				continue
			}
			ports[l.nodePort] = l.port
		}
	}
	_ = lp.Sync(ports)
	fs.localhostChanged = false
}
