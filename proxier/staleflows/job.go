// Package staleflows deletes the conntrack flows a sync made stale. Each
// sync describes what changed in a Job; a Cleaner runs the jobs in a
// goroutine of its own, merging those that queue up, so that a sync never
// waits for a conntrack dump.
package staleflows

import (
	"net/netip"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Job is the conntrack cleanup of one sync in one family: the UDP and SCTP
// flows to a frontend of a changed Service that point at an endpoint that
// no longer serves it (or at no endpoint, created while it had none),
// flows to frontends that are gone, and TCP connection attempts that went
// past a frontend before this sync installed its rules (see
// conntrack.Stale). A sync collects one as it goes through the changed
// Services (Add); the Cleaner merges those that queue up.
type Job struct {
	previous conntrack.Frontends                       // the frontends before
	current  map[model.ServiceName]conntrack.Frontends // each Service's, as of its latest sync
	// opened are the TCP frontends whose rules a sync installed: at a
	// first sync, every one (a slice, not a map: half the memory while
	// the sync's batch is being applied).
	opened         []conntrack.Frontend
	isNodePortAddr func(netip.Addr) bool
}

// NewJob returns an empty job.
func NewJob() *Job {
	return &Job{previous: conntrack.Frontends{}, current: map[model.ServiceName]conntrack.Frontends{}}
}

// Add records that Service name's ports went from old to now: its UDP and
// SCTP frontends before and after, if it has any, and its TCP frontends
// that old did not have.
func (j *Job) Add(name model.ServiceName, old, now []model.ServicePortState) {
	j.opened = addOpened(j.opened, old, now)
	if !hasDatagramPort(old) && !hasDatagramPort(now) {
		return
	}
	addFrontends(j.previous, old)
	cur := conntrack.Frontends{}
	addFrontends(cur, now)
	j.current[name] = cur
}

// Empty reports whether the job has nothing to look for: no UDP or SCTP
// port changed and no TCP frontend was added.
func (j *Job) Empty() bool { return len(j.current) == 0 && len(j.opened) == 0 }

// merge adds newer, a later sync's job of the same family, to j.
func (j *Job) merge(newer *Job) {
	mergeFrontends(j.previous, newer.previous)
	j.opened = append(j.opened, newer.opened...)
	for name, fes := range newer.current {
		j.current[name] = fes
	}
	j.isNodePortAddr = newer.isNodePortAddr
}

// NodePortMatcher returns whether a flow's original destination is one of
// the addresses NodePorts answer on in a family: one of addrs, or inside
// one of cidrs, never a loopback address.
func NodePortMatcher(addrs []netip.Addr, cidrs []netip.Prefix) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		if a.IsLoopback() {
			return false
		}
		for _, x := range addrs {
			if x == a {
				return true
			}
		}
		for _, c := range cidrs {
			if c.Contains(a) {
				return true
			}
		}
		return false
	}
}

func hasDatagramPort(ports []model.ServicePortState) bool {
	for _, sp := range ports {
		if sp.Name.Protocol == nft.ProtoUDP || sp.Name.Protocol == nft.ProtoSCTP {
			return true
		}
	}
	return false
}

// addFrontends adds the UDP and SCTP frontends of the ports, each with
// every endpoint a flow to it may legitimately be DNATed to (cluster-wide
// and local ones: which applies depends on the client).
func addFrontends(out conntrack.Frontends, ports []model.ServicePortState) {
	for _, sp := range ports {
		if sp.Name.Protocol != nft.ProtoUDP && sp.Name.Protocol != nft.ProtoSCTP {
			continue
		}
		eps := append(append([]netip.AddrPort(nil), sp.Endpoints...), sp.LocalEndpoints...)
		eachFrontend(sp, func(fe conntrack.Frontend) { out[fe] = append(out[fe], eps...) })
	}
}

// addOpened appends to out the TCP frontends of now that old does not have
// (conntrack.Stale ignores a TCP frontend's endpoints).
func addOpened(out []conntrack.Frontend, old, now []model.ServicePortState) []conntrack.Frontend {
	var had map[conntrack.Frontend]bool
	for _, sp := range now {
		if sp.Name.Protocol != nft.ProtoTCP {
			continue
		}
		if had == nil && len(old) > 0 {
			had = map[conntrack.Frontend]bool{}
			for _, o := range old {
				if o.Name.Protocol == nft.ProtoTCP {
					eachFrontend(o, func(fe conntrack.Frontend) { had[fe] = true })
				}
			}
		}
		eachFrontend(sp, func(fe conntrack.Frontend) {
			if !had[fe] {
				out = append(out, fe)
			}
		})
	}
	return out
}

// eachFrontend calls fn with each frontend of the port: ClusterIP,
// external IPs, load balancer IPs and NodePort.
func eachFrontend(sp model.ServicePortState, fn func(conntrack.Frontend)) {
	proto := sp.Name.Protocol
	fn(conntrack.Frontend{Proto: proto, Addr: sp.ClusterIP, Port: sp.Port})
	for _, a := range sp.ExternalIPs {
		fn(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
	}
	for _, a := range sp.LoadBalancerIPs {
		fn(conntrack.Frontend{Proto: proto, Addr: a, Port: sp.Port})
	}
	if sp.NodePort != 0 {
		fn(conntrack.Frontend{Proto: proto, Port: sp.NodePort})
	}
}
