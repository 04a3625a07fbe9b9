// Package fuzzstate decodes a fuzz input into API state as the watch layer
// converts it, for the fuzz targets of proxier/model and proxier/ruleset:
// every value holds what watch guarantees (DNS-1123 names, at most one
// ClusterIP per family, ports unique by name and by protocol and number,
// known protocols, usable addresses of the slice's family), and nothing
// more. Values come from small pools, so that Services share ClusterIPs,
// external and load balancer IPs and NodePorts, slices share endpoints, and slices point at
// missing Services, as a cluster's objects may between two syncs (or
// written straight into etcd).
package fuzzstate

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// State is a node and the Services and EndpointSlices it sees.
type State struct {
	Node     model.Node
	Services []*model.Service
	Slices   []*model.EndpointSlice
}

// SlicesOf returns the slices of Service name in family f.
func (s State) SlicesOf(f nft.Family, name model.ServiceName) []*model.EndpointSlice {
	var out []*model.EndpointSlice
	for _, es := range s.Slices {
		if es.Service == name && es.Family == f {
			out = append(out, es)
		}
	}
	return out
}

// Pools of values. The node is NodeName, in zone "a", at NodeAddrs.
var (
	long63 = strings.Repeat("x", 62) + "9"

	NodeName  = "n1"
	NodeAddrs = []netip.Addr{netip.MustParseAddr("10.10.0.11"), netip.MustParseAddr("fd00:10::11")}

	namespaces = []string{"default", "kube-system", long63, "1ns"}
	names      = []string{"web", "dns", long63, "0svc", "a"}
	portNames  = []string{"", "http", "dns", long63, "p-1"}
	protos     = []uint8{nft.ProtoTCP, nft.ProtoUDP, nft.ProtoSCTP}
	ports      = []uint16{80, 53, 1, 65535, 8080}
	nodePorts  = []uint16{0, 30080, 30053, 32767}
	nodeNames  = []string{"", NodeName, "n2", "n3"}
	zones      = []string{"a", "b", ""}
	timeouts   = []time.Duration{0, 10 * time.Second, 3 * time.Hour}
	ranges     = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("0.0.0.0/0"),
		netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("198.51.100.7/32")}
)

// addr returns the address n after base.
func addr(base string, n int) netip.Addr {
	a := netip.MustParseAddr(base).AsSlice()
	low := int(a[len(a)-2])<<8 | int(a[len(a)-1]) + n
	a[len(a)-2], a[len(a)-1] = byte(low>>8), byte(low)
	ip, _ := netip.AddrFromSlice(a)
	return ip
}

// bases are the blocks of each family that addresses are taken from.
var bases = map[nft.Family]struct{ cluster, external, endpoints string }{
	nft.IPv4: {"10.96.0.0", "192.0.2.0", "10.244.0.0"},
	nft.IPv6: {"fd00:96::", "2001:db8:2::", "fd00:2440:1234:5678:9abc:def0:1234:1000"}, // long in names
}

// bytes hands out the bytes of a fuzz input, zeros once they run out.
type bytes []byte

func (b *bytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

func pick[T any](b *bytes, from []T) T { return from[int(b.next())%len(from)] }

// family returns IPv4 or IPv6 by the next byte.
func (b *bytes) family() nft.Family {
	if b.next()&1 == 0 {
		return nft.IPv4
	}
	return nft.IPv6
}

// ManyPorts is the number of ports of a Service with many, and
// ManyEndpoints of endpoints in a slice with many: more than the API
// server's limit of 1,000 per slice.
const (
	ManyPorts     = 100
	ManyEndpoints = 1500
)

func manyPortName(i int) string { return "p" + strconv.Itoa(i) }

// Decode builds a State from data; every input gives one. Each field takes
// one byte (Seeds writes them in the same order).
func Decode(data []byte) State {
	b := bytes(data)
	st := State{Node: model.Node{Name: NodeName, Zone: pick(&b, zones), Addresses: NodeAddrs,
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}}}
	for n := int(b.next()) % 6; n > 0; n-- {
		svc := service(&b)
		if !slices.ContainsFunc(st.Services, func(s *model.Service) bool { return s.Name == svc.Name }) { // names are keys
			st.Services = append(st.Services, svc)
		}
	}
	for n := int(b.next()) % 8; n > 0; n-- {
		st.Slices = append(st.Slices, slice(&b, st.Services))
	}
	return st
}

func service(b *bytes) *model.Service {
	svc := &model.Service{Name: model.ServiceName{Namespace: pick(b, namespaces), Name: pick(b, names)}}
	v4, v6 := addr(bases[nft.IPv4].cluster, int(b.next()%8)), addr(bases[nft.IPv6].cluster, int(b.next()%8))
	switch b.next() % 3 {
	case 0:
		svc.ClusterIPs = []netip.Addr{v4}
	case 1:
		svc.ClusterIPs = []netip.Addr{v6}
	default:
		svc.ClusterIPs = []netip.Addr{v6, v4}
	}
	names, numbers := map[string]bool{}, map[[2]int]bool{}
	add := func(p model.ServicePort) {
		if names[p.Name] || numbers[[2]int{int(p.Protocol), int(p.Port)}] {
			return // the watch layer keeps the first
		}
		names[p.Name], numbers[[2]int{int(p.Protocol), int(p.Port)}] = true, true
		svc.Ports = append(svc.Ports, p)
	}
	if n := int(b.next()) % 5; n < 4 {
		for ; n > 0; n-- {
			add(model.ServicePort{Name: pick(b, portNames), Protocol: pick(b, protos), Port: pick(b, ports), NodePort: pick(b, nodePorts)})
		}
	} else {
		for i := range ManyPorts {
			add(model.ServicePort{Name: manyPortName(i), Protocol: nft.ProtoTCP, Port: uint16(1000 + i)})
		}
	}
	flags := b.next()
	svc.ExternalLocal, svc.InternalLocal = flags&1 != 0, flags&2 != 0
	if flags&4 != 0 {
		svc.HealthCheckNodePort = 32000
	}
	svc.AffinityTimeout = pick(b, timeouts)
	for n := b.next() % 3; n > 0; n-- {
		svc.ExternalIPs = append(svc.ExternalIPs, addr(bases[b.family()].external, int(b.next()%4)))
	}
	for n := b.next() % 3; n > 0; n-- {
		svc.LoadBalancerIPs = append(svc.LoadBalancerIPs, addr(bases[b.family()].external, 3+int(b.next()%4)))
	}
	for n := b.next() % 3; n > 0; n-- {
		svc.SourceRanges = append(svc.SourceRanges, pick(b, ranges))
	}
	return svc
}

func slice(b *bytes, svcs []*model.Service) *model.EndpointSlice {
	f := b.family()
	es := &model.EndpointSlice{Family: f, Name: "slice-" + string(rune('a'+b.next()%26))}
	if i := int(b.next()); i < 200 && len(svcs) > 0 {
		es.Service = svcs[i%len(svcs)].Name
	} else { // a slice whose Service is not (yet, or any more) there
		es.Service = model.ServiceName{Namespace: pick(b, namespaces), Name: "gone"}
	}
	for n := b.next() % 4; n > 0; n-- {
		es.Ports = append(es.Ports, model.EndpointPort{Name: pick(b, portNames), Protocol: pick(b, protos), Port: pick(b, ports)})
	}
	manyPorts := b.next() == 255
	if manyPorts { // one port for each of a Service's many
		for i := range ManyPorts {
			es.Ports = append(es.Ports, model.EndpointPort{Name: manyPortName(i), Protocol: nft.ProtoTCP, Port: uint16(2000 + i)})
		}
	}
	n := int(b.next()) % 9
	if n == 8 && !manyPorts { // both at once: a slow input, testing nothing more
		n = ManyEndpoints
	}
	base := bases[f].endpoints
	for i := 0; i < n; i++ {
		var e model.Endpoint
		if n == ManyEndpoints {
			e.IP, e.Ready, e.Serving = model.IPOf(addr(base, 256+i)), true, true
		} else {
			e.IP = model.IPOf(addr(base, int(b.next()%12)))
			c := b.next()
			e.Ready, e.Serving, e.Terminating = c&1 != 0, c&2 != 0, c&4 != 0
			p := &model.Placement{NodeName: pick(b, nodeNames)}
			if h := b.next(); h&3 != 0 {
				if h&1 != 0 {
					p.Zones = []string{pick(b, zones)}
				}
				if h&2 != 0 {
					p.Nodes = []string{pick(b, nodeNames[1:])}
				}
			}
			if p.NodeName != "" || p.Zones != nil || p.Nodes != nil {
				e.Place = p
			}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}
