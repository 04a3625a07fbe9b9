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

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// upstreamFlags reads upstream/flags.txt: every flag kube-proxy v1.36
// defines, hidden and deprecated ones included.
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

// TestEveryUpstreamFlagAccepted: each flag of kube-proxy v1.36 is declared,
// and is either used or reported as having no effect.
func TestEveryUpstreamFlagAccepted(t *testing.T) {
	fs := newFlagValues().flagSet()
	for _, name := range upstreamFlags(t) {
		if name == "help" { // pflag answers --help itself
			continue
		}
		if fs.Lookup(name) == nil {
			t.Errorf("kube-proxy flag --%s is not accepted", name)
		}
	}
	for name := range noEffect {
		if f := fs.Lookup(name); f == nil || f.Annotations[annotationNoEffect] == nil {
			t.Errorf("no-effect flag --%s is not declared as such", name)
		}
	}
}

// TestUpstreamFlagsFile: upstream/flags.txt still lists what the upstream
// kube-proxy binary built by e2e/tools/build.sh shows in its --help (which
// omits the deprecated flags), so that the unit test above checks against
// the real list. Skipped without that binary, except under NFTPROXY_E2E=1.
func TestUpstreamFlagsFile(t *testing.T) {
	help := upstreamOutput(t, "--help")
	listed := upstreamFlags(t)
	fs := newFlagValues().flagSet()
	names := regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`).FindAllStringSubmatch(help, -1)
	if len(names) < 50 {
		t.Fatalf("kube-proxy --help shows %d flags:\n%s", len(names), help)
	}
	for _, m := range names {
		if !slices.Contains(listed, m[1]) {
			t.Errorf("kube-proxy --help shows --%s, missing from upstream/flags.txt (regenerate it)", m[1])
		}
		if m[1] != "help" && fs.Lookup(m[1]) == nil {
			t.Errorf("kube-proxy flag --%s is not accepted by nftproxy", m[1])
		}
	}
}

// upstreamOutput runs the upstream kube-proxy with args and returns its
// standard output; the test is skipped when the binary is missing, unless
// NFTPROXY_E2E=1.
func upstreamOutput(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(testbed.BinDir(testbed.KubeVersions().Kubernetes), "kube-proxy")
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
		"hostname-override", "master", "service-cidr", "ip-families", "metrics-bind-address-override", "own-tables", "full-sync-period", "max-reader-wait", "remove-kube-proxy-tables", "service-traffic-metrics",
		"boot-id-file", "machine-id-file"}
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
