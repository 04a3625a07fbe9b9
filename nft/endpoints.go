package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
)

// EndpointBuckets is the number of random buckets of a slot: a DNATMap
// phrase draws numgen random mod 65536.
const EndpointBuckets = 1 << 16

// EndpointsSlots is the number of slots of an endpoints map, 0 to 65534:
// slot s has the keys s·65536 to s·65536+65535, and the end of its last
// range is written as the key after it, which must fit in 32 bits.
const EndpointsSlots = 1<<16 - 1

// NewEndpointsMap returns an empty endpoints map of family f for the DNATMap
// phrases of transport protocol proto (ProtoTCP, ProtoUDP or ProtoSCTP):
//
//	typeof numgen random mod 65536 : ip daddr . tcp dport
//	flags interval
//
// Its key is an integer, its data ipv4_addr . inet_service (ipv6_addr in
// IPv6); every element is a range of buckets of one slot (Element.End),
// see EndpointsElements.
//
// Why a map: a Service's endpoints are elements, so that an endpoint
// change is element work only. A rule holding any expression with a
// validate op (nat, immediate verdicts, lookups…) makes the kernel validate
// the whole table when it is committed (nf_tables_commit →
// nf_tables_validate), which grows with the table however small the change
// (docs/code-figures.md); adding and removing elements needs no
// validation. So one DNATMap rule picks the endpoint from an endpoints map
// instead of a cascade of per-endpoint rules. Each Service (each endpoint
// set: cluster, local) owns a slot of an endpoints map: the rule draws a
// random bucket in the slot's range of keys per new connection, and the
// map's elements are ranges of buckets, one per endpoint:
//
//	meta l4proto tcp dnat ip to numgen random mod 65536 offset 131072 map @endpoints-tcp-0
//
//	map endpoints-tcp-0 {
//		typeof numgen random mod 65536 : ip daddr . tcp dport
//		flags interval
//		elements = { 131072-163839 : 10.244.1.11 . 8080,
//			     163840-196607 : 10.244.1.12 . 8080 }
//	}
//
// (slot 2: keys 2·65536 to 3·65536−1). The key is one integer, so the
// kernel keeps the map in an rbtree: an element change costs O(log n), and
// nft 1.0.6 lists the map as above. A key such as `ip daddr . tcp dport .
// numgen …` would need no slots, but an interval map with a concatenated
// key is either pipapo, which rebuilds its lookup tables on every change,
// or an rbtree that nft 1.0.6 crashes listing (docs/design-measurements.md).
// The map is declared as nft 1.0.6 declares this `typeof` map (key byte
// order host, the typeof userdata), captured with `nft --debug=mnl`.
//
// One map per transport protocol, with `tcp dport` in the data's typeof:
// nft evaluates a rule's port mapping against the map's data expression,
// so a map typed `tcp dport` cannot serve a `udp` rule ("conflicting
// protocols specified: udp vs. tcp"). With a protocol per map, the listing
// reloads with `nft -f`.
func NewEndpointsMap(f Family, name string, proto uint8) *Set {
	at := f.AddrType()
	return &Set{Name: name, Key: []DataType{TypeInteger},
		Data: []DataType{at, TypeInetService}, EndpointsProto: proto}
}

// EndpointsElements returns the elements of an endpoints map that send the
// new connections of the DNATMap phrase with this slot evenly over the
// endpoints: the slot's buckets split into len(endpoints) consecutive
// ranges whose sizes differ by at most one, in the endpoints' order.
// Beyond EndpointBuckets endpoints, the rest get no bucket.
func EndpointsElements(slot uint16, endpoints []netip.AddrPort) []Element {
	n := min(len(endpoints), EndpointBuckets)
	out := make([]Element, n)
	fields := make([]Datum, 3*n) // one allocation for every key and data
	for j := range n {
		out[j] = endpointsElement(slot, endpoints, j, fields[3*j:3*j+3:3*j+3])
	}
	return out
}

// AddEndpointsElements adds to f, in set, the elements EndpointsElements
// returns, their keys and data in f's own space (Fragment.Datums), each
// with the comment (which may be empty).
func (f *Fragment) AddEndpointsElements(set string, slot uint16, endpoints []netip.AddrPort, comment string) {
	n := min(len(endpoints), EndpointBuckets)
	fields := f.Datums(3 * n)
	for j := range n {
		e := endpointsElement(slot, endpoints, j, fields[3*j:3*j+3:3*j+3])
		e.Comment = comment
		f.Elements = append(f.Elements, SetElement{Set: set, Element: e})
	}
}

// endpointsElement is the element of endpoints[j] among the first n of
// them, its key and data in fields (3 of them).
func endpointsElement(slot uint16, endpoints []netip.AddrPort, j int, fields []Datum) Element {
	n := min(len(endpoints), EndpointBuckets)
	base := uint32(slot) * EndpointBuckets
	lo, hi := bucketRange(j, n)
	ep := endpoints[j]
	fields[0], fields[1], fields[2] = Int(base+lo), Addr(ep.Addr()), Int(uint32(ep.Port()))
	return Element{Key: fields[:1:1], End: base + hi, Data: fields[1:]}
}

// SlotEndpoints returns the endpoints an endpoints map (nil: none) holds
// for a slot, in the order of their ranges of buckets: what
// EndpointsElements was given.
func SlotEndpoints(s *Set, slot uint16) []netip.AddrPort {
	if s == nil {
		return nil
	}
	var found []Element
	for e := range s.Elements.All() {
		if ElementSlot(e) == uint32(slot) {
			found = append(found, e)
		}
	}
	slices.SortFunc(found, func(a, b Element) int { return cmp.Compare(a.Key[0].Int, b.Key[0].Int) })
	out := make([]netip.AddrPort, len(found))
	for i, e := range found {
		out[i] = netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int))
	}
	return out
}

// ElementSlot is the slot an endpoints map element belongs to.
func ElementSlot(e Element) uint32 { return e.Key[0].Int / EndpointBuckets }

// bucketRange is the range of buckets of endpoint j of n.
func bucketRange(j, n int) (lo, hi uint32) {
	return uint32(j * EndpointBuckets / n), uint32((j+1)*EndpointBuckets/n - 1)
}

// EndpointsProtoOK reports whether proto can have an endpoints map: a
// transport protocol with a destination port at offset 2 that nft names.
func EndpointsProtoOK(proto uint8) bool {
	return proto == ProtoTCP || proto == ProtoUDP || proto == ProtoSCTP
}

// CheckEndpointsMap checks the definition of an endpoints map in a table of
// family f.
func CheckEndpointsMap(f Family, s *Set) error {
	if !EndpointsProtoOK(s.EndpointsProto) {
		return fmt.Errorf("endpoints map %q: protocol %s has no endpoints map", s.Name, ProtoName(s.EndpointsProto))
	}
	want := NewEndpointsMap(f, s.Name, s.EndpointsProto)
	if !reflect.DeepEqual(s.Key, want.Key) || !reflect.DeepEqual(s.Data, want.Data) {
		return fmt.Errorf("endpoints map %q: type %s, want %s", s.Name, s.TypeString(), want.TypeString())
	}
	if s.Timeout > 0 || s.Dynamic || s.Size > 0 {
		return fmt.Errorf("endpoints map %q: no timeout, dynamic or size", s.Name)
	}
	return nil
}

// CheckRange checks an element's range of buckets: in an endpoints map,
// within one slot.
func CheckRange(s *Set, e Element) error {
	if s.EndpointsProto == 0 {
		if e.End != 0 {
			return fmt.Errorf("element %s of set %q has a range end", s.KeyString(e.Key), s.Name)
		}
		return nil
	}
	lo, slot := e.Key[0].Int, ElementSlot(e)
	if lo > e.End || slot != e.End/EndpointBuckets || slot >= EndpointsSlots {
		return fmt.Errorf("element %s of endpoints map %q: keys %d-%d, want lo ≤ hi in one slot below %d",
			s.KeyString(e.Key), s.Name, lo, e.End, EndpointsSlots)
	}
	return nil
}

// endpointsTypeofText is the typeof line of an endpoints map, as nft lists
// it: "numgen random mod 65536 : ip daddr . tcp dport".
func endpointsTypeofText(f Family, proto uint8) string {
	return fmt.Sprintf("numgen random mod %d : %s daddr . %s dport", EndpointBuckets, f, ProtoName(proto))
}
