package ruleset

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/trace"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// The localhost NodePorts' rejection (KubeProxyNFTablesLocalhostNodePorts):
// rejectAll is a family without the userspace proxy, rejectProxied one
// whose TCP NodePorts it serves on loopback.
var (
	rejectAll     = LocalhostNodePorts{Reject: []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP}}
	rejectProxied = LocalhostNodePorts{Reject: []uint8{nft.ProtoUDP, nft.ProtoSCTP}}
)

// localhostConfig is the configuration of the localhost golden files:
// NodePorts on the node's IP, loopback ones refused as l says.
func localhostConfig(f nft.Family, l LocalhostNodePorts) Config {
	cfg := fuzzConfig(f)
	cfg.NodePorts = NodePortAddresses{Addresses: []netip.Addr{localhostNodeIP(f)}}
	cfg.LocalhostNodePorts = l
	return cfg
}

func localhostNodeIP(f nft.Family) netip.Addr {
	if f == nft.IPv6 {
		return ip("fd00:10::11")
	}
	return ip("10.10.0.11")
}

// localhostState: NodePorts of every protocol, with and without endpoints,
// and a ClusterIP without NodePort.
func localhostState(f nft.Family) []model.ServicePortState {
	vip, ep := func(s string) netip.Addr { return ip("10.96.2." + s) }, ap("10.244.1.11:8080")
	if f == nft.IPv6 {
		vip, ep = func(s string) netip.Addr { return ip("fd00:96::2:" + s) }, ap("[fd00:244::1:11]:8080")
	}
	eps := []netip.AddrPort{ep}
	return []model.ServicePortState{
		{Name: spName("default", "web", "http", nft.ProtoTCP), ClusterIP: vip("1"), Port: 80, NodePort: 30080,
			Endpoints: eps, LocalEndpoints: eps, LocalReady: 1},
		{Name: spName("default", "web-empty", "http", nft.ProtoTCP), ClusterIP: vip("2"), Port: 80, NodePort: 30081},
		{Name: spName("default", "dns", "dns", nft.ProtoUDP), ClusterIP: vip("3"), Port: 53, NodePort: 30053,
			Endpoints: eps, LocalEndpoints: eps, LocalReady: 1},
		{Name: spName("default", "assoc", "sctp", nft.ProtoSCTP), ClusterIP: vip("4"), Port: 9, NodePort: 30009,
			Endpoints: eps, LocalEndpoints: eps, LocalReady: 1},
		{Name: spName("default", "internal", "http", nft.ProtoTCP), ClusterIP: vip("5"), Port: 80,
			Endpoints: eps, LocalEndpoints: eps, LocalReady: 1},
	}
}

// TestLocalhostGoldens pins the tables with localhost NodePorts refused,
// in both families (the kernel tests load them and compare listings).
func TestLocalhostGoldens(t *testing.T) {
	for _, tc := range localhostGoldens() {
		t.Run(tc.file, func(t *testing.T) { checkGolden(t, tc.file, tc.rs) })
	}
}

type golden struct {
	file string
	rs   *nft.Ruleset
}

func localhostGoldens() []golden {
	return []golden{
		{"localhost-reject.nft", Build(localhostConfig(nft.IPv4, rejectAll), nft.IPv4, localhostState(nft.IPv4))},
		{"localhost-proxied-ip6.nft", Build(localhostConfig(nft.IPv6, rejectProxied), nft.IPv6, localhostState(nft.IPv6))},
	}
}

// TestLocalhostFlows: with the gate, connections from the node to a
// NodePort on a loopback address are refused for the protocols rejected,
// with or without endpoints and whatever listens there; other protocols,
// other ports and other addresses are not touched; nothing is DNATed.
// Without the gate nothing is refused.
func TestLocalhostFlows(t *testing.T) {
	tests := []struct {
		name   string
		f      nft.Family
		l      LocalhostNodePorts
		dst    string
		proto  uint8
		port   uint16
		reject bool
		reason string
	}{
		{name: "tcp to 127.0.0.1", l: rejectAll, dst: "127.0.0.1", proto: nft.ProtoTCP, port: 30080, reject: true},
		{name: "tcp to another loopback address", l: rejectAll, dst: "127.1.2.3", proto: nft.ProtoTCP, port: 30080, reject: true},
		{name: "tcp without endpoints", l: rejectAll, dst: "127.0.0.1", proto: nft.ProtoTCP, port: 30081, reject: true},
		{name: "udp", l: rejectAll, dst: "127.0.0.1", proto: nft.ProtoUDP, port: 30053, reject: true},
		{name: "sctp", l: rejectAll, dst: "127.0.0.1", proto: nft.ProtoSCTP, port: 30009, reject: true},
		{name: "a port that is no NodePort", l: rejectAll, dst: "127.0.0.1", proto: nft.ProtoTCP, port: 8080},
		{name: "a NodePort of another protocol", l: rejectAll, dst: "127.0.0.1", proto: nft.ProtoUDP, port: 30080},
		{name: "tcp, proxied in userspace", l: rejectProxied, dst: "127.0.0.1", proto: nft.ProtoTCP, port: 30080},
		{name: "udp, proxied family", l: rejectProxied, dst: "127.0.0.1", proto: nft.ProtoUDP, port: 30053, reject: true},
		{name: "gate off", dst: "127.0.0.1", proto: nft.ProtoTCP, port: 30080},
		{name: "gate off, udp", dst: "127.0.0.1", proto: nft.ProtoUDP, port: 30053},
		{name: "ipv6 tcp to ::1", f: nft.IPv6, l: rejectAll, dst: "::1", proto: nft.ProtoTCP, port: 30080, reject: true},
		{name: "ipv6 udp to ::1, proxied family", f: nft.IPv6, l: rejectProxied, dst: "::1", proto: nft.ProtoUDP, port: 30053, reject: true},
		{name: "ipv6 tcp to ::1, proxied", f: nft.IPv6, l: rejectProxied, dst: "::1", proto: nft.ProtoTCP, port: 30080},
		{name: "ipv6 gate off", f: nft.IPv6, dst: "::1", proto: nft.ProtoTCP, port: 30080},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f
			if f == 0 {
				f = nft.IPv4
			}
			fk := nftfake.New()
			apply(t, fk, nil, Build(localhostConfig(f, tc.l), f, localhostState(f)))
			dst := ip(tc.dst)
			res := trace.New(fk.Rulesets(), localhostNodeIP(f)).Trace(
				trace.Packet{Src: dst, Dst: dst, Proto: tc.proto, DPort: tc.port, FromNode: true})
			want := nft.VerdictAccept
			if tc.reject {
				want = trace.VerdictReject
			}
			if res.Verdict != want || len(res.DNAT) > 0 {
				t.Errorf("verdict %s dnat %v, want %s and no DNAT\n%v", res.Verdict, res.DNAT, want, res.Path)
			}
			if tc.reject && res.Reason != "NodePorts that refuse connections to loopback" {
				t.Errorf("reason %q", res.Reason)
			}
		})
	}
}

// TestLocalhostNodePortsOff: without the gate the table holds none of the
// objects of localhost NodePorts, and is what it was before them.
func TestLocalhostNodePortsOff(t *testing.T) {
	for _, f := range families {
		off := Build(localhostConfig(f, LocalhostNodePorts{}), f, localhostState(f))
		for name := range off.Sets {
			if strings.HasPrefix(name, "localhost-") {
				t.Errorf("%s: set %s without the gate", f, name)
			}
		}
		for name, c := range off.Chains {
			if strings.HasPrefix(name, "localhost-") {
				t.Errorf("%s: chain %s without the gate", f, name)
			}
			for _, r := range c.Rules {
				if strings.Contains(r.Text(f), "localhost") {
					t.Errorf("%s: chain %s has rule %q without the gate", f, name, r.Text(f))
				}
			}
		}
	}
}

// TestLocalhostElements: every NodePort of a rejected protocol has its
// element, endpoints or not; the counted set holds the protocols
// rejected, and LocalhostRejected reads them back.
func TestLocalhostElements(t *testing.T) {
	for _, tc := range []struct {
		l     LocalhostNodePorts
		ports []string
	}{
		{rejectAll, []string{"sctp . 30009", "tcp . 30080", "tcp . 30081", "udp . 30053"}},
		{rejectProxied, []string{"sctp . 30009", "udp . 30053"}},
	} {
		rs := Build(localhostConfig(nft.IPv4, tc.l), nft.IPv4, localhostState(nft.IPv4))
		var ports []string
		for e := range rs.Sets[mapLocalhostRejectPorts].Elements.All() {
			ports = append(ports, rs.Sets[mapLocalhostRejectPorts].KeyString(e.Key))
			if e.Verdict == nil || e.Verdict.Chain != chainLocalhostReject || e.Comment == "" {
				t.Errorf("element %s", rs.Sets[mapLocalhostRejectPorts].ElementText(e))
			}
		}
		slices.Sort(ports)
		if !slices.Equal(ports, tc.ports) {
			t.Errorf("reject %v: elements %v, want %v", tc.l.Reject, ports, tc.ports)
		}
		var protos []uint8
		for e := range rs.Sets[setLocalhostRejected].Elements.All() {
			p, ok := LocalhostRejected(setLocalhostRejected, e)
			if !ok {
				t.Errorf("LocalhostRejected(%v) not ok", e)
			}
			protos = append(protos, p)
		}
		slices.Sort(protos)
		if !slices.Equal(protos, tc.l.Reject) {
			t.Errorf("counted protocols %v, want %v", protos, tc.l.Reject)
		}
		if _, ok := LocalhostRejected(mapServiceNodePorts, nft.Element{Key: []nft.Datum{nft.Int(6)}}); ok {
			t.Error("LocalhostRejected ok for another set")
		}
	}
}
