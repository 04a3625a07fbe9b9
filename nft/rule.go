package nft

import (
	"fmt"
	"net/netip"
	"strings"
)

// Phrase is one part of a rule: a match or a statement. The set of phrases
// is closed: every phrase type is declared in this file, with the nft text it
// stands for. nftnl/lower.go lowers each to kernel expressions the way nft
// 1.0.6 does (see TestTemplatesListBack), and trace.go evaluates each in the
// Fake. Every phrase lowers to expressions alone, never to an anonymous set
// or map: binding one costs the kernel a walk of the whole transaction, which
// makes a large batch quadratic (see MatchRandom for how a random pick is
// written without one).
type Phrase interface {
	// Text is the phrase as `nft list ruleset` prints it in a table of
	// family f.
	Text(f Family) string
	phrase()
}

// Field is a packet field that can be matched or used in a concatenated
// lookup key.
type Field int

const (
	FieldSrcAddr Field = iota // ip saddr / ip6 saddr
	FieldDstAddr              // ip daddr / ip6 daddr
	FieldL4Proto              // meta l4proto
	FieldDstPort              // th dport
	FieldSrcPort              // th sport
)

// Text returns the field in nft syntax for family f.
func (fd Field) Text(f Family) string {
	switch fd {
	case FieldSrcAddr:
		return f.String() + " saddr"
	case FieldDstAddr:
		return f.String() + " daddr"
	case FieldL4Proto:
		return "meta l4proto"
	case FieldDstPort:
		return "th dport"
	case FieldSrcPort:
		return "th sport"
	}
	return fmt.Sprintf("field(%d)", int(fd))
}

// Type returns the nft data type of the field in family f.
func (fd Field) Type(f Family) DataType {
	switch fd {
	case FieldSrcAddr, FieldDstAddr:
		return f.AddrType()
	case FieldL4Proto:
		return TypeInetProto
	case FieldDstPort, FieldSrcPort:
		return TypeInetService
	}
	return TypeInteger
}

// FieldsText is a concatenation of fields as nft writes it: "ip daddr . tcp dport".
func FieldsText(f Family, fields []Field) string {
	parts := make([]string, len(fields))
	for i, fd := range fields {
		parts[i] = fd.Text(f)
	}
	return strings.Join(parts, " . ")
}

// MatchPrefix matches an address field against a prefix (or, for a full
// length prefix, one address):
//
//	ip daddr 10.96.0.0/12
//	ip saddr != 10.244.0.0/16
//	ip daddr 10.96.0.10
type MatchPrefix struct {
	Field  Field // FieldSrcAddr or FieldDstAddr
	Prefix netip.Prefix
	Negate bool
}

func (m MatchPrefix) Text(f Family) string {
	op := ""
	if m.Negate {
		op = "!= "
	}
	p := m.Prefix.Masked()
	v := p.String()
	if p.Bits() == p.Addr().BitLen() {
		v = p.Addr().String()
	}
	return m.Field.Text(f) + " " + op + v
}

// MatchSet matches when the (concatenated) fields are in a named set:
//
//	ip daddr @cluster-ips
//	ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections
type MatchSet struct {
	Fields []Field
	Set    string
	Negate bool
}

func (m MatchSet) Text(f Family) string {
	op := ""
	if m.Negate {
		op = "!= "
	}
	return FieldsText(f, m.Fields) + " " + op + "@" + m.Set
}

// MatchL4Proto matches the transport protocol:
//
//	meta l4proto tcp
type MatchL4Proto struct{ Proto uint8 }

func (m MatchL4Proto) Text(Family) string { return "meta l4proto " + ProtoName(m.Proto) }

// MatchCtStateNew matches the first packet of a connection:
//
//	ct state new
type MatchCtStateNew struct{}

func (MatchCtStateNew) Text(Family) string { return "ct state new" }

// MatchCtStatusDNAT matches connections that were destination-NATed:
//
//	ct status dnat
type MatchCtStatusDNAT struct{}

func (MatchCtStatusDNAT) Text(Family) string { return "ct status dnat" }

// MatchCtDirection matches the packets of one direction of a connection:
// those of its initiator (original), or those answering them (Reply):
//
//	ct direction original
//	ct direction reply
type MatchCtDirection struct{ Reply bool }

func (m MatchCtDirection) Text(Family) string {
	if m.Reply {
		return "ct direction reply"
	}
	return "ct direction original"
}

// MatchMarkBits matches packets whose mark has any bit of Mask set:
//
//	meta mark & 0x00004000 != 0x00000000
type MatchMarkBits struct{ Mask uint32 }

func (m MatchMarkBits) Text(Family) string {
	return fmt.Sprintf("meta mark & 0x%08x != 0x00000000", m.Mask)
}

// SetMarkBits sets bits in the packet mark:
//
//	meta mark set meta mark | 0x00004000
type SetMarkBits struct{ Bits uint32 }

func (s SetMarkBits) Text(Family) string {
	return fmt.Sprintf("meta mark set meta mark | 0x%08x", s.Bits)
}

// ToggleMarkBits flips bits in the packet mark; used to clear the masquerade
// bit once it has been acted on, so a packet re-entering the stack is not
// masqueraded twice:
//
//	meta mark set meta mark ^ 0x00004000
type ToggleMarkBits struct{ Bits uint32 }

func (s ToggleMarkBits) Text(Family) string {
	return fmt.Sprintf("meta mark set meta mark ^ 0x%08x", s.Bits)
}

// Masquerade source-NATs to the outgoing interface's address:
//
//	masquerade fully-random
type Masquerade struct{}

func (Masquerade) Text(Family) string { return "masquerade fully-random" }

// Reject refuses the packet with an ICMP (ICMPv6) port unreachable, which a
// TCP or UDP client sees at once as "connection refused":
//
//	reject
type Reject struct{}

func (Reject) Text(Family) string { return "reject" }

// RejectTCPReset refuses a TCP packet with a TCP reset; packets of other
// protocols do not match. It lowers to a protocol match and the reject,
// which nft lists as the reject alone:
//
//	reject with tcp reset
//
// A reset reaches the client as "connection refused" at once, where the
// ICMP error of Reject is rate limited by the kernel per destination
// (net.ipv4.icmp_ratelimit: bursts of 6, then one per second), so a client
// retrying quickly would see timeouts instead.
type RejectTCPReset struct{}

func (RejectTCPReset) Text(Family) string { return "reject with tcp reset" }

// VerdictPhrase ends the rule with a verdict:
//
//	jump services
//	goto service-…
//	drop
type VerdictPhrase struct{ Verdict Verdict }

func (v VerdictPhrase) Text(Family) string { return v.Verdict.String() }

// VmapLookup looks the (concatenated) fields up in a verdict map and applies
// the verdict found; no element, no verdict:
//
//	ip daddr . meta l4proto . th dport vmap @service-ips
type VmapLookup struct {
	Fields []Field
	Map    string
}

func (v VmapLookup) Text(f Family) string {
	return FieldsText(f, v.Fields) + " vmap @" + v.Map
}

// MatchRandom matches with probability 1/Mod: it draws a fresh random
// number per packet. A chain of N DNAT rules guarded by mod N, N-1, …, 2
// (the last one unguarded) picks each of N backends with probability 1/N:
//
//	numgen random mod 3 0
type MatchRandom struct{ Mod uint32 }

func (m MatchRandom) Text(Family) string { return fmt.Sprintf("numgen random mod %d 0", m.Mod) }

// DNAT destination-NATs to one backend. A MatchL4Proto must come earlier in
// the rule (nft requires a transport protocol before a port mapping):
//
//	dnat to 10.244.1.11:8080
//	dnat to [fd00:244:1::11]:8080
type DNAT struct{ To netip.AddrPort }

func (d DNAT) Text(Family) string { return "dnat to " + d.To.String() }

// DNATMap destination-NATs a new connection to the endpoint an endpoints
// map (NewEndpointsMap, of the same protocol) holds for a random bucket of
// the phrase's slot, drawn per packet; no element, no DNAT. Packets of
// other protocols do not match (why a map: NewEndpointsMap):
//
//	meta l4proto tcp dnat ip to numgen random mod 65536 offset 131072 map @endpoints-tcp-0
//	meta l4proto udp dnat ip6 to numgen random mod 65536 map @endpoints-udp-0
type DNATMap struct {
	Proto uint8 // ProtoTCP, ProtoUDP or ProtoSCTP
	Map   string
	Slot  uint16 // below EndpointsSlots; its elements come from EndpointsElements(Slot, …)
}

func (d DNATMap) Text(f Family) string {
	offset := ""
	if d.Slot != 0 {
		offset = fmt.Sprintf(" offset %d", uint32(d.Slot)*EndpointBuckets)
	}
	return fmt.Sprintf("meta l4proto %s dnat %s to numgen random mod %d%s map @%s",
		ProtoName(d.Proto), f, EndpointBuckets, offset, d.Map)
}

// MatchFibLocal matches packets whose destination (or source) address is
// one of this node's own addresses, as the routing table sees it:
//
//	fib daddr type local
//	fib saddr type local
type MatchFibLocal struct{ Field Field }

func (m MatchFibLocal) Text(Family) string {
	if m.Field == FieldSrcAddr {
		return "fib saddr type local"
	}
	return "fib daddr type local"
}

// MatchIifname matches the input interface's name, or with Prefix the
// start of it:
//
//	iifname "cbr0"
//	iifname "veth*"
//	iifname != "veth*"
type MatchIifname struct {
	Name   string
	Prefix bool
	Negate bool
}

func (m MatchIifname) Text(Family) string {
	op := ""
	if m.Negate {
		op = "!= "
	}
	name := m.Name
	if m.Prefix {
		name += "*"
	}
	return fmt.Sprintf("iifname %s%q", op, name)
}

// UpdateSet adds the field's value to a dynamic set, or refreshes its
// timeout if it is there (session affinity remembers clients this way):
//
//	update @affinity-… { ip saddr }
type UpdateSet struct {
	Field Field
	Set   string
}

func (u UpdateSet) Text(f Family) string {
	return fmt.Sprintf("update @%s { %s }", u.Set, u.Field.Text(f))
}

// Opaque stands for kernel expressions that are no phrase of nftproxy's,
// found in a rule read back from the kernel (a `counter` someone added, a
// match nftproxy never writes). It names the expressions; nftproxy cannot
// write it, and the tracer assumes it lets the packet through:
//
//	[counter]
type Opaque struct{ Exprs []string }

func (o Opaque) Text(Family) string { return "[" + strings.Join(o.Exprs, " ") + "]" }

func (MatchPrefix) phrase()       {}
func (Opaque) phrase()            {}
func (UpdateSet) phrase()         {}
func (MatchFibLocal) phrase()     {}
func (MatchIifname) phrase()      {}
func (MatchSet) phrase()          {}
func (MatchL4Proto) phrase()      {}
func (MatchCtStateNew) phrase()   {}
func (MatchCtStatusDNAT) phrase() {}
func (MatchCtDirection) phrase()  {}
func (MatchMarkBits) phrase()     {}
func (SetMarkBits) phrase()       {}
func (ToggleMarkBits) phrase()    {}
func (Masquerade) phrase()        {}
func (Reject) phrase()            {}
func (VerdictPhrase) phrase()     {}
func (VmapLookup) phrase()        {}
func (MatchRandom) phrase()       {}
func (RejectTCPReset) phrase()    {}
func (DNAT) phrase()              {}
func (DNATMap) phrase()           {}

// Text returns the rule as nft lists it.
func (r Rule) Text(f Family) string {
	parts := make([]string, 0, len(r.Phrases)+1)
	for _, p := range r.Phrases {
		parts = append(parts, p.Text(f))
	}
	if r.Comment != "" {
		parts = append(parts, fmt.Sprintf("comment %q", r.Comment))
	}
	return strings.Join(parts, " ")
}

// Equal reports whether two rules are the same (same text, same comment).
func (r Rule) Equal(f Family, o Rule) bool { return r.Text(f) == o.Text(f) }

// Convenience constructors, for builders that read like the nft they write.

// Jump returns a "jump chain" phrase.
func Jump(chain string) Phrase { return VerdictPhrase{Verdict{Kind: VerdictJump, Chain: chain}} }

// Goto returns a "goto chain" phrase.
func Goto(chain string) Phrase { return VerdictPhrase{Verdict{Kind: VerdictGoto, Chain: chain}} }

// Drop returns a "drop" phrase.
func Drop() Phrase { return VerdictPhrase{Verdict{Kind: VerdictDrop}} }

// Return returns a "return" phrase.
func Return() Phrase { return VerdictPhrase{Verdict{Kind: VerdictReturn}} }
