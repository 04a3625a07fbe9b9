// Package ruleset builds the desired nftables ruleset of one family from the
// node-local model. It is pure: it reads the model and returns data.
package ruleset

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Names of the objects in table nftproxy. They match upstream kube-proxy's
// where the object does the same job, so people who know its ruleset can
// read ours.
const (
	// Base chains, one per hook and priority nftproxy needs.
	chainNATPrerouting          = "nat-prerouting"             // DNAT of arriving traffic
	chainNATOutput              = "nat-output"                 // DNAT of traffic from the node
	chainNATPostrouting         = "nat-postrouting"            // masquerade
	chainFilterPreroutingPreNAT = "filter-prerouting-pre-dnat" // source ranges, then count requests, before DNAT
	chainFilterOutputPreNAT     = "filter-output-pre-dnat"     // source ranges, then count requests, from the node
	chainFilterForward          = "filter-forward"             // reject/drop after DNAT, forwarded
	chainFilterOutput           = "filter-output"              // reject/drop after DNAT, from the node
	chainFilterInput            = "filter-input"               // reject for no-endpoint services, to the node
	chainFilterPostrouting      = "filter-postrouting"         // clear the masquerade bit after every source NAT
	chainTrafficInput           = "traffic-input"              // count replies to the node, after their un-DNAT
	chainTrafficPostrouting     = "traffic-postrouting"        // count replies leaving, after their un-DNAT

	// Regular chains.
	chainServices              = "services"                  // dispatch on VIP . proto . port, then NodePorts
	chainMasquerading          = "masquerading"              // masquerade marked and hairpin traffic
	chainServiceEndpointCheck  = "service-endpoints-check"   // no-endpoint services
	chainNodePortEndpointCheck = "nodeport-endpoints-check"  // no-endpoint NodePorts
	chainFirewallCheck         = "firewall-check"            // loadBalancerSourceRanges
	chainClusterIPsCheck       = "cluster-ips-check"         // wrong port, unallocated IP
	chainReject                = "reject-chain"              // target of no-endpoint vmap elements
	chainCountRequests         = "count-requests"            // a request's frontend in service-traffic or nodeport-traffic
	chainCountReplies          = "count-replies"             // a reply's frontend (its source) in the same sets
	chainLocalhostReject       = "localhost-nodeport-reject" // count, then reject, a connection to a NodePort on loopback

	// Sets and maps.
	setClusterIPs          = "cluster-ips"           // every active ClusterIP
	mapServiceIPs          = "service-ips"           // VIP . proto . port : goto service/external chain
	mapServiceNodePorts    = "service-nodeports"     // proto . port : goto external chain
	mapNoEndpointServices  = "no-endpoint-services"  // VIP . proto . port : reject or drop
	mapNoEndpointNodePorts = "no-endpoint-nodeports" // proto . port : reject or drop
	mapFirewallIPs         = "firewall-ips"          // LB IP . proto . port : goto firewall chain
	setHairpinConnections  = "hairpin-connections"   // endpoint . endpoint . proto . port
	setServiceTraffic      = "service-traffic"       // VIP . proto . port, counted (--service-traffic-metrics)
	setNodePortTraffic     = "nodeport-traffic"      // proto . port, counted (--service-traffic-metrics)
	// proto . port : goto localhost-nodeport-reject (KubeProxyNFTablesLocalhostNodePorts)
	mapLocalhostRejectPorts = "localhost-nodeport-reject-ports"
	// proto, counted: the connections localhost-nodeport-reject refused
	setLocalhostRejected = "localhost-nodeport-rejected"
)

// Prefixes of the per-service-port chains.
const (
	kindService  = "service"  // DNAT to any endpoint
	kindLocal    = "local"    // DNAT to an endpoint on this node
	kindExternal = "external" // external traffic: masquerade or keep the source, then service/local
	kindFirewall = "firewall" // drop sources outside loadBalancerSourceRanges
	kindAffinity = "affinity" // dynamic set of clients stuck to one endpoint
	kindEndpoint = "endpoint" // DNAT to one endpoint, recording the client for affinity
)

// The limits on what nftproxy derives from Service names. Names and
// comments come from user input, and a table must list as text that nft
// reads back as the same table. The API server allows namespaces, names
// and port names of up to 63 characters of [a-z0-9-] (DNS-1123 labels),
// which the watch layer checks; these limits hold for any input.
const (
	// maxNameLen is the longest chain or set name the kernel takes
	// (NFT_CHAIN_MAXNAMELEN and NFT_SET_MAXNAMELEN are 256 bytes with the
	// terminating NUL; a longer name fails the transaction with ERANGE).
	// A chain of a port with 63-character names and an IPv6 endpoint
	// would otherwise need 261.
	maxNameLen = 255
	// maxCommentLen is the longest comment nft reads back: the kernel
	// stores up to 253 bytes of comment, but nft 1.0.6 refuses more than
	// 128 characters ("comment too long"), and "ns/name:port" can be 191.
	maxCommentLen = 128
	// truncated ends a name or comment that was cut to its limit.
	truncated = "..."
)

// ChainName is the chain of one kind for one service port:
// "<kind>-<hash>-<ns>/<name>/<proto>/<port>", where the hash keeps names
// unique even though the readable part may be ambiguous (port names can be
// empty) or cut short. Same shape as upstream's.
func ChainName(kind string, n model.ServicePortName) string {
	return objectName(kind, nameHash(n), n, "")
}

// objectName is "<kind>-<hash>-<readable><suffix>" (suffix is safe
// already), cut to maxNameLen. Any byte of the port's identity that an nft
// identifier cannot hold is written as '_' (see identByte); the hash, of
// the identity as it is, keeps such names apart.
func objectName(kind string, h [hashLen]byte, n model.ServicePortName, suffix string) string {
	proto := nft.ProtoName(n.Protocol)
	var name strings.Builder // one allocation: a full sync names every chain
	name.Grow(len(kind) + 1 + hashLen + 1 + readableLen(n, proto) + len(suffix))
	name.WriteString(kind)
	name.WriteByte('-')
	name.Write(h[:])
	name.WriteByte('-')
	writeReadable(&name, n, proto)
	name.WriteString(suffix)
	return cut(name.String(), maxNameLen)
}

// Comment is the comment of a service port's map elements: "ns/name:port"
// (":port" omitted for an unnamed port), with what a comment must not hold
// written as '_' (see commentByte) and cut to maxCommentLen.
func Comment(n model.ServicePortName) string {
	return cut(strings.Map(func(r rune) rune {
		if r < utf8.RuneSelf && commentByte(byte(r)) {
			return r
		}
		return '_'
	}, n.String()), maxCommentLen)
}

// identByte reports whether nft reads c inside an identifier (a chain or
// set name; nft 1.0.6's scanner: [A-Za-z0-9_./-] after a first letter,
// '_' or '.'). Every name nftproxy derives starts with a fixed kind.
func identByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '/'
}

// commentByte reports whether c may appear in a comment: nft lists a
// comment between double quotes as it is, so a quote, a backslash or a
// control character would end it early or change what the listing says.
// Names and port names only hold identifier bytes, and ':' separates them.
func commentByte(c byte) bool { return identByte(c) || c == ':' }

// cut returns s, or if it is longer than limit, its first limit bytes
// ending in truncated.
func cut(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return s[:limit-len(truncated)] + truncated
}

// writeReadable writes the port's identity as names show it,
// "<ns>/<name>/<proto>/<port>", each byte of a part that is '/' or that an
// identifier cannot hold written as '_'.
func writeReadable(b *strings.Builder, n model.ServicePortName, proto string) {
	for i, part := range [...]string{n.Namespace, n.Name, proto, n.Port} {
		if i > 0 {
			b.WriteByte('/')
		}
		for j := 0; j < len(part); j++ {
			if c := part[j]; c != '/' && identByte(c) {
				b.WriteByte(c)
			} else {
				b.WriteByte('_')
			}
		}
	}
}

func readableLen(n model.ServicePortName, proto string) int {
	return len(n.Namespace) + len(n.Name) + len(proto) + len(n.Port) + 3
}

// endpointText is an endpoint as upstream writes it in names:
// "10.244.1.11/8080", "fd00.10.244..1/8080" (an nft identifier cannot hold
// the colons of an IPv6 address).
func endpointText(ep netip.AddrPort) string {
	return strings.ReplaceAll(ep.Addr().String(), ":", ".") + "/" + strconv.Itoa(int(ep.Port()))
}

// hashLen is the length of a name's hash: 8 base32 characters, 40 bits.
const hashLen = 8

// nameHash is the first 8 characters of the base32 SHA-256 of the port's
// identity, "<ns>/<name>:<port>/<proto>", followed by "/<part>" for each
// of parts: short, stable across restarts, unique in practice. (Base32
// encodes 5 bytes as 8 characters, so they are the first 5 bytes'.) A part
// of the identity that holds a separator is escaped (appendIdentityPart),
// so that distinct ports never share an identity.
func nameHash(n model.ServicePortName, parts ...string) (h [hashLen]byte) {
	var buf [128]byte
	id := appendIdentityPart(buf[:0], n.Namespace)
	id = appendIdentityPart(append(id, '/'), n.Name)
	id = appendIdentityPart(append(id, ':'), n.Port)
	id = append(append(id, '/'), nft.ProtoName(n.Protocol)...)
	for _, p := range parts {
		id = append(append(id, '/'), p...)
	}
	sum := sha256.Sum256(id)
	base32.StdEncoding.Encode(h[:], sum[:5])
	return h
}

// appendIdentityPart appends a namespace, name or port name to an
// identity: as it is, or, if it holds '/', ':' or '%' (which valid names
// never do), with those percent-encoded. An escaped part holds a '%' and
// a part written as it is none, so the two never meet, and the separators
// split an identity into its parts one way only.
func appendIdentityPart(id []byte, part string) []byte {
	if !strings.ContainsAny(part, "/:%") {
		return append(id, part...)
	}
	for i := 0; i < len(part); i++ {
		switch c := part[i]; c {
		case '/', ':', '%':
			id = append(id, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
		default:
			id = append(id, c)
		}
	}
	return id
}
