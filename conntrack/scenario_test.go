package conntrack

import (
	"fmt"
	"net/netip"
	"slices"
)

// world gives each case of staleCases its own addresses and ports, so
// that all cases of a family can share one kernel table.
type world struct {
	family Family
	proto  uint8 // the protocol under test (UDP or SCTP)
	k      int   // the case number
}

func (w world) v6() bool { return w.family == IPv6 }

// pi separates the addresses of the UDP, SCTP and TCP runs of a case.
func (w world) pi() int {
	switch w.proto {
	case ProtoSCTP:
		return 1
	case ProtoTCP:
		return 2
	}
	return 0
}

func (w world) addr(v4, v6 string) netip.Addr {
	if w.v6() {
		return netip.MustParseAddr(v6)
	}
	return netip.MustParseAddr(v4)
}

// cip is a service IP (ClusterIP, ExternalIP or LB IP) number n.
func (w world) cip(n int) netip.Addr {
	return w.addr(fmt.Sprintf("10.%d.%d.%d", 96+w.pi(), w.k, n), fmt.Sprintf("fd00:96:%d::%d:%d", w.pi(), w.k, n))
}

// ep is endpoint number n.
func (w world) ep(n int) netip.AddrPort {
	return netip.AddrPortFrom(w.addr(fmt.Sprintf("10.%d.%d.%d", 244+w.pi(), w.k, n), fmt.Sprintf("fd00:244:%d::%d:%d", w.pi(), w.k, n)), 5353)
}

// node is this node's NodePort address; other is an address that is not.
func (w world) node() netip.Addr  { return w.addr("10.0.0.1", "fd00:10::1") }
func (w world) other() netip.Addr { return w.addr("10.0.0.2", "fd00:10::2") }

func (w world) isNodePortAddr(a netip.Addr) bool { return a == w.node() }

// nodePort is NodePort number i of the case.
func (w world) nodePort(i int) uint16 { return uint16(30000 + 1000*w.pi() + 10*w.k + i) }

func (w world) fe(a netip.Addr, port uint16) Frontend {
	return Frontend{Proto: w.proto, Addr: a, Port: port}
}

func (w world) np(i int) Frontend { return Frontend{Proto: w.proto, Port: w.nodePort(i)} }

func (w world) client(n int) netip.AddrPort {
	return netip.AddrPortFrom(w.addr(fmt.Sprintf("10.%d.%d.%d", 1+w.pi(), w.k, n), fmt.Sprintf("fd00:1:%d::%d:%d", w.pi(), w.k, n)), uint16(40000+n))
}

// nat is client n's flow to dst DNAT'd to ep.
func (w world) nat(n int, dst, ep netip.AddrPort) Flow {
	return natFlow(w.proto, w.client(n), dst, ep)
}

// direct is client n's flow to dst, not DNAT'd: created while the frontend
// had no endpoints, or not service traffic at all.
func (w world) direct(n int, dst netip.AddrPort) Flow { return w.nat(n, dst, dst) }

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

func eps(e ...netip.AddrPort) []netip.AddrPort { return e }

// scenario is one change of frontends and the flows it makes stale or not.
type scenario struct {
	previous, current Frontends
	stale, kept       []Flow
}

// staleCases are the cases of issue 3, each for UDP and SCTP, IPv4 and
// IPv6 (world decides which).
var staleCases = []struct {
	name  string
	build func(w world) scenario
}{
	{"endpoint removed (one flow in conntrack zone 7)", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		zoned := w.nat(3, ap(svc.Addr, 53), w.ep(1))
		zoned.Zone = 7
		return scenario{
			previous: Frontends{svc: eps(w.ep(1), w.ep(2))},
			current:  Frontends{svc: eps(w.ep(2))},
			stale:    []Flow{w.nat(1, ap(svc.Addr, 53), w.ep(1)), zoned},
			kept:     []Flow{w.nat(2, ap(svc.Addr, 53), w.ep(2))},
		}
	}},
	{"endpoint no longer serving (terminating, not ready): the proxier leaves it out of current", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1), w.ep(2), w.ep(3))},
			current:  Frontends{svc: eps(w.ep(1), w.ep(3))},
			stale:    []Flow{w.nat(2, ap(svc.Addr, 53), w.ep(2))},
			kept:     []Flow{w.nat(1, ap(svc.Addr, 53), w.ep(1)), w.nat(3, ap(svc.Addr, 53), w.ep(3))},
		}
	}},
	{"endpoint replaced: new pod, new address", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1))},
			current:  Frontends{svc: eps(w.ep(2))},
			stale:    []Flow{w.nat(1, ap(svc.Addr, 53), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(svc.Addr, 53), w.ep(2))},
		}
	}},
	{"target port changed: same pod, new port", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1))},
			current:  Frontends{svc: eps(ap(w.ep(1).Addr(), 6000))},
			stale:    []Flow{w.nat(1, ap(svc.Addr, 53), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(svc.Addr, 53), ap(w.ep(1).Addr(), 6000))},
		}
	}},
	{"scaled to zero: every flow to the Service IP goes, DNAT'd or not (as upstream since v1.37)", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1))},
			current:  Frontends{svc: nil},
			stale:    []Flow{w.nat(1, ap(svc.Addr, 53), w.ep(1)), w.direct(2, ap(svc.Addr, 53))},
			kept:     []Flow{w.direct(3, ap(svc.Addr, 54)), w.direct(4, w.ep(1))},
		}
	}},
	{"NodePort scaled to zero: DNAT'd flows go, un-DNAT'd stay (upstream cleans neither)", func(w world) scenario {
		np := w.np(1)
		return scenario{
			previous: Frontends{np: eps(w.ep(1))},
			current:  Frontends{np: nil},
			stale:    []Flow{w.nat(1, ap(w.node(), np.Port), w.ep(1))},
			kept:     []Flow{w.direct(2, ap(w.node(), np.Port)), w.nat(3, ap(w.other(), np.Port), w.ep(1))},
		}
	}},
	{"Service without endpoints, unchanged: flows to its IP go (a node's first sync)", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: nil},
			current:  Frontends{svc: nil},
			stale:    []Flow{w.direct(1, ap(svc.Addr, 53))},
		}
	}},
	{"scaled zero to one: flows created without endpoints go (kubernetes#139628)", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: nil},
			current:  Frontends{svc: eps(w.ep(1))},
			stale:    []Flow{w.direct(1, ap(svc.Addr, 53))},
			kept:     []Flow{w.nat(2, ap(svc.Addr, 53), w.ep(1))},
		}
	}},
	{"Service deleted: its ClusterIP flows go, DNAT'd or not", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1))},
			current:  Frontends{},
			stale:    []Flow{w.nat(1, ap(svc.Addr, 53), w.ep(1)), w.direct(2, ap(svc.Addr, 53))},
			kept:     []Flow{w.direct(3, w.ep(1))},
		}
	}},
	{"ExternalIP removed", func(w world) scenario {
		cluster, external := w.fe(w.cip(1), 53), w.fe(w.cip(2), 53)
		return scenario{
			previous: Frontends{cluster: eps(w.ep(1)), external: eps(w.ep(1))},
			current:  Frontends{cluster: eps(w.ep(1))},
			stale:    []Flow{w.nat(1, ap(external.Addr, 53), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(cluster.Addr, 53), w.ep(1))},
		}
	}},
	{"LoadBalancer IP changed", func(w world) scenario {
		cluster, lb1, lb2 := w.fe(w.cip(1), 53), w.fe(w.cip(3), 53), w.fe(w.cip(4), 53)
		return scenario{
			previous: Frontends{cluster: eps(w.ep(1)), lb1: eps(w.ep(1))},
			current:  Frontends{cluster: eps(w.ep(1)), lb2: eps(w.ep(1))},
			stale:    []Flow{w.nat(1, ap(lb1.Addr, 53), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(cluster.Addr, 53), w.ep(1)), w.nat(3, ap(lb2.Addr, 53), w.ep(1))},
		}
	}},
	{"ClusterIP changed (Service recreated)", func(w world) scenario {
		old, cur := w.fe(w.cip(1), 53), w.fe(w.cip(2), 53)
		return scenario{
			previous: Frontends{old: eps(w.ep(1))},
			current:  Frontends{cur: eps(w.ep(1))},
			stale:    []Flow{w.nat(1, ap(old.Addr, 53), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(cur.Addr, 53), w.ep(1))},
		}
	}},
	{"NodePort endpoint removed; flows to other addresses on that port stay", func(w world) scenario {
		np := w.np(1)
		port := np.Port
		return scenario{
			previous: Frontends{np: eps(w.ep(1), w.ep(2))},
			current:  Frontends{np: eps(w.ep(2))},
			stale:    []Flow{w.nat(1, ap(w.node(), port), w.ep(1)), w.direct(3, ap(w.node(), port))},
			kept:     []Flow{w.nat(2, ap(w.node(), port), w.ep(2)), w.nat(4, ap(w.other(), port), w.ep(1))},
		}
	}},
	{"NodePort changed", func(w world) scenario {
		svc, old, cur := w.fe(w.cip(1), 53), w.np(1), w.np(2)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1)), old: eps(w.ep(1))},
			current:  Frontends{svc: eps(w.ep(1)), cur: eps(w.ep(1))},
			stale:    []Flow{w.nat(1, ap(w.node(), old.Port), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(w.node(), cur.Port), w.ep(1)), w.nat(3, ap(svc.Addr, 53), w.ep(1))},
		}
	}},
	{"NodePort removed (type NodePort to ClusterIP)", func(w world) scenario {
		svc, np := w.fe(w.cip(1), 53), w.np(1)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1)), np: eps(w.ep(1))},
			current:  Frontends{svc: eps(w.ep(1))},
			stale:    []Flow{w.nat(1, ap(w.node(), np.Port), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(svc.Addr, 53), w.ep(1)), w.nat(3, ap(w.other(), np.Port), w.ep(1))},
		}
	}},
	{"NodePort scaled zero to one", func(w world) scenario {
		np := w.np(1)
		return scenario{
			previous: Frontends{np: nil},
			current:  Frontends{np: eps(w.ep(1))},
			stale:    []Flow{w.direct(1, ap(w.node(), np.Port))},
			kept:     []Flow{w.nat(2, ap(w.node(), np.Port), w.ep(1))},
		}
	}},
	{"port changed", func(w world) scenario {
		old, cur := w.fe(w.cip(1), 53), w.fe(w.cip(1), 54)
		return scenario{
			previous: Frontends{old: eps(w.ep(1))},
			current:  Frontends{cur: eps(w.ep(1))},
			stale:    []Flow{w.nat(1, ap(old.Addr, 53), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(cur.Addr, 54), w.ep(1))},
		}
	}},
	{"protocol changed", func(w world) scenario {
		other := ProtoTCP // UDP to TCP
		if w.proto == ProtoSCTP {
			other = ProtoUDP // SCTP to UDP
		}
		old := w.fe(w.cip(1), 53)
		cur := Frontend{Proto: other, Addr: old.Addr, Port: 53}
		return scenario{
			previous: Frontends{old: eps(w.ep(1))},
			current:  Frontends{cur: eps(w.ep(1))},
			stale:    []Flow{w.nat(1, ap(old.Addr, 53), w.ep(1))},
			kept:     []Flow{natFlow(other, w.client(2), ap(old.Addr, 53), w.ep(1))},
		}
	}},
	{"TCP is never touched", func(w world) scenario {
		svc := Frontend{Proto: ProtoTCP, Addr: w.cip(1), Port: 80}
		gone := Frontend{Proto: ProtoTCP, Addr: w.cip(2), Port: 80}
		return scenario{
			previous: Frontends{svc: eps(w.ep(1)), gone: eps(w.ep(1)), w.fe(w.cip(3), 53): eps(w.ep(1))},
			current:  Frontends{svc: eps(w.ep(2)), w.fe(w.cip(3), 53): eps(w.ep(1))},
			kept: []Flow{
				natFlow(ProtoTCP, w.client(1), ap(svc.Addr, 80), w.ep(1)),
				natFlow(ProtoTCP, w.client(2), ap(svc.Addr, 80), ap(svc.Addr, 80)),
				natFlow(ProtoTCP, w.client(3), ap(gone.Addr, 80), w.ep(1)),
			},
		}
	}},
	{"unrelated flows stay", func(w world) scenario {
		svc := w.fe(w.cip(1), 53)
		return scenario{
			previous: Frontends{svc: eps(w.ep(1)), w.np(1): eps(w.ep(1))},
			current:  Frontends{svc: eps(w.ep(2)), w.np(1): eps(w.ep(2))},
			kept: []Flow{
				w.direct(1, w.ep(1)),                      // straight to a pod
				w.direct(2, ap(svc.Addr, 54)),             // the service IP, another port
				w.direct(3, ap(w.cip(9), 53)),             // another address
				w.direct(4, ap(w.node(), w.nodePort(5))),  // the node, not a NodePort
				w.direct(5, ap(w.other(), w.nodePort(1))), // a NodePort's port, not a node address
			},
		}
	}},
	{"an exact frontend wins over a NodePort on the same address", func(w world) scenario {
		np := w.np(1)
		external := w.fe(w.node(), np.Port) // an ExternalIP that is also a node address
		return scenario{
			previous: Frontends{np: eps(w.ep(1)), external: eps(w.ep(2))},
			current:  Frontends{np: eps(w.ep(1)), external: eps(w.ep(2))},
			stale:    []Flow{w.nat(1, ap(w.node(), np.Port), w.ep(1))},
			kept:     []Flow{w.nat(2, ap(w.node(), np.Port), w.ep(2))},
		}
	}},
}

// unanswered is flow fl as conntrack holds a connection attempt nothing
// answered.
func unanswered(fl Flow) Flow {
	fl.Unanswered = true
	return fl
}

// tcpCases are the TCP cases: a TCP frontend in current is one whose rules
// were just installed, and only the attempts that went past it before they
// existed are stale.
var tcpCases = []struct {
	name  string
	build func(w world) scenario
}{
	{"new ClusterIP: the attempt that went past its rules is stale, nothing else", func(w world) scenario {
		svc, other := w.fe(w.cip(1), 80), w.fe(w.cip(2), 80)
		return scenario{
			current: Frontends{svc: nil},
			stale:   []Flow{unanswered(w.direct(1, ap(svc.Addr, 80)))},
			kept: []Flow{
				w.direct(2, ap(svc.Addr, 80)),                   // answered: someone else's connection
				unanswered(w.nat(3, ap(svc.Addr, 80), w.ep(1))), // DNATed: the rules' own attempt
				w.nat(4, ap(svc.Addr, 80), w.ep(1)),             // an established connection
				unanswered(w.direct(5, ap(svc.Addr, 81))),       // another port
				unanswered(w.direct(6, ap(other.Addr, 80))),     // a frontend not new
			},
		}
	}},
	{"new NodePort: attempts to this node's address only", func(w world) scenario {
		np := w.np(1)
		return scenario{
			current: Frontends{np: nil},
			stale:   []Flow{unanswered(w.direct(1, ap(w.node(), np.Port)))},
			kept:    []Flow{unanswered(w.direct(2, ap(w.other(), np.Port)))},
		}
	}},
	{"endpoints do not matter, nor a previous frontend", func(w world) scenario {
		svc, gone := w.fe(w.cip(1), 80), w.fe(w.cip(2), 80)
		return scenario{
			previous: Frontends{gone: eps(w.ep(1))},
			current:  Frontends{svc: eps(w.ep(1))},
			stale:    []Flow{unanswered(w.direct(1, ap(svc.Addr, 80)))},
			kept: []Flow{
				w.nat(2, ap(svc.Addr, 80), w.ep(2)),  // to an endpoint no longer listed
				w.nat(3, ap(gone.Addr, 80), w.ep(1)), // to a frontend that is gone
				unanswered(w.direct(4, ap(gone.Addr, 80))),
			},
		}
	}},
}

// all returns a scenario's flows, stale and kept interleaved.
func (sc scenario) all() []Flow {
	var out []Flow
	for i := range max(len(sc.stale), len(sc.kept)) {
		if i < len(sc.kept) {
			out = append(out, sc.kept[i])
		}
		if i < len(sc.stale) {
			out = append(out, sc.stale[i])
		}
	}
	return out
}

// client returns a distinct client address and port for flow i (i < 2²⁴).
func client(i int) netip.AddrPort {
	a := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
	return netip.AddrPortFrom(a, uint16(20000+i>>16))
}

// natFlow is a flow from c to frontend fe DNAT'd to endpoint ep.
func natFlow(proto uint8, c, fe, ep netip.AddrPort) Flow {
	return Flow{Proto: proto, Orig: Tuple{Src: c, Dst: fe}, Reply: Tuple{Src: ep, Dst: c}}
}

// bigTable returns n flows, of which the first stale are stale after a
// change from previous to current: 4 UDP ClusterIPs with 8 endpoints each,
// whose flows are spread over the endpoints; one endpoint of the first is
// removed and had stale flows. Every tenth flow is TCP, to a TCP Service
// whose endpoints are all gone (TCP is never touched).
func bigTable(n, stale int) (flows []Flow, previous, current Frontends) {
	previous, current = Frontends{}, Frontends{}
	fe := func(f int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(10 + f)}), 53)
	}
	ep := func(f, j int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(f), byte(j)}), 5353)
	}
	removed := ep(0, 99)
	for f := range 4 {
		key := Frontend{Proto: ProtoUDP, Addr: fe(f).Addr(), Port: 53}
		for j := 1; j <= 8; j++ {
			current[key] = append(current[key], ep(f, j))
		}
		previous[key] = slices.Clone(current[key])
	}
	fe0 := Frontend{Proto: ProtoUDP, Addr: fe(0).Addr(), Port: 53}
	previous[fe0] = append(previous[fe0], removed)
	tcpFE := netip.MustParseAddrPort("10.96.0.20:80")
	previous[Frontend{Proto: ProtoTCP, Addr: tcpFE.Addr(), Port: 80}] = []netip.AddrPort{netip.MustParseAddrPort("10.244.9.1:8080")}
	current[Frontend{Proto: ProtoTCP, Addr: tcpFE.Addr(), Port: 80}] = []netip.AddrPort{netip.MustParseAddrPort("10.244.9.2:8080")}

	flows = make([]Flow, 0, n)
	for i := range n {
		switch {
		case i < stale:
			flows = append(flows, natFlow(ProtoUDP, client(i), fe(0), removed))
		case i%10 == 0:
			flows = append(flows, natFlow(ProtoTCP, client(i), tcpFE, netip.MustParseAddrPort("10.244.9.1:8080")))
		default:
			flows = append(flows, natFlow(ProtoUDP, client(i), fe(i%4), ep(i%4, i/4%8+1)))
		}
	}
	return flows, previous, current
}
