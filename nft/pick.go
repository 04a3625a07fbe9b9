package nft

import (
	"fmt"
	"net/netip"
	"reflect"
)

// MaxPickEndpoints bounds N: Services with more endpoints use a slot of an
// endpoints map (one chain each), which holds any number in a fixed number
// of ranges.
const MaxPickEndpoints = 256

// PickModOK reports whether a pick map can hold n endpoints.
func PickModOK(n uint32) bool { return n >= 1 && n <= MaxPickEndpoints }

// NewPickMap returns an empty pick map of family f for the DNATPick phrases
// of transport protocol proto and n endpoints.
//
// A pick map holds the endpoints of every Service with the same number of
// endpoints N in one exact map, keyed by the Service's address and port and
// a random number below N, so that such a Service needs no chain or rule of
// its own. One DNATPick rule per protocol and N serves all of them:
//
//	service-ips: 10.96.0.10 . tcp . 80 : goto pick-tcp-2
//	chain pick-tcp-2 {
//		dnat ip to ip daddr . tcp dport . numgen random mod 2 map @endpoints-tcp-n2
//	}
//	map endpoints-tcp-n2 {
//		typeof ip daddr . tcp dport . numgen random mod 2 : ip daddr . tcp dport
//		elements = { 10.96.0.10 . 80 . 0 : 10.244.1.11 . 8080,
//			     10.96.0.10 . 80 . 1 : 10.244.1.12 . 8080 }
//	}
//
// The kernel keeps an exact map in a hash: adding or removing an element
// costs the same however large the map, and a change of endpoints is
// element work (no rule, no verdict: no validation of the table). A
// change of N moves the Service's elements to another map and changes its
// dispatch element's goto. A cold start writes no chain and no rule per
// Service, which is most of the kernel's work for the slot shape
// (docs/design-measurements.md, design n). nft 1.0.6 lists and reloads the
// map (declared with typeof, as nft declares it) and the rule; it folds the
// rule's `meta l4proto tcp` into `tcp dport`, as it lists it.
//
// The key's address is the packet's destination, so a pick map serves the
// frontends whose address is the key's: a ClusterIP. The elements are the
// kube-proxy numgen vmap's, one per endpoint, each drawn with probability
// 1/N.
func NewPickMap(f Family, name string, proto uint8, n uint32) *Set {
	at := f.AddrType()
	return &Set{Name: name, Key: []DataType{at, TypeInetService, TypeInteger},
		Data: []DataType{at, TypeInetService}, PickProto: proto, PickMod: n}
}

// CheckPickMap checks the definition of a pick map in a table of family f.
func CheckPickMap(f Family, s *Set) error {
	if !EndpointsProtoOK(s.PickProto) {
		return fmt.Errorf("pick map %q: protocol %s has no pick map", s.Name, ProtoName(s.PickProto))
	}
	if !PickModOK(s.PickMod) {
		return fmt.Errorf("pick map %q: %d endpoints, want 1 to %d", s.Name, s.PickMod, MaxPickEndpoints)
	}
	if s.EndpointsProto != 0 {
		return fmt.Errorf("pick map %q is also an endpoints map", s.Name)
	}
	want := NewPickMap(f, s.Name, s.PickProto, s.PickMod)
	if !reflect.DeepEqual(s.Key, want.Key) || !reflect.DeepEqual(s.Data, want.Data) {
		return fmt.Errorf("pick map %q: type %s, want %s", s.Name, s.TypeString(), want.TypeString())
	}
	if s.Timeout > 0 || s.Dynamic || s.Size > 0 {
		return fmt.Errorf("pick map %q: no timeout, dynamic or size", s.Name)
	}
	return nil
}

// AddPickElements adds to f, in set (a pick map of len(endpoints)), the
// elements that send new connections to addr . port evenly over
// endpoints, their keys and data in f's own space, each with the comment
// (which may be empty).
func (f *Fragment) AddPickElements(set string, addr netip.Addr, port uint16, endpoints []netip.AddrPort, comment string) {
	fields := f.Datums(5 * len(endpoints))
	for j, ep := range endpoints {
		d := fields[5*j : 5*j+5 : 5*j+5]
		d[0], d[1], d[2], d[3], d[4] = Addr(addr), Int(uint32(port)), Int(uint32(j)), Addr(ep.Addr()), Int(uint32(ep.Port()))
		f.Elements = append(f.Elements, SetElement{Set: set, Element: Element{Key: d[:3], Data: d[3:], Comment: comment}})
	}
}

// PickElements returns the elements AddPickElements adds.
func PickElements(addr netip.Addr, port uint16, endpoints []netip.AddrPort) []Element {
	var f Fragment
	f.AddPickElements("", addr, port, endpoints, "")
	out := make([]Element, len(f.Elements))
	for i, e := range f.Elements {
		out[i] = e.Element
	}
	return out
}

// pickTypeofText is the typeof line of a pick map, as nft lists it:
// "ip daddr . tcp dport . numgen random mod 2 : ip daddr . tcp dport".
func pickTypeofText(f Family, proto uint8, n uint32) string {
	return fmt.Sprintf("%s daddr . %s dport . numgen random mod %d : %s daddr . %s dport",
		f, ProtoName(proto), n, f, ProtoName(proto))
}

// DNATPick destination-NATs a new connection to the endpoint a pick map
// (NewPickMap of the same protocol and Mod) holds for the packet's
// destination address and port and a random number below Mod, drawn per
// packet; no element, no DNAT. Packets of other protocols do not match.
// The text is nft's listing (which folds the protocol match into the
// port):
//
//	dnat ip to ip daddr . tcp dport . numgen random mod 2 map @endpoints-tcp-n2
type DNATPick struct {
	Proto uint8 // ProtoTCP, ProtoUDP or ProtoSCTP
	Map   string
	Mod   uint32 // 1 to MaxPickEndpoints
}

func (d DNATPick) Text(f Family) string {
	return fmt.Sprintf("dnat %s to %s daddr . %s dport . numgen random mod %d map @%s",
		f, f, ProtoName(d.Proto), d.Mod, d.Map)
}

func (DNATPick) phrase() {}
