package ocispec

import (
	"fmt"
	"math/big"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// envVar is one resolved variable of a container's env.
type envVar struct{ name, value string }

// containerEnv resolves the container's env in order, as kubelet does: a value may
// refer to variables defined before it ($(NAME)); valueFrom takes the pod's fields or
// the container's resources. A name defined twice keeps its first place and its last
// value.
func containerEnv(in Input, c *corev1.Container) ([]envVar, error) {
	if len(c.EnvFrom) > 0 {
		return nil, fmt.Errorf("envFrom is not supported")
	}
	var env []envVar
	for _, e := range c.Env {
		var v string
		switch src := e.ValueFrom; {
		case src == nil:
			v = Expand(e.Value, lookupIn(env))
		case src.FieldRef != nil:
			var err error
			if v, err = fieldValue(in, src.FieldRef.FieldPath); err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name, err)
			}
		case src.ResourceFieldRef != nil:
			var err error
			if v, err = resourceValue(in, c, src.ResourceFieldRef); err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name, err)
			}
		default:
			return nil, fmt.Errorf("%s: only value, fieldRef and resourceFieldRef are supported", e.Name)
		}
		env = setVar(env, e.Name, v)
	}
	return env, nil
}

func setVar(env []envVar, name, value string) []envVar {
	for i := range env {
		if env[i].name == name {
			env[i].value = value
			return env
		}
	}
	return append(env, envVar{name, value})
}

func lookupIn(env []envVar) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for _, e := range env {
			if e.name == name {
				return e.value, true
			}
		}
		return "", false
	}
}

// Expand replaces $(NAME) in s with lookup's value for NAME, with Kubernetes' rules:
// "$$" is a literal "$", a reference to an unknown name stays as written, and a "$"
// that starts neither is kept.
func Expand(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok && name != "" {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// fieldValue is a fieldRef's value: the fields the downward API offers in env.
func fieldValue(in Input, path string) (string, error) {
	podIPs := in.PodIPs
	if in.Spec.HostNetwork {
		podIPs = in.Node.IPs
	}
	if key, ok := subscript(path, "metadata.labels"); ok {
		return in.Pod.Labels[key], nil
	}
	if key, ok := subscript(path, "metadata.annotations"); ok {
		return in.Pod.Annotations[key], nil
	}
	switch path {
	case "metadata.name":
		return in.Pod.Name, nil
	case "metadata.namespace":
		return in.Pod.Namespace, nil
	case "metadata.uid":
		return string(in.Pod.UID), nil
	case "spec.nodeName":
		return in.Node.Name, nil
	case "spec.serviceAccountName":
		return in.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return firstIP(in.Node.IPs), nil
	case "status.hostIPs":
		return joinIPs(in.Node.IPs), nil
	case "status.podIP":
		return firstIP(podIPs), nil
	case "status.podIPs":
		return joinIPs(podIPs), nil
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

// subscript returns KEY of "FIELD['KEY']".
func subscript(path, field string) (string, bool) {
	rest, ok := strings.CutPrefix(path, field+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

func firstIP(ips []netip.Addr) string {
	if len(ips) == 0 {
		return ""
	}
	return ips[0].String()
}

func joinIPs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ",")
}

// resourceValue is a resourceFieldRef's value, as kubelet computes it: an unset limit
// is the node's allocatable amount; an unset request is the limit (API defaulting) or
// zero; the amount is divided by the divisor (default 1) and rounded up.
func resourceValue(in Input, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" && ref.ContainerName != c.Name {
		var err error
		if c, err = (Input{Spec: in.Spec, Container: ref.ContainerName}).container(); err != nil {
			return "", err
		}
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok || (kind != "limits" && kind != "requests") {
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	res := corev1.ResourceName(name)
	var allocatable resource.Quantity
	switch res {
	case corev1.ResourceCPU:
		allocatable = in.Node.AllocatableCPU
	case corev1.ResourceMemory:
		allocatable = in.Node.AllocatableMemory
	default:
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	q, limited := c.Resources.Limits[res]
	if !limited {
		q = allocatable
	}
	if kind == "requests" {
		if r, ok := c.Resources.Requests[res]; ok {
			q = r
		} else if !limited {
			q = resource.Quantity{}
		}
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	return ceilDiv(q, divisor).String(), nil
}

// ceilDiv is q / d rounded up, both in thousandths (CPU divisors like 1m are common).
func ceilDiv(q, d resource.Quantity) *big.Int {
	num, den := big.NewInt(q.MilliValue()), big.NewInt(d.MilliValue())
	quo, rem := new(big.Int).QuoRem(num, den, new(big.Int))
	if rem.Sign() > 0 {
		quo.Add(quo, big.NewInt(1))
	}
	return quo
}
