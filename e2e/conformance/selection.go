package conformance

import (
	"regexp"
	"strings"
)

// Set names which of upstream's tests a run selects.
type Set string

const (
	// SetConformance is every [sig-network] test marked [Conformance]: 47 in
	// v1.36 and v1.37.
	SetConformance Set = "conformance"
	// SetNetwork is every [sig-network] test but those Skips names: the
	// broader, non-disruptive set Cilium's CI runs.
	SetNetwork Set = "sig-network"
)

// Focus is ginkgo's --focus for the set: a regular expression over a test's
// full text.
func (s Set) Focus() string {
	if s == SetConformance {
		return `\[sig-network\].*\[Conformance\]`
	}
	return `\[sig-network\]`
}

// Skip is one reason not to run tests here, and the tests it covers.
type Skip struct {
	// Pattern is a regular expression over a test's full text (ginkgo's
	// --skip takes their alternation).
	Pattern string
	// Reason says what of this machine or cluster the tests need and do
	// not find (docs/conformance.md lists it beside each test).
	Reason string
}

// Skips are the tests of SetNetwork not run here, each for a reason this
// machine or a cluster without a cloud imposes. Tests that skip themselves
// (the framework's SkipUnless..., e.g. a provider or SSH keys) need no entry:
// their own reason comes back in the JUnit report.
var Skips = []Skip{
	{`\[Disruptive\]`, "disruptive: restarts kube-proxy, the API server or nodes over SSH; the nodes here are namespaces of one machine, without SSH (make conformance measures nftproxy's own disruptions, see below)"},
	{`\[Feature:LoadBalancer\]`, "needs a cloud provider's load balancer: there is none here (--provider=local)"},
	{`SCTP`, "needs SCTP: this kernel is built without it (CONFIG_IP_SCTP is not set)"},
	{`\[Feature:Networking-IPv4\]|\[Feature:Networking-IPv6\]|\[Feature:Networking-DNS\]`, "reaches the Internet (8.8.8.8, 2001:4860:4860::8888, google.com): the bed has no uplink, by design nothing leaves it"},
	{`DNS configMap nameserver Forward PTR lookup`, "reaches the Internet: it first asks the cluster's DNS for the PTR record of 8.8.8.8, which CoreDNS forwards to the node's resolver; nothing leaves the bed (failed alike with both proxies)"},
	{`Networking IPerf2 \[Feature:Networking-Performance\]`, "parses the 17-field CSV of iperf 2.2 or later (upstream's agnhost has Alpine's); Debian 12's iperf, in our agnhost, is 2.1.8 and writes 9 fields (failed alike with both proxies)"},
	{`\[Feature:IPv6DualStack\]`, "needs dual-stack pods: the pod network here is IPv4 only (the Services are dual-stack)"},
	{`\[Feature:NetworkPolicy\]`, "needs a NetworkPolicy implementation: the bridge CNI plugin has none (a CNI's job, not a service proxy's)"},
	{`\[Feature:LocalhostNodePorts\]`, "needs the alpha gate KubeProxyNFTablesLocalhostNodePorts and localhost in nodePortAddresses; both proxies run with kubeadm's defaults here (the registry case also needs agnhost's fake registry data, which our agnhost image lacks)"},
}

// SkipPattern is ginkgo's --skip for s: the alternation of Skips' patterns
// ("" for SetConformance, which runs every test it selects).
func (s Set) SkipPattern() string {
	if s == SetConformance {
		return ""
	}
	parts := make([]string, len(Skips))
	for i, sk := range Skips {
		parts[i] = "(" + sk.Pattern + ")"
	}
	return strings.Join(parts, "|")
}

// Selected reports whether the set runs the test named name (a full text,
// "[sig-network] Services should ...").
func (s Set) Selected(name string) bool {
	if !regexp.MustCompile(s.Focus()).MatchString(name) {
		return false
	}
	skip := s.SkipPattern()
	return skip == "" || !regexp.MustCompile(skip).MatchString(name)
}

// SkipReason returns the reason of the first of Skips that covers name, or "".
func SkipReason(name string) string {
	for _, sk := range Skips {
		if regexp.MustCompile(sk.Pattern).MatchString(name) {
			return sk.Reason
		}
	}
	return ""
}
