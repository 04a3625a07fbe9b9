// Package ruleset builds the desired nftables ruleset of one family from the
// node-local model. It is pure: it reads the model and returns data.
package ruleset

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"

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
	chainFilterPreroutingPreNAT = "filter-prerouting-pre-dnat" // source ranges, before DNAT
	chainFilterOutputPreNAT     = "filter-output-pre-dnat"     // source ranges, from the node
	chainFilterForward          = "filter-forward"             // reject/drop after DNAT, forwarded
	chainFilterOutput           = "filter-output"              // reject/drop after DNAT, from the node
	chainFilterInput            = "filter-input"               // reject for no-endpoint services, to the node

	// Regular chains.
	chainServices              = "services"                 // dispatch on VIP . proto . port, then NodePorts
	chainMasquerading          = "masquerading"             // masquerade marked and hairpin traffic
	chainServiceEndpointCheck  = "service-endpoints-check"  // no-endpoint services
	chainNodePortEndpointCheck = "nodeport-endpoints-check" // no-endpoint NodePorts
	chainFirewallCheck         = "firewall-check"           // loadBalancerSourceRanges
	chainClusterIPsCheck       = "cluster-ips-check"        // wrong port, unallocated IP
	chainReject                = "reject-chain"             // target of no-endpoint vmap elements

	// Sets and maps.
	setClusterIPs          = "cluster-ips"           // every active ClusterIP
	mapServiceIPs          = "service-ips"           // VIP . proto . port : goto service/external chain
	mapServiceNodePorts    = "service-nodeports"     // proto . port : goto external chain
	mapNoEndpointServices  = "no-endpoint-services"  // VIP . proto . port : reject or drop
	mapNoEndpointNodePorts = "no-endpoint-nodeports" // proto . port : reject or drop
	mapFirewallIPs         = "firewall-ips"          // LB IP . proto . port : goto firewall chain
	setHairpinConnections  = "hairpin-connections"   // endpoint . endpoint . proto . port
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

// ChainName is the chain of one kind for one service port:
// "<kind>-<hash>-<ns>/<name>/<proto>/<port>", where the hash keeps names
// unique even though the readable part may be ambiguous (port names can be
// empty). Same shape as upstream's.
func ChainName(kind string, n model.ServicePortName) string {
	proto := nft.ProtoName(n.Protocol)
	var name strings.Builder // one allocation: a full sync names every chain
	name.Grow(len(kind) + 1 + hashLen + 1 + readableLen(n, proto))
	name.WriteString(kind)
	name.WriteByte('-')
	h := nameHash(n)
	name.Write(h[:])
	name.WriteByte('-')
	writeReadable(&name, n, proto)
	return name.String()
}

// ServiceChainName is the chain that DNATs a service port's traffic to any
// of its endpoints.
func ServiceChainName(n model.ServicePortName) string { return ChainName(kindService, n) }

// readable is the port's identity as names show it: "<ns>/<name>/<proto>/<port>".
func readable(n model.ServicePortName) string {
	proto := nft.ProtoName(n.Protocol)
	var b strings.Builder
	b.Grow(readableLen(n, proto))
	writeReadable(&b, n, proto)
	return b.String()
}

func writeReadable(b *strings.Builder, n model.ServicePortName, proto string) {
	for i, part := range [...]string{n.Namespace, n.Name, proto, n.Port} {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(part)
	}
}

func readableLen(n model.ServicePortName, proto string) int {
	return len(n.Namespace) + len(n.Name) + len(proto) + len(n.Port) + 3
}

// hashOf is nameHash as a string.
func hashOf(n model.ServicePortName, parts ...string) string {
	h := nameHash(n, parts...)
	return string(h[:])
}

// endpointText is an endpoint as upstream writes it in names: "10.244.1.11/8080".
func endpointText(ep netip.AddrPort) string {
	return ep.Addr().String() + "/" + strconv.Itoa(int(ep.Port()))
}

// hashLen is the length of a name's hash: 8 base32 characters, 40 bits.
const hashLen = 8

// nameHash is the first 8 characters of the base32 SHA-256 of the port's
// identity, "<ns>/<name>:<port>/<proto>", followed by "/<part>" for each
// of parts: short, stable across restarts, unique in practice. (Base32
// encodes 5 bytes as 8 characters, so they are the first 5 bytes'.)
func nameHash(n model.ServicePortName, parts ...string) (h [hashLen]byte) {
	var buf [128]byte
	id := append(buf[:0], n.Namespace...)
	id = append(append(id, '/'), n.Name...)
	id = append(append(id, ':'), n.Port...)
	id = append(append(id, '/'), nft.ProtoName(n.Protocol)...)
	for _, p := range parts {
		id = append(append(id, '/'), p...)
	}
	sum := sha256.Sum256(id)
	base32.StdEncoding.Encode(h[:], sum[:5])
	return h
}
