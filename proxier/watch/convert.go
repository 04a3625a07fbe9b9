// Package watch is the edge between the Kubernetes API and nftproxy: it runs
// the informers and converts each Service and EndpointSlice, once, into the
// immutable types of package model. Nothing below this package imports
// k8s.io/api.
package watch

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"
	"weak"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Labels that make the proxy ignore a Service (and its EndpointSlices).
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
	// ProxyLabelSelector is the informers' label selector.
	ProxyLabelSelector = "!" + LabelServiceProxyName + ",!" + LabelHeadless
	// ServiceFieldSelector is the Services' informer's field selector, as
	// kube-proxy's: a headless Service (clusterIP None) has no rule, so
	// the API server keeps it from crossing the wire to every node.
	ServiceFieldSelector = "spec.clusterIP!=" + v1.ClusterIPNone
)

// The kinds of API object the watcher reads: what Hooks.Event reports, and
// the kind label of nftproxy_api_events_total and
// nftproxy_invalid_objects_total.
const (
	KindService       = "Service"
	KindEndpointSlice = "EndpointSlice"
	KindNode          = "Node"
	KindServiceCIDR   = "ServiceCIDR"
)

// Kinds are every kind Hooks.Event reports.
var Kinds = []string{KindService, KindEndpointSlice, KindNode, KindServiceCIDR}

// Problem is something wrong with an object from the API: the object (or the
// part of it named in Reason) is skipped, everything else goes on.
type Problem struct {
	Kind   string // KindService, KindEndpointSlice or KindServiceCIDR
	Object string // namespace/name (escaped: see printable)
	Reason string // one of Reasons[Kind]: a metric label
	Detail string
}

func (p Problem) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", p.Kind, p.Object, p.Reason, p.Detail)
}

// The reasons a Problem gives, short and stable: the reason label of
// nftproxy_invalid_objects_total. The list is closed, so that every series
// of the metric is known, and exported at 0, before an object is invalid.
const (
	ReasonInvalidName           = "invalid-name"             // a namespace or name is not a DNS-1123 label
	ReasonInvalidClusterIP      = "invalid-cluster-ip"       // not an address, or a second one of its family
	ReasonInvalidPortName       = "invalid-port-name"        // not a DNS-1123 label
	ReasonInvalidProtocol       = "invalid-protocol"         // not TCP, UDP or SCTP
	ReasonInvalidPort           = "invalid-port"             // out of range
	ReasonDuplicatePort         = "duplicate-port"           // a port's name, or its number and protocol, given before
	ReasonInvalidNodePort       = "invalid-node-port"        // out of range
	ReasonInvalidExternalIP     = "invalid-external-ip"      // not a usable address
	ReasonInvalidLoadBalancerIP = "invalid-load-balancer-ip" // not a usable address
	ReasonInvalidSourceRange    = "invalid-source-range"     // not a CIDR
	ReasonInvalidAddress        = "invalid-address"          // an endpoint without a usable address
	ReasonInvalidCIDR           = "invalid-cidr"             // a ServiceCIDR's range is not a CIDR
)

// Reasons are, for each kind of object, every reason its Problems give.
var Reasons = map[string][]string{
	KindService: {ReasonInvalidName, ReasonInvalidClusterIP, ReasonInvalidPortName, ReasonInvalidProtocol,
		ReasonInvalidPort, ReasonDuplicatePort, ReasonInvalidNodePort, ReasonInvalidExternalIP,
		ReasonInvalidLoadBalancerIP, ReasonInvalidSourceRange},
	KindEndpointSlice: {ReasonInvalidName, ReasonInvalidAddress, ReasonInvalidProtocol, ReasonInvalidPort},
	KindServiceCIDR:   {ReasonInvalidCIDR},
}

// newProblems are the problems of an object that its previous version
// (nil: none) did not have. Each problem is reported once, when it
// appears, not again at each resync or relist of the unchanged object, or
// at an update that keeps it: the log would repeat it forever.
func newProblems(old, cur []Problem) []Problem {
	if len(old) == 0 {
		return cur
	}
	var out []Problem
	for _, p := range cur {
		if !slices.Contains(old, p) {
			out = append(out, p)
		}
	}
	return out
}

// printable is s as a log line may hold it: a name the API server would
// have refused may hold newlines, which klog writes over several lines, or
// invalid UTF-8. They are escaped as in a Go string literal.
func printable(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// validName reports whether a namespace, Service name or port name is a
// DNS-1123 label: at most 63 characters of [a-z0-9-], starting and ending
// with a letter or digit. The API server admits no other (Service names
// are DNS-1035 labels, or with RelaxedServiceNameValidation, on by default
// since Kubernetes 1.36, DNS-1123 labels), but an object written straight
// into etcd skips its validation, and these names end up in chain names
// and comments.
//
// It is validation.IsDNS1123Label's test without its regular expression,
// which was a large part of converting a listed cluster
// (docs/code-figures.md); FuzzValidName keeps the two the same.
func validName(s string) bool {
	if len(s) == 0 || len(s) > validation.DNS1123LabelMaxLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

func protocol(p v1.Protocol) (uint8, bool) {
	switch p {
	case v1.ProtocolTCP, "":
		return nft.ProtoTCP, true
	case v1.ProtocolUDP:
		return nft.ProtoUDP, true
	case v1.ProtocolSCTP:
		return nft.ProtoSCTP, true
	}
	return 0, false
}

// ConvertService converts a Service. It returns nil for a Service the proxy
// ignores (ExternalName, headless, no ClusterIP, or labelled to be handled
// by another proxy), and the problems found in it: an unusable ClusterIP or
// port is skipped, the rest of the Service is kept.
func ConvertService(s *v1.Service) (*model.Service, []Problem) {
	if s.Spec.Type == v1.ServiceTypeExternalName || s.Labels[LabelServiceProxyName] != "" {
		return nil, nil
	}
	if _, ok := s.Labels[LabelHeadless]; ok {
		return nil, nil
	}
	name := model.ServiceName{Namespace: s.Namespace, Name: s.Name}
	problem := func(reason, format string, args ...any) Problem {
		return Problem{Kind: KindService, Object: printable(name.String()), Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
	out := &model.Service{Name: name}
	problems, headless := clusterIPs(s, out, problem)
	if headless {
		return nil, nil
	}
	if !validName(s.Namespace) || !validName(s.Name) {
		return nil, []Problem{problem(ReasonInvalidName, "namespace %q or name %q is not a DNS-1123 label", s.Namespace, s.Name)}
	}
	problems = append(problems, ports(s, out, problem)...)
	if len(out.ClusterIPs) == 0 {
		return nil, problems
	}
	problems = append(problems, convertExternal(s, out, problem)...)
	return out, problems
}

// clusterIPs converts the ClusterIPs of a Service: at most one per family,
// the first. It reports whether the Service is headless instead.
func clusterIPs(s *v1.Service, out *model.Service, problem func(reason, format string, args ...any) Problem) ([]Problem, bool) {
	var problems []Problem
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, raw := range ips {
		if raw == v1.ClusterIPNone || raw == "" {
			return nil, true
		}
		ip, err := netip.ParseAddr(raw)
		if err != nil || ip.Zone() != "" || ip.IsUnspecified() {
			problems = append(problems, problem(ReasonInvalidClusterIP, "ClusterIP %q is not an IP address", raw))
			continue
		}
		ip = ip.Unmap()
		if slices.ContainsFunc(out.ClusterIPs, func(have netip.Addr) bool { return have.Is4() == ip.Is4() }) {
			problems = append(problems, problem(ReasonInvalidClusterIP, "ClusterIP %q: a second one of its family", raw))
			continue
		}
		out.ClusterIPs = append(out.ClusterIPs, ip)
	}
	return problems, false
}

// ports converts the ports of a Service. A port is skipped if its name,
// protocol or number is invalid, or if an earlier port has its name or
// its protocol and number (the API server refuses both): two ports with
// one protocol and number would need one map element with two verdicts.
func ports(s *v1.Service, out *model.Service, problem func(reason, format string, args ...any) Problem) []Problem {
	var problems []Problem
	type protoPort struct {
		proto uint8
		port  int32
	}
	names, numbers := map[string]bool{}, map[protoPort]bool{}
	for _, p := range s.Spec.Ports {
		proto, ok := protocol(p.Protocol)
		switch {
		case p.Name != "" && !validName(p.Name):
			problems = append(problems, problem(ReasonInvalidPortName, "port %q: not a DNS-1123 label", p.Name))
			continue
		case !ok:
			problems = append(problems, problem(ReasonInvalidProtocol, "port %q: protocol %q", p.Name, p.Protocol))
			continue
		case p.Port <= 0 || p.Port > 65535:
			problems = append(problems, problem(ReasonInvalidPort, "port %q: %d out of range", p.Name, p.Port))
			continue
		case names[p.Name] || numbers[protoPort{proto, p.Port}]:
			problems = append(problems, problem(ReasonDuplicatePort, "port %q: its name or %d/%s listed before", p.Name, p.Port, p.Protocol))
			continue
		}
		names[p.Name], numbers[protoPort{proto, p.Port}] = true, true
		sp := model.ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)}
		switch {
		case p.NodePort < 0 || p.NodePort > 65535:
			problems = append(problems, problem(ReasonInvalidNodePort, "port %q: NodePort %d out of range", p.Name, p.NodePort))
		case s.Spec.Type == v1.ServiceTypeNodePort || s.Spec.Type == v1.ServiceTypeLoadBalancer:
			sp.NodePort = uint16(p.NodePort)
		}
		out.Ports = append(out.Ports, sp)
	}
	return problems
}

// convertExternal converts what makes a Service reachable from outside:
// external IPs, load balancer IPs and source ranges, and the traffic
// policies and session affinity. Unusable values are skipped.
func convertExternal(s *v1.Service, out *model.Service, problem func(reason, format string, args ...any) Problem) []Problem {
	var problems []Problem
	addr := func(raw, what, reason string) (netip.Addr, bool) {
		ip, err := netip.ParseAddr(raw)
		if err != nil || ip.Zone() != "" || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() {
			problems = append(problems, problem(reason, "%s %q is not a usable IP address", what, raw))
			return netip.Addr{}, false
		}
		return ip.Unmap(), true
	}
	for _, raw := range s.Spec.ExternalIPs {
		if ip, ok := addr(raw, "external-ip", ReasonInvalidExternalIP); ok {
			out.ExternalIPs = append(out.ExternalIPs, ip)
		}
	}
	if s.Spec.Type == v1.ServiceTypeLoadBalancer {
		for _, ing := range s.Status.LoadBalancer.Ingress {
			// ipMode Proxy: the load balancer itself proxies to the nodes;
			// the node must not capture traffic to its IP.
			if ing.IP == "" || ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy {
				continue
			}
			if ip, ok := addr(ing.IP, "load-balancer-ip", ReasonInvalidLoadBalancerIP); ok {
				out.LoadBalancerIPs = append(out.LoadBalancerIPs, ip)
			}
		}
		ranges := s.Spec.LoadBalancerSourceRanges
		if len(ranges) == 0 && s.Annotations[v1.AnnotationLoadBalancerSourceRangesKey] != "" {
			ranges = strings.Split(s.Annotations[v1.AnnotationLoadBalancerSourceRangesKey], ",")
		}
		for _, raw := range ranges {
			p, err := netip.ParsePrefix(strings.TrimSpace(raw))
			if err != nil {
				problems = append(problems, problem(ReasonInvalidSourceRange, "loadBalancerSourceRanges %q is not a CIDR", raw))
				continue
			}
			out.SourceRanges = append(out.SourceRanges, p.Masked())
		}
		if s.Spec.HealthCheckNodePort > 0 && s.Spec.HealthCheckNodePort <= 65535 {
			out.HealthCheckNodePort = uint16(s.Spec.HealthCheckNodePort)
		}
	}
	out.ExternalLocal = s.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	out.InternalLocal = s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	if s.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		out.AffinityTimeout = time.Duration(v1.DefaultClientIPServiceAffinitySeconds) * time.Second
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
			out.AffinityTimeout = time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
		}
	}
	return problems
}

// ConvertEndpointSlice converts an EndpointSlice. It returns nil for a slice
// the proxy ignores (FQDN, or not owned by a Service). Unusable endpoints
// and ports are skipped and reported.
func ConvertEndpointSlice(es *discovery.EndpointSlice) (*model.EndpointSlice, []Problem) {
	var fam nft.Family
	switch es.AddressType {
	case discovery.AddressTypeIPv4:
		fam = nft.IPv4
	case discovery.AddressTypeIPv6:
		fam = nft.IPv6
	default:
		return nil, nil
	}
	svc := es.Labels[discovery.LabelServiceName]
	if svc == "" {
		return nil, nil
	}
	key := model.SliceKey{Namespace: es.Namespace, Name: es.Name}
	problem := func(reason, format string, args ...any) Problem {
		return Problem{Kind: KindEndpointSlice, Object: printable(key.String()), Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
	// No Service could be named so: the slice would serve none.
	if !validName(es.Namespace) || !validName(svc) {
		return nil, []Problem{problem(ReasonInvalidName, "namespace %q or label %s=%q is not a DNS-1123 label",
			es.Namespace, discovery.LabelServiceName, svc)}
	}
	out := &model.EndpointSlice{Name: es.Name, Service: model.ServiceName{Namespace: es.Namespace, Name: svc}, Family: fam}
	if raw, ok := es.Annotations[v1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, raw); err == nil {
			out.TriggerTime = t
		}
	}
	var problems []Problem
	out.Ports, problems = slicePorts(es.Ports, problem)
	// Presized: append's doubling leaves room unused (10 endpoints in room
	// for 16), a large share of the model's memory (docs/code-figures.md).
	out.Endpoints = make([]model.Endpoint, 0, len(es.Endpoints))
	for _, e := range es.Endpoints {
		if len(e.Addresses) == 0 {
			problems = append(problems, problem(ReasonInvalidAddress, "endpoint without an address"))
			continue
		}
		ip, err := netip.ParseAddr(e.Addresses[0])
		if err != nil || ip.Zone() != "" || !fam.Contains(ip.Unmap()) || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() {
			problems = append(problems, problem(ReasonInvalidAddress, "endpoint address %q is not a usable %s address", e.Addresses[0], fam))
			continue
		}
		// Unknown conditions count as ready, and serving as ready (the
		// EndpointConditions API contract).
		ready := e.Conditions.Ready == nil || *e.Conditions.Ready
		serving := ready
		if e.Conditions.Serving != nil {
			serving = *e.Conditions.Serving
		}
		out.Endpoints = append(out.Endpoints, model.Endpoint{
			IP:          model.IPOf(ip.Unmap()),
			Ready:       ready,
			Serving:     serving,
			Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
			Place:       placements.of(deref(e.NodeName), e.Hints),
		})
	}
	return out, problems
}

// slicePorts converts an EndpointSlice's ports, skipping and reporting
// those of an unknown protocol or out of range.
func slicePorts(ports []discovery.EndpointPort, problem func(reason, format string, args ...any) Problem) (
	[]model.EndpointPort, []Problem) {
	var problems []Problem
	out := make([]model.EndpointPort, 0, len(ports))
	for _, p := range ports {
		proto := v1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		pr, ok := protocol(proto)
		switch {
		case !ok:
			problems = append(problems, problem(ReasonInvalidProtocol, "port %s", describePort(p)))
			continue
		case p.Port == nil || *p.Port <= 0 || *p.Port > 65535:
			problems = append(problems, problem(ReasonInvalidPort, "port %s", describePort(p)))
			continue
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		out = append(out, model.EndpointPort{Name: name, Protocol: pr, Port: uint16(*p.Port)})
	}
	return out, problems
}

// intern returns the canonical copy of a name. A cluster has few node
// and zone names, but every endpoint decoded from the API carries its own
// copy.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// placements gives the endpoints on one node with the same hints one
// shared model.Placement: a cluster has few such placements and many times
// more endpoints. A Placement no endpoint holds any more is garbage, and
// its entry is then removed.
var placements = placementCache{m: map[string]weak.Pointer[model.Placement]{}}

type placementCache struct {
	mu  sync.Mutex
	m   map[string]weak.Pointer[model.Placement] // by placementKey
	key []byte                                   // placementKey's buffer, under mu
}

// of is the shared Placement of an endpoint on node with hints h; nil for
// neither.
func (c *placementCache) of(node string, h *discovery.EndpointHints) *model.Placement {
	if h != nil && len(h.ForZones) == 0 && len(h.ForNodes) == 0 {
		h = nil
	}
	if node == "" && h == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.key = placementKey(c.key[:0], node, h)
	if p := c.m[string(c.key)].Value(); p != nil {
		return p
	}
	p := &model.Placement{NodeName: intern(node)}
	if h != nil {
		for _, z := range h.ForZones {
			p.Zones = append(p.Zones, intern(z.Name))
		}
		for _, n := range h.ForNodes {
			p.Nodes = append(p.Nodes, intern(n.Name))
		}
	}
	key := string(c.key)
	c.m[key] = weak.Make(p)
	runtime.AddCleanup(p, c.forget, key)
	return p
}

// forget removes key's entry if its Placement is gone: by then of may have
// made a new one under the same key.
func (c *placementCache) forget(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m[key].Value() == nil {
		delete(c.m, key)
	}
}

// placementKey appends what tells placements apart to b: each name
// length-prefixed, so no name can pass for another whatever it holds.
func placementKey(b []byte, node string, h *discovery.EndpointHints) []byte {
	name := func(b []byte, s string) []byte {
		return append(binary.AppendUvarint(b, uint64(len(s))), s...)
	}
	b = name(b, node)
	if h == nil {
		return b
	}
	b = binary.AppendUvarint(b, uint64(len(h.ForZones)))
	for _, z := range h.ForZones {
		b = name(b, z.Name)
	}
	for _, n := range h.ForNodes {
		b = name(b, n.Name)
	}
	return b
}

func describePort(p discovery.EndpointPort) string {
	s := fmt.Sprintf("%q", deref(p.Name))
	if p.Port != nil {
		s += fmt.Sprintf(" %d", *p.Port)
	}
	if p.Protocol != nil {
		s += " " + string(*p.Protocol)
	}
	return s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ConvertNode converts this node's object: name, zone, primary IPs (per
// family the first InternalIP, else the first ExternalIP, as upstream's
// node IP detection) and pod CIDRs. Unparsable values are skipped.
func ConvertNode(n *v1.Node) model.Node {
	out := model.Node{Name: n.Name, Zone: n.Labels[v1.LabelTopologyZone]}
	for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
		var found netip.Addr
		for _, t := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
			for _, a := range n.Status.Addresses {
				ip, err := netip.ParseAddr(a.Address)
				if a.Type == t && err == nil && fam.Contains(ip.Unmap()) && !found.IsValid() {
					found = ip.Unmap()
				}
			}
		}
		if found.IsValid() {
			out.Addresses = append(out.Addresses, found)
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out.PodCIDRs = append(out.PodCIDRs, p.Masked())
		}
	}
	return out
}
