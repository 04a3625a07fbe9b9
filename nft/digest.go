package nft

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
)

// RulesDigest identifies the rules of a chain.
//
// Rules are written to the kernel but cannot reasonably be decoded back
// into phrases, so a chain read back from the kernel (Netlink.Load) carries
// a digest of its rules instead: the first rule of every chain nftproxy
// writes whole stores, in its userdata, the digest of all the chain's rules.
// Loading a chain counts its rules and takes the digest from the first one;
// the chain holds the desired rules if the count and the digest match.
//
// Why the first rule and not the chain's own userdata (NFTA_CHAIN_USERDATA,
// Linux ≥ 5.10): the kernel sets a chain's userdata when it creates the
// chain and ignores it on every later NEWCHAIN (nf_tables_updchain has no
// userdata; checked on 6.18 with `nft add chain … { comment … }` twice).
// A chain whose rules the Editor rewrites in place (flush, then rules) would
// keep the digest of its first rules: after a restart with those rules
// desired again, the stale digest would match while the kernel holds other
// rules. A flush deletes the first rule with its digest, so a rule's
// userdata is never stale.
//
// What the digest does not see: a foreign edit that replaces a rule other
// than the first in place, keeping the count (`nft replace rule … handle`).
// The periodic full sync (Config.FullSyncPeriod) repairs that.
type RulesDigest [16]byte

// rulesDigestVersion is hashed into every digest. Bump it when the
// bytecode of a phrase changes while the phrase stays the same (a lowering
// fix), or when digestPhrase changes: chains written by the older version
// then no longer match and are rewritten after an upgrade.
const rulesDigestVersion = 1

// DigestRules returns the digest of a chain's rules in a table of family f:
// the first 16 bytes of the SHA-256 of rulesDigestVersion, the family and
// every rule in a compact binary form (digestPhrase). Two rules with the
// same digest input have the same nft text (TestDigestSeesEveryField).
// Writing the text instead (Rule.Text) made a cold start measurably
// slower; this costs a small part of that (docs/code-figures.md).
func DigestRules(f Family, rules []Rule) RulesDigest {
	d, _ := digestRules(nil, f, rules)
	return d
}

// digestRules is DigestRules writing the digest input to buf, which it
// returns for reuse.
func digestRules(buf []byte, f Family, rules []Rule) (RulesDigest, []byte) {
	buf = append(buf[:0], rulesDigestVersion, byte(f))
	for _, r := range rules {
		buf = binary.AppendUvarint(buf, uint64(len(r.Phrases)))
		for _, p := range r.Phrases {
			buf = digestPhrase(buf, f, p)
		}
		buf = digestString(buf, r.Comment)
	}
	sum := sha256.Sum256(buf)
	var d RulesDigest
	copy(d[:], sum[:])
	return d, buf
}

// Tags of the phrases in the digest input.
const (
	tagOther byte = iota // a phrase digestPhrase does not know: its text
	tagMatchPrefix
	tagMatchSet
	tagMatchL4Proto
	tagMatchCtStateNew
	tagMatchCtStatusDNAT
	tagMatchMarkBits
	tagSetMarkBits
	tagToggleMarkBits
	tagMasquerade
	tagReject
	tagRejectTCPReset
	tagVerdict
	tagVmapLookup
	tagMatchRandom
	tagDNAT
	tagMatchFibLocal
	tagMatchIifname
	tagUpdateSet
	tagDNATMap
	tagMatchCtDirection
	tagDNATPick
)

// digestPhrase appends a phrase's tag and every field of it. A phrase type
// it does not know is appended as its text, which is slower but as exact.
func digestPhrase(b []byte, f Family, p Phrase) []byte {
	switch p := p.(type) {
	case MatchPrefix:
		pr := p.Prefix.Masked()
		b = append(b, tagMatchPrefix, byte(p.Field), digestBool(p.Negate), byte(pr.Bits()))
		return digestAddr(b, pr.Addr())
	case MatchSet:
		b = append(digestFields(append(b, tagMatchSet), p.Fields), digestBool(p.Negate))
		return digestString(b, p.Set)
	case MatchL4Proto:
		return append(b, tagMatchL4Proto, p.Proto)
	case MatchCtStateNew:
		return append(b, tagMatchCtStateNew)
	case MatchCtStatusDNAT:
		return append(b, tagMatchCtStatusDNAT)
	case MatchCtDirection:
		return append(b, tagMatchCtDirection, digestBool(p.Reply))
	case MatchMarkBits:
		return binary.LittleEndian.AppendUint32(append(b, tagMatchMarkBits), p.Mask)
	case SetMarkBits:
		return binary.LittleEndian.AppendUint32(append(b, tagSetMarkBits), p.Bits)
	case ToggleMarkBits:
		return binary.LittleEndian.AppendUint32(append(b, tagToggleMarkBits), p.Bits)
	case Masquerade:
		return append(b, tagMasquerade)
	case Reject:
		return append(b, tagReject)
	case RejectTCPReset:
		return append(b, tagRejectTCPReset)
	case VerdictPhrase:
		return digestString(digestString(append(b, tagVerdict), string(p.Verdict.Kind)), p.Verdict.Chain)
	case VmapLookup:
		return digestString(digestFields(append(b, tagVmapLookup), p.Fields), p.Map)
	case MatchRandom:
		return binary.LittleEndian.AppendUint32(append(b, tagMatchRandom), p.Mod)
	case DNAT:
		return binary.LittleEndian.AppendUint16(digestAddr(append(b, tagDNAT), p.To.Addr()), p.To.Port())
	case MatchFibLocal:
		return append(b, tagMatchFibLocal, byte(p.Field))
	case MatchIifname:
		return digestString(append(b, tagMatchIifname, digestBool(p.Prefix), digestBool(p.Negate)), p.Name)
	case UpdateSet:
		return digestString(append(b, tagUpdateSet, byte(p.Field)), p.Set)
	case DNATMap:
		return digestString(binary.LittleEndian.AppendUint16(append(b, tagDNATMap, p.Proto), p.Slot), p.Map)
	case DNATPick:
		return digestString(binary.LittleEndian.AppendUint32(append(b, tagDNATPick, p.Proto), p.Mod), p.Map)
	}
	return digestString(append(b, tagOther), p.Text(f))
}

func digestBool(v bool) byte {
	if v {
		return 1
	}
	return 0
}

func digestString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func digestFields(b []byte, fields []Field) []byte {
	b = binary.AppendUvarint(b, uint64(len(fields)))
	for _, fd := range fields {
		b = append(b, byte(fd))
	}
	return b
}

// digestAddr appends an address as 16 bytes and whether it is IPv4.
func digestAddr(b []byte, a netip.Addr) []byte {
	a16 := a.As16()
	return append(append(b, digestBool(a.Is4())), a16[:]...)
}

// LoadedRules stands for the rules of a chain read back from the kernel.
type LoadedRules struct {
	Count int // rules in the chain
	// Digest is the digest the first rule carries; HasDigest is false if
	// it carries none (written by someone else, or by an nftproxy older
	// than the digest).
	Digest    RulesDigest
	HasDigest bool
	// Foreign: the chain has a policy other than accept or flags nftproxy
	// never sets; it cannot stand for any chain nftproxy wants.
	Foreign bool
	// Slots are the endpoints-map slots the chain's DNATMap rules draw
	// from, in rule order: whoever assigns slots can keep them across a
	// restart (and the rules and elements then stay as they are).
	Slots []EndpointsSlot
}

// EndpointsSlot is a slot of an endpoints map, as a DNATMap phrase uses it.
type EndpointsSlot struct {
	Map  string
	Slot uint16
}

// DNATMapSlots returns the slots of the DNATMap phrases of rules.
func DNATMapSlots(rules []Rule) []EndpointsSlot {
	var out []EndpointsSlot
	for _, r := range rules {
		for _, p := range r.Phrases {
			if d, ok := p.(DNATMap); ok {
				out = append(out, EndpointsSlot{Map: d.Map, Slot: d.Slot})
			}
		}
	}
	return out
}

// Holds reports whether the loaded chain holds exactly these rules.
func (l *LoadedRules) Holds(f Family, rules []Rule) bool {
	return l.Count == len(rules) && (l.Count == 0 || l.HasDigest && l.Digest == DigestRules(f, rules))
}

// hasRules reports whether the chain holds rules (in the kernel, for a
// loaded chain).
func (c *Chain) hasRules() bool {
	if c.Loaded != nil {
		return c.Loaded.Count > 0
	}
	return len(c.Rules) > 0
}

// sameRules reports whether the committed chain have holds the rules of
// the desired chain want: rule by rule, or for a loaded chain by count and
// digest.
func sameRules(f Family, have, want *Chain) bool {
	if have.Loaded != nil {
		return have.Loaded.Holds(f, want.Rules)
	}
	return rulesEqual(f, have.Rules, want.Rules)
}
