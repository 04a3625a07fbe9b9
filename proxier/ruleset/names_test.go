package ruleset

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// TestChainNameIsStable: chain names are in the kernel's table, so they
// must not change across versions (a restart would rewrite every chain).
// They are checked against names written before, and against the
// definition: kind, the first 8 characters of the base32 SHA-256 of
// "<ns>/<name>:<port>/<proto>", and "<ns>/<name>/<proto>/<port>".
func TestChainNameIsStable(t *testing.T) {
	for _, tc := range []struct {
		kind string
		n    model.ServicePortName
		want string
	}{
		{kindService, spName("default", "web", "http", nft.ProtoTCP), "service-OSC5D42R-default/web/tcp/http"},
		{kindService, spName("kube-system", "dns", "dns", nft.ProtoUDP), "service-67REBLX4-kube-system/dns/udp/dns"},
	} {
		if got := ChainName(tc.kind, tc.n); got != tc.want {
			t.Errorf("ChainName(%s, %v) = %q, want %q", tc.kind, tc.n, got, tc.want)
		}
	}
	long := strings.Repeat("n", 63)
	for _, n := range []model.ServicePortName{
		spName("", "", "", nft.ProtoSCTP),
		spName(long, long, long, nft.ProtoTCP), // over the hash's stack buffer
		spName("a", "b", "", nft.ProtoUDP),
	} {
		sum := sha256.Sum256([]byte(n.Namespace + "/" + n.Name + ":" + n.Port + "/" + nft.ProtoName(n.Protocol)))
		want := kindLocal + "-" + base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" +
			n.Namespace + "/" + n.Name + "/" + nft.ProtoName(n.Protocol) + "/" + n.Port
		if got := ChainName(kindLocal, n); got != want {
			t.Errorf("ChainName(%v) = %q, want %q", n, got, want)
		}
	}
}

// validIdent reports whether nft reads s back as one identifier that the
// kernel takes as a chain or set name (see identByte, maxNameLen).
func validIdent(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	if c := s[0]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == '.') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !identByte(s[i]) {
			return false
		}
	}
	return true
}

// validComment reports whether nft lists s between quotes as it is and
// reads it back (see commentByte, maxCommentLen).
func validComment(s string) bool {
	if len(s) > maxCommentLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !commentByte(s[i]) {
			return false
		}
	}
	return true
}

var allKinds = []string{kindService, kindLocal, kindExternal, kindFirewall}

// names are every name and comment derived from a service port and an
// endpoint of it (with session affinity).
func names(n model.ServicePortName, ep netip.AddrPort) (chains []string, comment string) {
	for _, k := range allKinds {
		chains = append(chains, ChainName(k, n))
	}
	b := portBuilder{fr: &nft.Fragment{}, sp: &model.ServicePortState{Name: n, AffinityTimeout: time.Hour}}
	set, chain := b.affinityEndpoint(ep)
	return append(chains, set, chain), Comment(n)
}

// TestNamesAtLimitsAndHostile: the names of a port whose namespace, name
// and port name are at the API's limit (63 characters each), with an IPv6
// endpoint, fit the kernel; its comment is cut to what nft reads back;
// and names no valid Service could have come out as identifiers and
// comments that cannot change what `nft list` prints around them.
func TestNamesAtLimitsAndHostile(t *testing.T) {
	l63 := strings.Repeat("a", 62) + "z"
	v6 := ap("[fd00:1234:5678:9abc:def0:1234:5678:9abc]:65535")
	for _, tc := range []struct {
		name string
		n    model.ServicePortName
		ep   netip.AddrPort
	}{
		{"63-character names, IPv6 endpoint", spName(l63, l63, l63, nft.ProtoSCTP), v6},
		{"63-character names, IPv4 endpoint", spName(l63, l63, l63, nft.ProtoTCP), ap("255.255.255.255:65535")},
		{"quotes and braces", spName(`x" } chain evil { drop`, "a;b#c", `p\"`, nft.ProtoTCP), v6},
		{"newlines and NUL", spName("a\nb", "c\x00d", "\r\n", nft.ProtoUDP), v6},
		{"non-ASCII", spName("ñamespace", "服务", "\xff\xfe", nft.ProtoTCP), v6},
		{"1,000 characters", spName(strings.Repeat("n", 1000), "s", "p", nft.ProtoTCP), v6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chains, comment := names(tc.n, tc.ep)
			for _, c := range chains {
				if !validIdent(c) {
					t.Errorf("name %q (%d bytes) is not an nft identifier of at most %d bytes", c, len(c), maxNameLen)
				}
			}
			if !validComment(comment) {
				t.Errorf("comment %q (%d bytes) is not one nft reads back", comment, len(comment))
			}
		})
	}
	// Valid names are written as they are.
	n := spName(l63, l63, l63, nft.ProtoTCP)
	if c := ChainName(kindService, n); !strings.HasSuffix(c, "-"+l63+"/"+l63+"/tcp/"+l63) {
		t.Errorf("chain name %q does not end in the port's identity", c)
	}
	if c := Comment(n); c != (l63 + "/" + l63 + ":" + l63)[:maxCommentLen-3]+"..." {
		t.Errorf("comment %q", c)
	}
	if c := Comment(spName("default", "web", "http", nft.ProtoTCP)); c != "default/web:http" {
		t.Errorf("comment %q", c)
	}
}

// FuzzNames: for any namespace, name and port name, every derived chain
// and set name is an nft identifier the kernel takes, the comment one nft
// reads back, and two distinct ports (or endpoints) never share a name.
func FuzzNames(f *testing.F) {
	l63 := strings.Repeat("x", 63)
	f.Add("default", "web", "http", uint8(6), []byte{10, 244, 1, 1}, uint16(8080), "default", "web", "https", uint8(6))
	f.Add(l63, l63, l63, uint8(132), []byte(strings.Repeat("\xfd", 16)), uint16(65535), l63, l63, l63[1:], uint8(132))
	f.Add("a/b", "c", "", uint8(17), []byte{}, uint16(0), "a", "b/c", "", uint8(17))
	f.Add("a", "b:c", "", uint8(6), []byte{1, 2, 3}, uint16(1), "a", "b", "c", uint8(6))
	f.Add(`x"}`, "\n", "\x00", uint8(1), []byte{127, 0, 0, 1}, uint16(1), "x%22}", "%0A", "%00", uint8(1))
	l250 := strings.Repeat("n", 250) // cut short: only the hash tells them apart
	f.Add(l250+"/x", "y", "", uint8(6), []byte{}, uint16(0), l250, "x/y", "", uint8(6))
	f.Add("ñ", "服务", "\xff", uint8(6), []byte{}, uint16(0), "_", "__", "_", uint8(6))
	f.Fuzz(func(t *testing.T, ns, name, port string, proto uint8, addr []byte, epPort uint16,
		ns2, name2, port2 string, proto2 uint8) {
		n := spName(ns, name, port, proto)
		n2 := spName(ns2, name2, port2, proto2)
		ep, ok := netip.AddrFromSlice(addr)
		if !ok {
			ep = netip.MustParseAddr("10.0.0.1")
		}
		other := ep.Next()
		if !other.IsValid() { // ep was the last address
			other = ep.Prev()
		}
		aps := []netip.AddrPort{netip.AddrPortFrom(ep, epPort), netip.AddrPortFrom(other, epPort)}
		seen := map[string]string{}
		add := func(what string, names []string) {
			for _, c := range names {
				if !validIdent(c) {
					t.Fatalf("%s: name %q (%d bytes) is not an nft identifier of at most %d bytes", what, c, len(c), maxNameLen)
				}
				if other, dup := seen[c]; dup {
					t.Fatalf("%s and %s share the name %q", what, other, c)
				}
				seen[c] = what
			}
		}
		chains, comment := names(n, aps[0])
		if !validComment(comment) {
			t.Fatalf("comment %q (%d bytes) is not one nft reads back", comment, len(comment))
		}
		add(fmt.Sprintf("%q endpoint %v", n, aps[0]), chains)
		chains2, _ := names(n, aps[1]) // the affinity set and chain of another endpoint
		add(fmt.Sprintf("%q endpoint %v", n, aps[1]), chains2[len(allKinds):])
		if n2 != n {
			chains3, _ := names(n2, aps[0])
			add(fmt.Sprintf("%q endpoint %v", n2, aps[0]), chains3)
		}
	})
}
