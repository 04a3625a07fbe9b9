package conformance

import (
	"regexp"
	"testing"
)

func TestSelection(t *testing.T) {
	for _, tc := range []struct {
		name              string
		conformance, wide bool
		reason            bool
	}{
		{"[sig-network] Services should serve a basic endpoint from pods  [Conformance]", true, true, false},
		{"[sig-network] DNS should provide DNS for services  [Conformance]", true, true, false},
		{"[sig-network] Services should be able to up and down services", false, true, false},
		{"[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]", false, false, true},
		{"[sig-network] Services should work after restarting kube-proxy [Disruptive]", false, false, true},
		{"[sig-network] SCTP [LinuxOnly] should allow creating a basic SCTP service with pod and endpoints", false, false, true},
		{"[sig-network] Netpol NetworkPolicy between server and client should enforce policy", false, false, true},
		{"[sig-network] [Feature:IPv6DualStack] should create pod, add ipv6 and ipv4 ip to pod ips", false, false, true},
		{"[sig-network] LoadBalancers should be able to change the type and ports of a TCP service [Slow]", false, false, true},
		{"[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]", false, false, false},
	} {
		if got := SetConformance.Selected(tc.name); got != tc.conformance {
			t.Errorf("conformance selects %q: %v", tc.name, got)
		}
		if got := SetNetwork.Selected(tc.name); got != tc.wide {
			t.Errorf("sig-network selects %q: %v", tc.name, got)
		}
		if got := SkipReason(tc.name) != ""; got != tc.reason {
			t.Errorf("SkipReason(%q) = %q", tc.name, SkipReason(tc.name))
		}
	}
	for _, s := range []Set{SetConformance, SetNetwork} {
		for _, p := range []string{s.Focus(), s.SkipPattern()} {
			if _, err := regexp.Compile(p); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	}
	if SetConformance.SkipPattern() != "" {
		t.Error("the conformance set skips tests")
	}
}
