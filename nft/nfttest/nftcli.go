package nfttest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// NftFeature is something of nft's language that nftproxy's tables, as
// nft 1.0.6 lists them, use and that not every release's nft reads, with
// a ruleset that uses it (ProbeNft checks it with `nft -c -f`).
type NftFeature struct {
	Name    string
	ruleset string
}

// The NftFeatures. Debian 11's nft 0.9.8 lacks all three; 1.0.6, 1.1.3
// and 1.1.7 have them.
var (
	// NftNumgenInConcatTypeof: a map declared by a typeof whose key
	// concatenates a numgen expression, as a pick map is (`typeof ip
	// daddr . tcp dport . numgen random mod 3 : …`), and a lookup of
	// such a key (`dnat ip to ip daddr . tcp dport . numgen random mod 3
	// map @…`). An nft without it lists a pick map by its key type (`type
	// ipv4_addr . inet_service . mark : …`, nftnl's setKeyMagic) and the
	// numgen field of its elements in hexadecimal, and cannot reload the
	// lookup it lists.
	NftNumgenInConcatTypeof = NftFeature{"a numgen expression in a concatenation (a pick map's typeof and lookups)",
		"table ip t {\n\tmap m {\n\t\ttypeof ip daddr . tcp dport . numgen random mod 2 : ip daddr . tcp dport\n\t}\n}\n"}
	// NftCounterInMap: `counter` in a map's declaration (sets with
	// counted elements).
	NftCounterInMap = NftFeature{"counter in a map's declaration",
		"table ip t {\n\tmap m {\n\t\ttype ipv4_addr : verdict\n\t\tcounter\n\t}\n}\n"}
	// NftDNATToConcatMap: DNAT to an address and a port looked up
	// together in one map, written `dnat ip to … map @m`. An nft without
	// it writes and lists `dnat ip addr . port to … map @m`.
	NftDNATToConcatMap = NftFeature{"dnat to an address and port from one map (dnat ip to … map)",
		"table ip t {\n\tmap m {\n\t\ttype mark : ipv4_addr . inet_service\n\t}\n\tchain c {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tmeta l4proto tcp dnat ip to meta mark map @m\n\t}\n}\n"}
)

// NftFeatures are every NftFeature, for ProbeNft.
var NftFeatures = []NftFeature{NftNumgenInConcatTypeof, NftCounterInMap, NftDNATToConcatMap}

// NftLanguage is what an nft reads of what nftproxy's tables use.
type NftLanguage struct {
	// Version is the nft's own, as `nft --version` prints it ("v1.0.6").
	Version string
	// Lacks are the NftFeatures it cannot read.
	Lacks []NftFeature
}

// ProbeNft asks an nft for its version and which NftFeatures it reads.
// run runs that nft with args and stdin, where `nft -c -f -` can check a
// ruleset against the kernel (it commits nothing), e.g. in a test's
// network namespace.
func ProbeNft(run func(stdin string, args ...string) (string, error)) (NftLanguage, error) {
	var l NftLanguage
	out, err := run("", "--version")
	if err != nil {
		return l, err
	}
	l.Version = strings.TrimSpace(out)
	for _, f := range strings.Fields(out) {
		if strings.HasPrefix(f, "v") && strings.Contains(f, ".") {
			l.Version = f
			break
		}
	}
	for _, f := range NftFeatures {
		if _, err := run(f.ruleset, "-c", "-f", "-"); err != nil {
			l.Lacks = append(l.Lacks, f)
		}
	}
	return l, nil
}

// systemNft is the nft on the PATH, probed once per test binary.
var systemNft struct {
	once sync.Once
	l    NftLanguage
	err  error
}

// SystemNft returns what the nft on the PATH reads (ProbeNft), probed
// once per test binary with run, which runs that nft (`nft args…`) in a
// test's network namespace.
func SystemNft(t testing.TB, run func(stdin string, args ...string) (string, error)) NftLanguage {
	t.Helper()
	systemNft.once.Do(func() { systemNft.l, systemNft.err = ProbeNft(run) })
	if systemNft.err != nil {
		t.Fatalf("probe nft: %v", systemNft.err)
	}
	return systemNft.l
}

// Has says whether the nft reads f.
func (l NftLanguage) Has(f NftFeature) bool {
	for _, m := range l.Lacks {
		if m.Name == f.Name {
			return false
		}
	}
	return true
}

// Missing says what the nft lacks, e.g. "nft v0.9.8 lacks counter in a
// map's declaration; …", or "" when it lacks nothing.
func (l NftLanguage) Missing() string {
	if len(l.Lacks) == 0 {
		return ""
	}
	names := make([]string, len(l.Lacks))
	for i, f := range l.Lacks {
		names[i] = f.Name
	}
	return fmt.Sprintf("nft %s lacks %s", l.Version, strings.Join(names, "; "))
}

var (
	// pickTypeofRE matches a map's typeof whose key concatenates a
	// numgen expression.
	pickTypeofRE = regexp.MustCompile(`^\t\ttypeof (.* \. numgen random mod \d+) : (.*)$`)
	// pickElementRE matches a pick map's element up to its numgen field.
	pickElementRE = regexp.MustCompile(`^(\t\telements = \{ |\t\t\t     )(\S+ \. \S+ \. )(\d+)\b`)
	// dnatMapRE matches a DNAT to an address and port from a map.
	dnatMapRE = regexp.MustCompile(`\bdnat (ip6?) to (.* map @\S+)`)
	// typeofTypes are the types of the typeof expressions a pick map's
	// key and data use.
	typeofTypes = map[string]string{"ip daddr": "ipv4_addr", "ip6 daddr": "ipv6_addr",
		"tcp dport": "inet_service", "udp dport": "inet_service", "sctp dport": "inet_service"}
)

// Listing returns a Dump (or a Canonical listing) as this nft lists the
// table, in Canonical form: an nft without NftNumgenInConcatTypeof lists
// a pick map by its key type, with the numgen field of its elements in
// hexadecimal; one without NftDNATToConcatMap lists `dnat ip addr . port
// to`. For an nft that lacks neither it is the dump itself.
func (l NftLanguage) Listing(dump string) string {
	byType, addrPort := !l.Has(NftNumgenInConcatTypeof), !l.Has(NftDNATToConcatMap)
	if !byType && !addrPort {
		return dump
	}
	lines := strings.Split(dump, "\n")
	inPick := false
	for i, line := range lines {
		if strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "\t\t") {
			inPick = false // a block starts or ends
		}
		if m := pickTypeofRE.FindStringSubmatch(line); m != nil && byType {
			lines[i] = "\t\ttype " + typesOf(m[1]) + " : " + typesOf(m[2])
			inPick = true
			continue
		}
		if m := pickElementRE.FindStringSubmatchIndex(line); m != nil && inPick {
			n, _ := strconv.ParseUint(line[m[6]:m[7]], 10, 32)
			lines[i] = line[:m[6]] + fmt.Sprintf("0x%08x", n) + line[m[7]:]
			continue
		}
		if addrPort {
			lines[i] = dnatMapRE.ReplaceAllString(line, "dnat $1 addr . port to $2")
		}
	}
	return nft.Canonical(strings.Join(lines, "\n"))
}

// CannotRead returns the features text (a ruleset in nft's language, a
// Dump or a listing) uses that the nft lacks.
func (l NftLanguage) CannotRead(text string) []NftFeature {
	var out []NftFeature
	for _, f := range l.Lacks {
		if uses(text, f) {
			out = append(out, f)
		}
	}
	return out
}

// CannotReadReason is why the nft cannot read text, e.g. "nft v0.9.8
// cannot read the ruleset: it lacks counter in a map's declaration", or
// "" if it can.
func (l NftLanguage) CannotReadReason(text string) string {
	fs := l.CannotRead(text)
	if len(fs) == 0 {
		return ""
	}
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.Name
	}
	return fmt.Sprintf("nft %s cannot read the ruleset: it lacks %s", l.Version, strings.Join(names, "; "))
}

// uses says whether text uses the feature.
func uses(text string, f NftFeature) bool {
	switch f.Name {
	case NftNumgenInConcatTypeof.Name:
		return pickTypeofMultilineRE.MatchString(text) || numgenLookupRE.MatchString(text)
	case NftCounterInMap.Name:
		inMap := false
		for _, line := range strings.Split(text, "\n") {
			switch {
			case strings.HasPrefix(line, "\tmap "):
				inMap = true
			case strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "\t\t"):
				inMap = false
			case inMap && strings.TrimSpace(line) == "counter":
				return true
			}
		}
		return false
	case NftDNATToConcatMap.Name:
		return dnatMapRE.MatchString(text)
	}
	return true
}

var (
	// pickTypeofMultilineRE is pickTypeofRE on any line of a text.
	pickTypeofMultilineRE = regexp.MustCompile(`(?m)^\s*typeof .* \. numgen random mod \d+ : `)
	// numgenLookupRE matches a lookup of a key that concatenates a
	// numgen expression.
	numgenLookupRE = regexp.MustCompile(`\. numgen random mod \d+ map @`)
)

// typesOf is the key type of a typeof's expressions ("ip daddr . tcp
// dport . numgen random mod 3" → "ipv4_addr . inet_service . mark").
func typesOf(typeof string) string {
	parts := strings.Split(typeof, " . ")
	for i, p := range parts {
		if t, ok := typeofTypes[p]; ok {
			parts[i] = t
		} else if strings.HasPrefix(p, "numgen ") {
			parts[i] = "mark"
		}
	}
	return strings.Join(parts, " . ")
}
