// Package watch is the edge between the Kubernetes API and nftproxy: it runs
// the informers and converts each Service and EndpointSlice, once, into the
// immutable types of package model. Nothing below this package imports
// k8s.io/api.
package watch

import (
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// Labels that make the proxy ignore a Service (and its EndpointSlices).
const (
	LabelServiceProxyName = "service.kubernetes.io/service-proxy-name"
	LabelHeadless         = "service.kubernetes.io/headless"
	// ProxyLabelSelector is the informers' label selector.
	ProxyLabelSelector = "!" + LabelServiceProxyName + ",!" + LabelHeadless
)

// Problem is something wrong with an object from the API: the object (or the
// part of it named in Reason) is skipped, everything else goes on.
type Problem struct {
	Kind   string // "Service" or "EndpointSlice"
	Object string // namespace/name
	Reason string // short, stable: used as a metric label
	Detail string
}

func (p Problem) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", p.Kind, p.Object, p.Reason, p.Detail)
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
		return Problem{Kind: "Service", Object: name.String(), Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
	out := &model.Service{Name: name}
	var problems []Problem
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, raw := range ips {
		if raw == v1.ClusterIPNone || raw == "" {
			return nil, nil // headless
		}
		ip, err := netip.ParseAddr(raw)
		if err != nil || ip.Zone() != "" || ip.IsUnspecified() {
			problems = append(problems, problem("invalid-cluster-ip", "ClusterIP %q is not an IP address", raw))
			continue
		}
		out.ClusterIPs = append(out.ClusterIPs, ip.Unmap())
	}
	seen := map[string]bool{}
	for _, p := range s.Spec.Ports {
		proto, ok := protocol(p.Protocol)
		switch {
		case !ok:
			problems = append(problems, problem("invalid-protocol", "port %q: protocol %q", p.Name, p.Protocol))
			continue
		case p.Port <= 0 || p.Port > 65535:
			problems = append(problems, problem("invalid-port", "port %q: %d out of range", p.Name, p.Port))
			continue
		}
		key := fmt.Sprintf("%s/%d", p.Name, proto)
		if seen[key] {
			problems = append(problems, problem("duplicate-port", "port %q/%s listed twice", p.Name, p.Protocol))
			continue
		}
		seen[key] = true
		out.Ports = append(out.Ports, model.ServicePort{Name: p.Name, Protocol: proto, Port: uint16(p.Port)})
	}
	if len(out.ClusterIPs) == 0 {
		return nil, problems
	}
	return out, problems
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
		return Problem{Kind: "EndpointSlice", Object: key.String(), Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
	out := &model.EndpointSlice{Name: es.Name, Service: model.ServiceName{Namespace: es.Namespace, Name: svc}, Family: fam}
	if raw, ok := es.Annotations[v1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, raw); err == nil {
			out.TriggerTime = t
		}
	}
	var problems []Problem
	for _, p := range es.Ports {
		proto := v1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		pr, ok := protocol(proto)
		if !ok || p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
			problems = append(problems, problem("invalid-port", "port %s", describePort(p)))
			continue
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		out.Ports = append(out.Ports, model.EndpointPort{Name: name, Protocol: pr, Port: uint16(*p.Port)})
	}
	for _, e := range es.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		ip, err := netip.ParseAddr(e.Addresses[0])
		if err != nil || ip.Zone() != "" || !fam.Contains(ip.Unmap()) || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() {
			problems = append(problems, problem("invalid-address", "endpoint address %q is not a usable %s address", e.Addresses[0], fam))
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
			Addr:        ip.Unmap(),
			Ready:       ready,
			Serving:     serving,
			Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
			NodeName:    deref(e.NodeName),
		})
	}
	return out, problems
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
