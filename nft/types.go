package nft

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Family is an nftables table family. nftproxy uses one table per IP family.
type Family uint8

const (
	IPv4 Family = unix.NFPROTO_IPV4
	IPv6 Family = unix.NFPROTO_IPV6
)

// String returns the family as nft writes it ("ip" or "ip6").
func (f Family) String() string {
	switch f {
	case IPv4:
		return "ip"
	case IPv6:
		return "ip6"
	}
	return fmt.Sprintf("family(%d)", uint8(f))
}

// IPFamily is the family as Kubernetes names it ("IPv4", "IPv6"): the
// ip_family label of the metrics, the family in health reports.
func (f Family) IPFamily() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// AddrType is the nft data type of an address of this family.
func (f Family) AddrType() DataType {
	if f == IPv6 {
		return TypeIPv6Addr
	}
	return TypeIPv4Addr
}

// Contains reports whether a belongs to this family.
func (f Family) Contains(a netip.Addr) bool {
	if f == IPv6 {
		return a.Is6() && !a.Is4In6()
	}
	return a.Is4()
}

// Unspecified is the family's unspecified address (0.0.0.0, ::).
func (f Family) Unspecified() netip.Addr {
	if f == IPv6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// Loopback is the family's loopback prefix: 127.0.0.0/8, or ::1/128.
func (f Family) Loopback() netip.Prefix {
	if f == IPv6 {
		return netip.PrefixFrom(netip.IPv6Loopback(), 128)
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{127, 0, 0, 0}), 8)
}

// DataType is an nft set key or data type. Magic is the type number nft
// stores in NFTA_SET_KEY_TYPE (nftables src/datatype.h); Len is the number of
// bytes of the value in the kernel.
type DataType struct {
	Name  string
	Magic uint32
	Len   int
}

var (
	TypeVerdict     = DataType{Name: "verdict", Magic: 1, Len: 0}
	TypeInteger     = DataType{Name: "integer", Magic: 4, Len: 4}
	TypeIPv4Addr    = DataType{Name: "ipv4_addr", Magic: 7, Len: 4}
	TypeIPv6Addr    = DataType{Name: "ipv6_addr", Magic: 8, Len: 16}
	TypeInetProto   = DataType{Name: "inet_proto", Magic: 12, Len: 1}
	TypeInetService = DataType{Name: "inet_service", Magic: 13, Len: 2}
	TypeMark        = DataType{Name: "mark", Magic: 19, Len: 4}
)

// Protocol numbers used in keys (inet_proto).
const (
	ProtoTCP  uint8 = unix.IPPROTO_TCP
	ProtoUDP  uint8 = unix.IPPROTO_UDP
	ProtoSCTP uint8 = unix.IPPROTO_SCTP
)

// ProtoName returns the name nft prints for an inet_proto value.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	case ProtoSCTP:
		return "sctp"
	}
	return fmt.Sprint(p)
}

// Hook is a netfilter hook a base chain attaches to.
type Hook string

const (
	HookPrerouting  Hook = "prerouting"
	HookInput       Hook = "input"
	HookForward     Hook = "forward"
	HookOutput      Hook = "output"
	HookPostrouting Hook = "postrouting"
)

// ChainType is the type of a base chain.
type ChainType string

const (
	ChainFilter ChainType = "filter"
	ChainNAT    ChainType = "nat"
)

// Standard base chain priorities (nftables src/rule.c). Other components rely
// on these being exactly upstream kube-proxy's.
const (
	PriorityDstNAT          int32 = -100
	PriorityFilter          int32 = 0
	PrioritySrcNAT          int32 = 100
	PriorityPreDstNATFilter int32 = -110 // dstnat - 10: firewall checks before DNAT
)

// BaseChain describes where a base chain is attached. Its policy is always
// accept: nftproxy only ever adds verdicts for traffic it owns.
type BaseChain struct {
	Type     ChainType
	Hook     Hook
	Priority int32
}

// Chain is a chain and its rules, in order.
type Chain struct {
	Name  string
	Base  *BaseChain // nil for a regular chain
	Rules []Rule
	// Loaded is set, instead of Rules, on a chain read back from the
	// kernel (see Loader and digest.go); nil on chains nftproxy builds.
	Loaded *LoadedRules
}

// Rule is a sequence of phrases evaluated left to right, as in nft syntax,
// with an optional comment.
type Rule struct {
	Phrases []Phrase
	Comment string
}

// Set is a named set or map. A set has no Data; a verdict map has
// Data == []DataType{TypeVerdict}; a data map has the data types.
type Set struct {
	Name    string
	Key     []DataType // more than one: a concatenation
	Data    []DataType
	Timeout time.Duration // > 0: elements expire (flags timeout)
	Dynamic bool          // updated from the packet path (flags dynamic)
	Size    uint32        // 0: no size
	Comment string
	// Counter gives every element a counter of the packets and bytes that
	// matched it (`counter` in the set's declaration: the kernel attaches
	// the set's expressions to each element added without its own, Linux
	// 5.12+). A dispatch map looked up only for a connection's first
	// packet so counts new connections per element.
	Counter bool
	// EndpointsProto, when not zero, makes the set the endpoints map of the
	// DNATMap phrases for this transport protocol (see NewEndpointsMap):
	// its elements are ranges of random buckets, and Key and Data must be
	// as NewEndpointsMap sets them.
	EndpointsProto uint8
	// PickProto, when not zero, makes the set the pick map of the
	// DNATPick phrases for this transport protocol and PickMod endpoints
	// (see NewPickMap); Key and Data must be as NewPickMap sets them.
	PickProto uint8
	PickMod   uint32
	Elements  Elements
}

// IsMap reports whether the set maps keys to data.
func (s *Set) IsMap() bool { return len(s.Data) > 0 }

// IsVerdictMap reports whether the set maps keys to verdicts.
func (s *Set) IsVerdictMap() bool { return len(s.Data) == 1 && s.Data[0] == TypeVerdict }

// Datum is one field of an element key or data: an address, or an integer
// (protocol, port, mark).
type Datum struct {
	Addr netip.Addr
	Int  uint32
}

// Addr returns an address datum.
func Addr(a netip.Addr) Datum { return Datum{Addr: a} }

// Int returns an integer datum (inet_proto, inet_service, mark, integer).
func Int(v uint32) Datum { return Datum{Int: v} }

// Element is one element of a set or map.
type Element struct {
	Key     []Datum
	Data    []Datum  // data map value
	Verdict *Verdict // verdict map value
	Comment string
	// End, in an endpoints map, is the last key of the element's range,
	// which starts at Key[0].Int (both in the same slot, see
	// EndpointsElements). nft lists the range as "lo-hi", or "lo" alone if
	// End equals it. Zero in any other set.
	End uint32
}

// VerdictKind is what a verdict does.
type VerdictKind string

const (
	VerdictAccept VerdictKind = "accept"
	VerdictDrop   VerdictKind = "drop"
	VerdictReturn VerdictKind = "return"
	VerdictJump   VerdictKind = "jump"
	VerdictGoto   VerdictKind = "goto"
)

// Verdict is a verdict, with a target chain for jump and goto.
type Verdict struct {
	Kind  VerdictKind
	Chain string
}

func (v Verdict) String() string {
	if v.Chain != "" {
		return string(v.Kind) + " " + v.Chain
	}
	return string(v.Kind)
}

// Ruleset is the complete content of table TableName in one family.
type Ruleset struct {
	Family Family
	Chains map[string]*Chain
	Sets   map[string]*Set
	// Generation is the ruleset generation a Loader read it at (see
	// GenerationReader); 0 for a ruleset that was not read back.
	Generation uint32
}

// NewRuleset returns an empty ruleset for a family.
func NewRuleset(f Family) *Ruleset {
	return &Ruleset{Family: f, Chains: map[string]*Chain{}, Sets: map[string]*Set{}}
}

// AddChain adds (or replaces) a chain and returns it.
func (r *Ruleset) AddChain(c *Chain) *Chain {
	r.Chains[c.Name] = c
	return c
}

// AddSet adds (or replaces) a set and returns it.
func (r *Ruleset) AddSet(s *Set) *Set {
	r.Sets[s.Name] = s
	return s
}

// AddElement adds an element to the named set; it panics if the set is not
// part of the ruleset, which is a programming error in a ruleset builder.
func (r *Ruleset) AddElement(set string, e Element) {
	s, ok := r.Sets[set]
	if !ok {
		panic("nft: AddElement to unknown set " + set)
	}
	s.Elements.Put(e)
}

// Append adds a rule to the end of a chain; it panics if the chain is not
// part of the ruleset.
func (r *Ruleset) Append(chain string, rule Rule) {
	c, ok := r.Chains[chain]
	if !ok {
		panic("nft: Append to unknown chain " + chain)
	}
	c.Rules = append(c.Rules, rule)
}

// SortedSetNames returns the set names sorted.
func (r *Ruleset) SortedSetNames() []string {
	names := make([]string, 0, len(r.Sets))
	for n := range r.Sets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// datumText formats one field the way nft lists it.
func datumText(t DataType, d Datum) string {
	switch t {
	case TypeIPv4Addr, TypeIPv6Addr:
		return d.Addr.String()
	case TypeInetProto:
		return ProtoName(uint8(d.Int))
	case TypeMark:
		return fmt.Sprintf("0x%08x", d.Int)
	}
	return fmt.Sprint(d.Int)
}

func tupleText(types []DataType, ds []Datum) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		t := TypeInteger
		if i < len(types) {
			t = types[i]
		}
		parts[i] = datumText(t, d)
	}
	return strings.Join(parts, " . ")
}

// KeyString is the nft text of an element key; it identifies the element.
// In an endpoints map an element is identified by the first key of its
// range (ranges cannot overlap).
// It is built by elementKey, the fast equivalent of tupleText.
func (s *Set) KeyString(key []Datum) string { return elementKey(s, key) }

// ElementKeyText is the element's key as nft lists it: KeyString, and in an
// endpoints map the range of keys, "131072-163839".
func (s *Set) ElementKeyText(e Element) string {
	t := s.KeyString(e.Key)
	if s.EndpointsProto != 0 && len(e.Key) > 0 && e.End != e.Key[len(e.Key)-1].Int {
		t += fmt.Sprintf("-%d", e.End)
	}
	return t
}

// ValueString is the nft text of an element's value ("" for a plain set).
func (s *Set) ValueString(e Element) string {
	if e.Verdict != nil {
		return e.Verdict.String()
	}
	if len(e.Data) > 0 {
		return tupleText(s.Data, e.Data)
	}
	return ""
}

// TypeString is the nft text of the set's type, e.g.
// "ipv4_addr . inet_proto . inet_service : verdict".
func (s *Set) TypeString() string {
	names := func(ts []DataType) string {
		p := make([]string, len(ts))
		for i, t := range ts {
			p[i] = t.Name
		}
		return strings.Join(p, " . ")
	}
	if s.IsMap() {
		return names(s.Key) + " : " + names(s.Data)
	}
	return names(s.Key)
}

// Clone returns a deep copy of the ruleset (rules are immutable values and
// are shared).
func (r *Ruleset) Clone() *Ruleset {
	out := NewRuleset(r.Family)
	out.Generation = r.Generation
	for n, c := range r.Chains {
		cc := *c
		cc.Rules = append([]Rule(nil), c.Rules...)
		out.Chains[n] = &cc
	}
	for n, s := range r.Sets {
		sc := *s
		sc.Elements = s.Elements.Clone()
		out.Sets[n] = &sc
	}
	return out
}

// MaxComment is the longest comment: its TLV (type, length, the string
// and a NUL) must fit the kernel's NFT_USERDATA_MAXLEN (256) bytes of
// userdata, which a 254-byte comment the one-byte length allows would not.
const MaxComment = unix.NFT_USERDATA_MAXLEN - 3
