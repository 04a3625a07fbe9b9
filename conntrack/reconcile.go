package conntrack

import (
	"net/netip"

	"golang.org/x/sys/unix"
)

// Protocol numbers of the flows the reconciler looks at. A TCP flow that
// was ever answered is never deleted: a TCP client notices a dead backend
// (RST or timeout) and reconnects, and deleting an established TCP flow
// would break a connection that may still work (upstream kube-proxy leaves
// TCP alone). Only a TCP connection attempt that went past a frontend
// before its rules existed is deleted (see Stale).
const (
	ProtoTCP  uint8 = unix.IPPROTO_TCP
	ProtoUDP  uint8 = unix.IPPROTO_UDP
	ProtoSCTP uint8 = unix.IPPROTO_SCTP
)

// Frontend is where clients send service traffic: Addr:Port over Proto
// for a ClusterIP, ExternalIP or LoadBalancer IP. For a NodePort, Addr is
// the zero netip.Addr and means "any of this node's NodePort addresses".
type Frontend struct {
	Proto uint8
	Addr  netip.Addr
	Port  uint16
}

// Frontends maps each frontend of one IP family to its serving endpoints
// (address and target port), possibly none. The proxier builds it from
// its model after each sync; the reconciler only reads it.
type Frontends map[Frontend][]netip.AddrPort

// Tuple is one direction of a flow as conntrack records it.
type Tuple struct {
	Src, Dst netip.AddrPort
}

// Flow is one conntrack entry: its original tuple (as the client sent it)
// and its reply tuple (as the backend answers; for a DNAT'd flow, Reply.Src
// is the endpoint).
type Flow struct {
	Proto       uint8
	Orig, Reply Tuple
	// Zone is the conntrack zone (CTA_ZONE): the kernel looks a tuple up
	// within its zone, so a delete must name it.
	Zone uint16
	// ID is the kernel's id of the entry (CTA_ID, Linux ≥ 2.6.14). A delete
	// that carries it removes exactly the entry that was dumped, never a
	// newer one that reused the tuple after the dump (the kernel answers
	// ENOENT instead). 0 means unknown: delete by tuple alone.
	ID uint32
	// Unanswered: no packet ever came back (IPS_SEEN_REPLY is clear;
	// conntrack -L prints [UNREPLIED]).
	Unanswered bool
}

// Stale returns the flows to delete after a sync that changed the
// frontends from previous to current (both of one IP family, as flows).
// For each flow, the frontend it was sent to is looked up by its original
// destination: first exactly (Proto, Addr, Port), then as a NodePort
// (Proto, Port) when isNodePortAddr accepts the destination address — the
// order in which our ruleset dispatches. A nil isNodePortAddr accepts every
// address, which is what upstream kube-proxy does (it matches NodePort
// flows by port alone).
//
// A UDP or SCTP flow is stale when:
//   - its frontend is current and has endpoints, and its reply source is
//     not one of them: it is DNAT'd to an endpoint that is gone or no
//     longer serving, or it was created while the frontend had no
//     endpoints and was never DNAT'd (upstream before v1.37 skipped
//     frontends without endpoints and never cleaned the second kind, which
//     black-holed a client that kept sending while the Service was scaled
//     to zero: kubernetes#139628);
//   - its frontend is a Service IP (ClusterIP, ExternalIP, LoadBalancer
//     IP) that is current and has no endpoints: nothing may answer there,
//     DNAT'd or not, and deleted, the flow's next packet is new and meets
//     the reject rule, so the client hears that the Service has no
//     endpoints (upstream since v1.37 does the same);
//   - its frontend is a NodePort that is current and has no endpoints, and
//     the flow is DNAT'd (reply source ≠ original destination): its
//     backend is gone. An un-DNAT'd flow to the port stays: a NodePort is
//     matched by port and node address only, so it may be another
//     program's traffic (upstream, which matches NodePorts on port alone,
//     cleans none of a NodePort's flows while it has no endpoints);
//   - its frontend is not current but was previous: the Service was
//     deleted, or lost that ClusterIP, ExternalIP, LoadBalancer IP,
//     NodePort, port or protocol. Upstream does not clean these.
//
// A TCP frontend in current means that its rules were just installed
// (previous is not consulted for TCP, nor endpoints). A TCP flow to it is
// stale when it was never DNAT'd and never answered: a connection attempt
// that went past before the rules existed (at a node's first sync, say).
// Conntrack keeps such an attempt in SYN_SENT for two minutes, and every
// retransmission of its SYN, or a new connection from the same source
// port, belongs to it and skips the NAT hook: the client is refused (or
// black-holed) although the Service works. Deleted, the next SYN makes a
// new flow that the rules DNAT. Upstream does not clean these.
//
// Every other flow is left alone, including flows that reach an endpoint
// directly.
func Stale(flows []Flow, previous, current Frontends, isNodePortAddr func(netip.Addr) bool) []Flow {
	cur := newFrontendIndex(current)
	prev := newFrontendIndex(previous)
	var stale []Flow
	for _, fl := range flows {
		if isStale(fl, cur, prev, isNodePortAddr) {
			stale = append(stale, fl)
		}
	}
	return stale
}

func isStale(fl Flow, cur, prev *frontendIndex, isNodePortAddr func(netip.Addr) bool) bool {
	switch fl.Proto {
	case ProtoTCP:
		_, ok := cur.lookup(fl, isNodePortAddr)
		return ok && fl.Unanswered && !dnated(fl)
	case ProtoUDP, ProtoSCTP:
	default:
		return false
	}
	if fe, ok := cur.lookup(fl, isNodePortAddr); ok {
		if cur.hasEndpoints(fe) {
			return !cur.serves(fe, fl.Reply.Src)
		}
		return fe.Addr.IsValid() || dnated(fl) // a Service IP, or a NodePort (no address)
	}
	_, ok := prev.lookup(fl, isNodePortAddr)
	return ok
}

// dnated reports whether the flow's destination was rewritten.
func dnated(fl Flow) bool { return unmap(fl.Reply.Src) != unmap(fl.Orig.Dst) }

// frontendIndex answers, per flow, "which frontend" and "is this an
// endpoint of it" with map lookups, so that deciding costs the same with
// 1 or 1,000 endpoints per frontend. Addresses are unmapped (see unmap).
type frontendIndex struct {
	endpointCount map[Frontend]int
	endpoints     map[frontendEndpoint]struct{}
}

type frontendEndpoint struct {
	fe Frontend
	ep netip.AddrPort
}

func newFrontendIndex(fes Frontends) *frontendIndex {
	ix := &frontendIndex{
		endpointCount: make(map[Frontend]int, len(fes)),
		endpoints:     map[frontendEndpoint]struct{}{},
	}
	for fe, eps := range fes {
		fe.Addr = fe.Addr.Unmap()
		if _, seen := ix.endpointCount[fe]; !seen {
			ix.endpointCount[fe] = 0
		}
		for _, ep := range eps {
			key := frontendEndpoint{fe, unmap(ep)}
			if _, dup := ix.endpoints[key]; !dup {
				ix.endpoints[key] = struct{}{}
				ix.endpointCount[fe]++
			}
		}
	}
	return ix
}

// lookup finds the frontend a flow was sent to.
func (ix *frontendIndex) lookup(fl Flow, isNodePortAddr func(netip.Addr) bool) (Frontend, bool) {
	dst := unmap(fl.Orig.Dst)
	fe := Frontend{Proto: fl.Proto, Addr: dst.Addr(), Port: dst.Port()}
	if _, ok := ix.endpointCount[fe]; ok {
		return fe, true
	}
	fe.Addr = netip.Addr{}
	if _, ok := ix.endpointCount[fe]; ok && (isNodePortAddr == nil || isNodePortAddr(dst.Addr())) {
		return fe, true
	}
	return Frontend{}, false
}

func (ix *frontendIndex) hasEndpoints(fe Frontend) bool { return ix.endpointCount[fe] > 0 }

func (ix *frontendIndex) serves(fe Frontend, ep netip.AddrPort) bool {
	_, ok := ix.endpoints[frontendEndpoint{fe, unmap(ep)}]
	return ok
}

// unmap turns an IPv4-mapped IPv6 address into IPv4, so that a caller's
// ::ffff:10.0.0.1 and the kernel's 10.0.0.1 compare equal.
func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
