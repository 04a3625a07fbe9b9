package conformance

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Set names which of upstream's tests a run selects, and how the cluster's
// proxy is configured for them.
type Set string

const (
	// SetConformance is every [sig-network] test marked [Conformance]: 47 in
	// v1.36 and v1.37.
	SetConformance Set = "conformance"
	// SetNetwork is every [sig-network] test but those Skips names: the
	// broader, non-disruptive set Cilium's CI runs.
	SetNetwork Set = "sig-network"
	// SetLocalhostNodePorts is upstream's [Feature:LocalhostNodePorts]
	// tests, with the proxy configured as they need (ProxyConfig).
	SetLocalhostNodePorts Set = "localhost-nodeports"
)

// Sets are the sets, in the order a run that names several runs them.
var Sets = []Set{SetConformance, SetNetwork, SetLocalhostNodePorts}

// ParseSet returns the set named s.
func ParseSet(s string) (Set, error) { return oneOf("set", Sets, s) }

// oneOf returns s if it is one of all, the names a flag or variable takes.
func oneOf[T ~string](what string, all []T, s string) (T, error) {
	if slices.Contains(all, T(s)) {
		return T(s), nil
	}
	return "", fmt.Errorf("unknown %s %q: want one of %v", what, s, all)
}

// Runs are the sets `make conformance CONFORMANCE_SET=s` runs, in order, one
// after the other on each proxy's cluster: the broader set brings the
// localhost NodePort tests along, which need the proxy configured otherwise.
func (s Set) Runs() []Set {
	if s == SetNetwork {
		return []Set{SetNetwork, SetLocalhostNodePorts}
	}
	return []Set{s}
}

// Dir is where a set's reports go under a run's output directory:
// bin/conformance for the conformance set, bin/conformance/SET for the others.
func (s Set) Dir() string {
	if s == SetConformance {
		return ""
	}
	return string(s)
}

// Focus is ginkgo's --focus for the set: a regular expression over a test's
// full text.
func (s Set) Focus() string {
	switch s {
	case SetConformance:
		return `\[sig-network\].*\[Conformance\]`
	case SetLocalhostNodePorts:
		return `\[sig-network\].*\[Feature:LocalhostNodePorts\]`
	}
	return `\[sig-network\]`
}

// ProxyConfig is what the set adds to the KubeProxyConfiguration both
// proxies read (kubeadm's ConfigMap kube-system/kube-proxy), as YAML fields
// of its top level; "" for none. The localhost NodePort tests need the alpha
// gate and loopback among the NodePort addresses: "primary" (the default,
// the node's addresses) and "localhost" (127.0.0.0/8 and ::1), keywords of
// kube-proxy's validation (v1.37, validateKubeProxyNodePortAddress) that
// nftproxy accepts alike (cmd/nftproxy, validate.go).
func (s Set) ProxyConfig() map[string]any {
	if s == SetLocalhostNodePorts {
		return map[string]any{
			"featureGates":      map[string]any{"KubeProxyNFTablesLocalhostNodePorts": true},
			"nodePortAddresses": []any{"primary", "localhost"},
		}
	}
	return nil
}

// Need names something of the machine some tests need and a machine may
// lack; Machine says which are lacking, found at run time.
type Need string

const (
	// NeedSCTP is the kernel's SCTP (CONFIG_IP_SCTP): a socket of
	// protocol IPPROTO_SCTP.
	NeedSCTP Need = "sctp"
	// NeedIperf22 is iperf 2.2 or later in the agnhost image (its 17-field
	// CSV report), which Debian's archive gives from Debian 13 on.
	NeedIperf22 Need = "iperf-2.2"
)

// Machine is what this machine lacks of what some tests need: each Need it
// lacks, with what was found.
type Machine struct {
	Lacks map[Need]string `json:"lacks,omitempty"`
}

// Skip is one reason not to run tests here, and the tests it covers.
type Skip struct {
	// Pattern is a regular expression over a test's full text (ginkgo's
	// --skip takes their alternation).
	Pattern string `json:"pattern"`
	// Reason says what of this machine or cluster the tests need and do
	// not find (docs/conformance.md lists it beside each test).
	Reason string `json:"reason"`
	// Need, when set, makes the entry apply only on a machine that lacks
	// it; what was found is then added to Reason.
	Need Need `json:"-"`
}

// Skips are the tests of SetNetwork not run here, each for a reason this
// machine or a cluster without a cloud imposes. Tests that skip themselves
// (the framework's SkipUnless..., e.g. a provider or SSH keys) are not
// here: SelfSkips lists those that may.
var Skips = []Skip{
	{Pattern: `\[Disruptive\]`, Reason: "disruptive: restarts kube-proxy, the API server or nodes over SSH; the nodes here are namespaces of one machine, without SSH (make conformance measures nftproxy's own disruptions, see below)"},
	{Pattern: `\[Feature:LoadBalancer\]`, Reason: "needs a cloud provider's load balancer: there is none here (--provider=local)"},
	{Pattern: `SCTP`, Reason: "needs SCTP, which this machine's kernel lacks", Need: NeedSCTP},
	{Pattern: `\[Feature:Networking-IPv4\]|\[Feature:Networking-IPv6\]|\[Feature:Networking-DNS\]`, Reason: "reaches the Internet (8.8.8.8, 2001:4860:4860::8888, google.com): the bed has no uplink, by design nothing leaves it"},
	{Pattern: `DNS configMap nameserver Forward PTR lookup`, Reason: "reaches the Internet: it first asks the cluster's DNS for the PTR record of 8.8.8.8, which CoreDNS forwards to the node's resolver; nothing leaves the bed (failed alike with both proxies)"},
	{Pattern: `Networking IPerf2 \[Feature:Networking-Performance\]`, Reason: "parses the 17-field CSV of iperf 2.2 or later (upstream's agnhost has Alpine's), which our agnhost lacks", Need: NeedIperf22},
	{Pattern: `\[Feature:NetworkPolicy\]`, Reason: "needs a NetworkPolicy implementation: the bridge CNI plugin has none (a CNI's job, not a service proxy's)"},
	{Pattern: `\[Feature:LocalhostNodePorts\]`, Reason: "runs in the set localhost-nodeports, on the same cluster after this set, with the proxies configured for it (the alpha gate KubeProxyNFTablesLocalhostNodePorts, nodePortAddresses [primary, localhost])"},
}

// SelfSkip is a test that may skip itself here: the message it must give,
// and why that is right on this cluster. Any other skip of a selected test
// is an error of the run.
type SelfSkip struct {
	// Test and Message are regular expressions over the test's full text
	// and over the reason it gives.
	Test, Message string
	// Why says why the test cannot run on this cluster.
	Why string
}

// SelfSkips are the tests of v1.37.2's [sig-network] set that skip
// themselves on this cluster, each for a reason the cluster (two nodes, no
// zones, no cloud, two nftables proxies) gives.
var SelfSkips = []SelfSkip{
	{
		Test:    `Services should implement NodePort and HealthCheckNodePort correctly when ExternalTrafficPolicy changes`,
		Message: `^Need at least 3 schedulable nodes for this test$`,
		Why:     "the cluster has two nodes, as kind's conformance jobs have two workers",
	},
	{
		Test:    `\[sig-network\] Topology Hints `,
		Message: `^Requires more than one zone$`,
		Why:     "the nodes are in no zone (no topology.kubernetes.io/zone label, no cloud)",
	},
	{
		Test:    `\[sig-network\] Traffic Distribution `,
		Message: `^Requires >= 3 zones$`,
		Why:     "the nodes are in no zone (no topology.kubernetes.io/zone label, no cloud)",
	},
	{
		Test:    `\[Provider:gce\]`,
		Message: `^Only supported for providers \[gce\] \(not local\)$`,
		Why:     "the cluster has no cloud provider (--provider=local)",
	},
	{
		Test:    `KubeProxy should update metric for tracking accepted packets destined for localhost nodeports \[Feature:KubeProxyNFAcct\]`,
		Message: `^test requires iptables proxy mode with route_localnet set$`,
		Why:     "both proxies run in nftables mode",
	},
}

// AcceptedSkip returns why the self-skip of test name with message is
// accepted here, or "" when it is not.
func AcceptedSkip(name, message string) string {
	for _, s := range SelfSkips {
		if regexp.MustCompile(s.Test).MatchString(name) && regexp.MustCompile(s.Message).MatchString(message) {
			return s.Why
		}
	}
	return ""
}

// Selection is what a run of a set selects on a machine: ginkgo's focus and
// the skips that apply, each with its reason. A run records it beside its
// report (selection.json) for the tables made of them.
type Selection struct {
	Set     Set     `json:"set"`
	Focus   string  `json:"focus"`
	Skips   []Skip  `json:"skips,omitempty"`
	Machine Machine `json:"machine"`
}

// Selection returns what the set selects on machine m: SetNetwork's Skips
// whose Need m lacks or that have none; SetConformance and
// SetLocalhostNodePorts skip nothing.
func (s Set) Selection(m Machine) Selection {
	sel := Selection{Set: s, Focus: s.Focus(), Machine: m}
	if s != SetNetwork {
		return sel
	}
	for _, sk := range Skips {
		if sk.Need == "" {
			sel.Skips = append(sel.Skips, sk)
			continue
		}
		if found, lacks := m.Lacks[sk.Need]; lacks {
			sk.Reason += " (" + found + ")"
			sel.Skips = append(sel.Skips, sk)
		}
	}
	return sel
}

// SkipPattern is ginkgo's --skip for the selection: the alternation of its
// skips' patterns ("" for none).
func (sel Selection) SkipPattern() string {
	parts := make([]string, len(sel.Skips))
	for i, sk := range sel.Skips {
		parts[i] = "(" + sk.Pattern + ")"
	}
	return strings.Join(parts, "|")
}

// Selected reports whether the selection runs the test named name (a full
// text, "[sig-network] Services should ...").
func (sel Selection) Selected(name string) bool { return sel.Matcher()(name) }

// Matcher is Selected with the focus and skips compiled once, for going
// over a whole report.
func (sel Selection) Matcher() func(name string) bool {
	focus := regexp.MustCompile(sel.Focus)
	var skip *regexp.Regexp
	if p := sel.SkipPattern(); p != "" {
		skip = regexp.MustCompile(p)
	}
	return func(name string) bool {
		return focus.MatchString(name) && (skip == nil || !skip.MatchString(name))
	}
}

// SkipReason returns the reason of the first of the selection's skips that
// covers name, or "".
func (sel Selection) SkipReason(name string) string {
	for _, sk := range sel.Skips {
		if regexp.MustCompile(sk.Pattern).MatchString(name) {
			return sk.Reason
		}
	}
	return ""
}
