// Package ruleset builds the desired nftables ruleset of one family from the
// node-local model. It is pure: it reads the model and returns data.
package ruleset

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Names of the objects in table nftproxy. They match upstream kube-proxy's
// where the object does the same job, so people who know its ruleset can
// read ours.
const (
	// Base chains, one per hook and priority nftproxy needs.
	chainNATPrerouting  = "nat-prerouting"  // DNAT of arriving traffic
	chainNATOutput      = "nat-output"      // DNAT of traffic from the node
	chainNATPostrouting = "nat-postrouting" // masquerade
	chainFilterForward  = "filter-forward"  // reject/drop after DNAT, forwarded
	chainFilterOutput   = "filter-output"   // reject/drop after DNAT, from the node
	chainFilterInput    = "filter-input"    // reject for no-endpoint services, to the node

	// Regular chains.
	chainServices             = "services"                // dispatch on VIP . proto . port
	chainMasquerading         = "masquerading"            // masquerade marked and hairpin traffic
	chainServiceEndpointCheck = "service-endpoints-check" // no-endpoint services
	chainClusterIPsCheck      = "cluster-ips-check"       // wrong port, unallocated IP
	chainReject               = "reject-chain"            // target of no-endpoint vmap elements

	// Sets and maps.
	setClusterIPs         = "cluster-ips"          // every active ClusterIP
	mapServiceIPs         = "service-ips"          // VIP . proto . port : goto service chain
	mapNoEndpointServices = "no-endpoint-services" // VIP . proto . port : goto reject-chain
	setHairpinConnections = "hairpin-connections"  // endpoint . endpoint . proto . port
)

// ServiceChainName is the chain of one service port:
// "service-<hash>-<ns>/<name>/<proto>/<port>", where the hash keeps names
// unique even though the readable part may be ambiguous (port names can be
// empty). Same shape as upstream's.
func ServiceChainName(n model.ServicePortName) string {
	return "service-" + hashPrefix(n) + "-" + readable(n)
}

func readable(n model.ServicePortName) string {
	return fmt.Sprintf("%s/%s/%s/%s", n.Namespace, n.Name, nft.ProtoName(n.Protocol), n.Port)
}

// hashPrefix is the first 8 characters of the base32 SHA-256 of the port's
// identity: short, stable across restarts, unique in practice.
func hashPrefix(n model.ServicePortName) string {
	sum := sha256.Sum256([]byte(n.Namespace + "/" + n.Name + ":" + n.Port + "/" + nft.ProtoName(n.Protocol)))
	return strings.ToUpper(base32.StdEncoding.EncodeToString(sum[:])[:8])
}
