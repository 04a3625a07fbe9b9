package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// upstreamFlags reads upstream/flags.txt: every flag kube-proxy defines
// (the release its header names), hidden and deprecated ones included.
func upstreamFlags(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("upstream", "flags.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for line := range strings.Lines(string(b)) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			names = append(names, line)
		}
	}
	if len(names) < 50 {
		t.Fatalf("upstream/flags.txt lists %d flags; is it truncated?", len(names))
	}
	return names
}

// TestUpstreamFlagSet: nftproxy declares exactly kube-proxy's flags, as
// upstream/flags.txt lists them, plus its own (annotationOwn), both ways: a
// flag upstream adds, or one it drops (as v1.37 dropped --boot-id-file and
// --machine-id-file), fails the test until nftproxy follows. Each upstream
// flag is either used or reported as having no effect.
func TestUpstreamFlagSet(t *testing.T) {
	fs := newFlagValues().flagSet()
	upstream := upstreamFlags(t)
	for _, name := range upstream {
		if name == "help" { // pflag answers --help itself
			continue
		}
		f := fs.Lookup(name)
		switch {
		case f == nil:
			t.Errorf("kube-proxy %s flag --%s is not accepted", upstreamRelease(), name)
		case isOwnFlag(f):
			t.Errorf("--%s is marked nftproxy's own, but kube-proxy %s has it", name, upstreamRelease())
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if !isOwnFlag(f) && !slices.Contains(upstream, f.Name) {
			t.Errorf("--%s is not a flag of kube-proxy %s (upstream/flags.txt): drop it as upstream did, or make it nftproxy's own", f.Name, upstreamRelease())
		}
	})
	for name := range noEffect {
		if f := fs.Lookup(name); f == nil || f.Annotations[annotationNoEffect] == nil {
			t.Errorf("no-effect flag --%s is not declared as such", name)
		}
	}
}

func isOwnFlag(f *pflag.Flag) bool {
	_, own := f.Annotations[annotationOwn]
	return own
}

// TestUpstreamFlagsFile: upstream/flags.txt and the upstream kube-proxy
// binary built by e2e/tools/build.sh agree, both ways: every flag its
// --help shows is listed (and accepted, and not deprecated, by nftproxy),
// and every flag listed that --help does not show is deprecated or hidden
// upstream, and so in nftproxy. Together with TestUpstreamFlagSet, nftproxy's
// flags are then the binary's. Skipped without that binary, except under
// NFTPROXY_E2E=1.
func TestUpstreamFlagsFile(t *testing.T) {
	help := upstreamOutput(t, "--help")
	listed := upstreamFlags(t)
	fs := newFlagValues().flagSet()
	var shown []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(help, -1) {
		shown = append(shown, m[1])
	}
	if len(shown) < 50 {
		t.Fatalf("kube-proxy --help shows %d flags:\n%s", len(shown), help)
	}
	for _, name := range shown {
		if !slices.Contains(listed, name) {
			t.Errorf("kube-proxy --help shows --%s, missing from upstream/flags.txt (regenerate it)", name)
		}
		if name == "help" {
			continue
		}
		if f := fs.Lookup(name); f == nil {
			t.Errorf("kube-proxy flag --%s is not accepted by nftproxy", name)
		} else if f.Deprecated != "" || f.Hidden {
			t.Errorf("kube-proxy --help shows --%s; nftproxy marks it deprecated or hidden", name)
		}
	}
	for _, name := range listed {
		if slices.Contains(shown, name) {
			continue
		}
		if f := fs.Lookup(name); f == nil || f.Deprecated == "" && !f.Hidden {
			t.Errorf("upstream/flags.txt lists --%s, which kube-proxy --help does not show: not a flag of this binary "+
				"(regenerate upstream/flags.txt), or deprecated or hidden upstream (mark it so in nftproxy)", name)
		}
	}
}

// upstreamOutput runs the upstream kube-proxy with args and returns its
// standard output; the test is skipped when the binary is missing, unless
// NFTPROXY_E2E=1.
func upstreamOutput(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(kubebin.Dir(kubebin.Pinned().Kubernetes), "kube-proxy")
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("NFTPROXY_E2E") == "1" {
			t.Fatalf("upstream kube-proxy missing (run e2e/tools/build.sh): %v", err)
		}
		t.Skipf("upstream kube-proxy missing (run e2e/tools/build.sh): %v", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kube-proxy %q: %v\n%s%s", args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestFlagGroups: every flag is in exactly one precedence group, so that a
// new flag's behaviour with --config is decided, not accidental.
func TestFlagGroups(t *testing.T) {
	fs := newFlagValues().flagSet()
	alwaysApplied := []string{"config", "write-config-to", "cleanup", "init-only", "version",
		"hostname-override", "master", "service-cidr", "ip-families", "metrics-bind-address-override", "own-tables", "full-sync-period", "max-reader-wait", "remove-kube-proxy-tables", "service-traffic-metrics"}
	var logging pflag.FlagSet
	logsapi.AddFlags(&newFlagValues().cfg.Logging, &logging)
	fs.VisitAll(func(f *pflag.Flag) {
		_, fromFile := f.Annotations[annotationConfigFile]
		groups := 0
		for _, in := range []bool{fromFile, slices.Contains(alwaysApplied, f.Name), logging.Lookup(f.Name) != nil} {
			if in {
				groups++
			}
		}
		if groups != 1 {
			t.Errorf("--%s is in %d precedence groups, want 1", f.Name, groups)
		}
	})
}
