package ruleset

import (
	"strings"

	"github.com/nftproxy/nftproxy/nft"
)

// What the elements of the counted sets and maps (Counters) say, for a
// reader of their counters: which Service port and frontend an element
// dispatches or counts.

// Frontends of a Service port, as the traffic metrics name them.
const (
	FrontendClusterIP = "cluster-ip" // the ClusterIP
	FrontendExternal  = "external"   // an external IP or a load balancer IP (one chain serves both)
	FrontendNodePort  = "node-port"  // the NodePort, on any NodePort address
)

// CountedFrontend returns the frontend and protocol of an element of a
// counted dispatch map (ok false for any other set). In service-ips a
// ClusterIP's element goes to the port's service or local chain, an
// external IP's or a load balancer IP's to its external chain.
func CountedFrontend(set string, e nft.Element) (frontend string, proto uint8, ok bool) {
	switch set {
	case mapServiceNodePorts:
		if len(e.Key) != 2 {
			return "", 0, false
		}
		return FrontendNodePort, uint8(e.Key[0].Int), true
	case mapServiceIPs:
		if len(e.Key) != 3 || e.Verdict == nil {
			return "", 0, false
		}
		if strings.HasPrefix(e.Verdict.Chain, kindExternal+"-") {
			return FrontendExternal, uint8(e.Key[1].Int), true
		}
		return FrontendClusterIP, uint8(e.Key[1].Int), true
	}
	return "", 0, false
}

// CountedTraffic returns the protocol of an element of service-traffic
// or nodeport-traffic, whose counter holds the packets and bytes, both
// ways, of a frontend of a Service port (ok false for any other set).
func CountedTraffic(set string, e nft.Element) (proto uint8, ok bool) {
	switch {
	case set == setServiceTraffic && len(e.Key) == 3:
		return uint8(e.Key[1].Int), true
	case set == setNodePortTraffic && len(e.Key) == 2:
		return uint8(e.Key[0].Int), true
	}
	return 0, false
}

// ParseComment returns the namespace, name and port name of a Service
// port's comment ("ns/name:port", or "ns/name" for an unnamed port), as
// Comment wrote them: bytes a comment cannot hold stay '_', and a comment
// cut to its limit keeps its "...". ok is false for a comment Comment
// cannot have written.
func ParseComment(c string) (namespace, name, port string, ok bool) {
	namespace, rest, ok := strings.Cut(c, "/")
	if !ok || namespace == "" {
		return "", "", "", false
	}
	name, port, _ = strings.Cut(rest, ":")
	return namespace, name, port, name != ""
}
