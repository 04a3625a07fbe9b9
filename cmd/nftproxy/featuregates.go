package main

import (
	_ "embed"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"k8s.io/component-base/featuregate"
)

// upstreamFeatureGates lists the feature gates kube-proxy knows, with their
// state at its release (upstreamRelease), generated from upstream's own
// registry by e2e/tools/kube/cmd/kubeproxyflags. Lines: "Name Default
// Locked Maturity", then "depends Name Dep1,Dep2".
//
//go:embed upstream/feature-gates.txt
var upstreamFeatureGates string

// upstreamRelease is the kube-proxy release upstream/feature-gates.txt (and
// flags.txt, generated with it) comes from, as its header names it.
func upstreamRelease() string {
	first, _, _ := strings.Cut(upstreamFeatureGates, "\n")
	_, rest, ok := strings.Cut(first, "k8s.io/kubernetes ")
	if release, _, ok2 := strings.Cut(rest, ";"); ok && ok2 {
		return release
	}
	return "(unknown release)"
}

// The feature gates nftproxy acts on (honouredGates); the others are
// accepted, as kube-proxy's, and logged as having no effect.
const (
	// gateLocalhostNodePorts: localhost NodePorts refused, or proxied in
	// userspace (proxier.Config.LocalhostNodePorts). Alpha in kube-proxy
	// v1.37, off by default.
	gateLocalhostNodePorts featuregate.Feature = "KubeProxyNFTablesLocalhostNodePorts"
)

// honouredGates are the gates that change what nftproxy does: the logging
// ones (component-base applies them) and gateLocalhostNodePorts.
var honouredGates = []string{"LoggingAlphaOptions", "LoggingBetaOptions", "ContextualLogging", string(gateLocalhostNodePorts)}

// featureGateFor returns a feature gate that knows exactly the gates of
// kube-proxy's upstreamRelease, set from gates: an unknown gate (one the
// release removed, say), a value other than the default of a locked one, or
// a gate enabled without what it depends on is an error, as upstream.
// nftproxy reads the logging gates and gateLocalhostNodePorts from it.
func featureGateFor(gates map[string]bool) (featuregate.FeatureGate, error) {
	gate := featuregate.NewFeatureGate()
	specs, deps, err := parseFeatureGates(upstreamFeatureGates)
	if err != nil {
		return nil, fmt.Errorf("upstream/feature-gates.txt: %w", err)
	}
	for name := range gate.GetAll() { // AllAlpha and AllBeta come built in
		delete(specs, name)
	}
	if err := gate.Add(specs); err != nil {
		return nil, fmt.Errorf("upstream/feature-gates.txt: %w", err)
	}
	if err := gate.AddDependencies(deps); err != nil {
		return nil, fmt.Errorf("upstream/feature-gates.txt: %w", err)
	}
	if err := gate.SetFromMap(gates); err != nil {
		return nil, fmt.Errorf("--feature-gates / featureGates: %w", err)
	}
	return gate, nil
}

func parseFeatureGates(text string) (map[featuregate.Feature]featuregate.FeatureSpec, map[featuregate.Feature][]featuregate.Feature, error) {
	specs := map[featuregate.Feature]featuregate.FeatureSpec{}
	deps := map[featuregate.Feature][]featuregate.Feature{}
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		switch {
		case len(f) == 0 || strings.HasPrefix(f[0], "#"):
		case f[0] == "depends" && len(f) == 3:
			for d := range strings.SplitSeq(f[2], ",") {
				deps[featuregate.Feature(f[1])] = append(deps[featuregate.Feature(f[1])], featuregate.Feature(d))
			}
		case len(f) == 4:
			spec, err := featureSpec(f[1], f[2], f[3])
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f[0], err)
			}
			specs[featuregate.Feature(f[0])] = spec
		default:
			return nil, nil, fmt.Errorf("bad line %q", line)
		}
	}
	return specs, deps, nil
}

var maturities = map[string]featuregate.FeatureSpec{
	"ALPHA": {PreRelease: featuregate.Alpha}, "BETA": {PreRelease: featuregate.Beta},
	"GA": {PreRelease: featuregate.GA}, "DEPRECATED": {PreRelease: featuregate.Deprecated},
}

func featureSpec(def, locked, maturity string) (featuregate.FeatureSpec, error) {
	spec, ok := maturities[maturity]
	if !ok {
		return spec, fmt.Errorf("maturity %q: want one of %v", maturity, slices.Sorted(maps.Keys(maturities)))
	}
	var err1, err2 error
	spec.Default, err1 = strconv.ParseBool(def)
	spec.LockToDefault, err2 = strconv.ParseBool(locked)
	if err1 != nil || err2 != nil {
		return spec, fmt.Errorf("default %q locked %q: want true or false", def, locked)
	}
	return spec, nil
}
