package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Family is an IP family of the conntrack table. Its values are the
// address families (AF_INET, AF_INET6), which are also the nftables
// families NFPROTO_IPV4 and NFPROTO_IPV6: conntrack.Family(nft.IPv4) is
// IPv4 (proxier's TestConntrackFamilies), without this package importing nft.
type Family uint8

const (
	IPv4 Family = unix.AF_INET
	IPv6 Family = unix.AF_INET6
)

// String returns the family as Kubernetes names it: the ip_family label
// of the metrics.
func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// contains reports whether a flow belongs to this family.
func (f Family) contains(fl Flow) bool { return familyOf(fl) == uint8(f) }

// familyOf is the address family of a flow, from its original source.
func familyOf(fl Flow) uint8 {
	if fl.Orig.Src.Addr().Unmap().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// Interface deletes the stale flows of one IP family after a sync. The
// proxier calls it after a successful transaction that changed a UDP or
// SCTP frontend or its endpoints, or added a TCP frontend; Netlink does it
// in the kernel, Fake in memory.
type Interface interface {
	// Reconcile dumps the family's flows of the protocols Stale looks at
	// (UDP and SCTP that previous or current use, TCP that current uses,
	// and of TCP only the flows never answered nor DNATed; nothing at all
	// when there is no such frontend), decides with Stale and deletes what
	// is stale.
	// isNodePortAddr may be nil (see Stale). On error, Result still
	// counts what was done.
	//
	// current is called twice: before the dump, for the protocols, and
	// after it, for the decision. A caller that commits rules while a
	// Reconcile runs returns, the second time, the frontends of those
	// rules too, so that a flow they created in the meantime is not
	// judged by the older ones.
	Reconcile(ctx context.Context, family Family, previous Frontends, current func() Frontends, isNodePortAddr func(netip.Addr) bool) (Result, error)
}

// Fixed returns current frontends that do not change during a Reconcile.
func Fixed(current Frontends) func() Frontends { return func() Frontends { return current } }

// Result describes one Reconcile.
type Result struct {
	Dumped  int // flows read from the kernel (after its protocol filter)
	Stale   int // flows Stale chose
	Deleted int // flows the kernel deleted; stale flows that expired meanwhile are not counted

	Dump    time.Duration // reading the table
	Decide  time.Duration // Stale
	Delete  time.Duration // the delete batches, ACKs included
	Elapsed time.Duration // everything, socket included
}

// protocols returns the protocols whose flows a Reconcile looks at, in a
// fixed order: UDP and SCTP when previous or current has a frontend of
// them, TCP when current has one (see Stale).
func protocols(previous, current Frontends) []uint8 {
	var tcp, udp, sctp bool
	for i, fes := range []Frontends{previous, current} {
		for fe := range fes {
			tcp = tcp || (i == 1 && fe.Proto == ProtoTCP)
			udp = udp || fe.Proto == ProtoUDP
			sctp = sctp || fe.Proto == ProtoSCTP
		}
	}
	var out []uint8
	if udp {
		out = append(out, ProtoUDP)
	}
	if sctp {
		out = append(out, ProtoSCTP)
	}
	if tcp {
		out = append(out, ProtoTCP)
	}
	return out
}

// String describes a flow in errors and logs, in conntrack -L's order.
func (fl Flow) String() string {
	s := fmt.Sprintf("proto %d %s -> %s reply %s -> %s", fl.Proto, fl.Orig.Src, fl.Orig.Dst, fl.Reply.Src, fl.Reply.Dst)
	if fl.Zone != 0 {
		s += fmt.Sprintf(" zone %d", fl.Zone)
	}
	return s
}
