package conformance_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/conformance"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestConformance runs upstream's [sig-network] tests (the conformance ones,
// or the broader set and then the localhost NodePort tests:
// NFTPROXY_CONFORMANCE_SET) on a fresh dual-stack two-node cluster per
// proxy, nftproxy first, then upstream kube-proxy, and writes each set's
// junit-PROXY.xml, run-PROXY.json and ginkgo-PROXY.log into bin/conformance
// (bin/conformance/SET for a set but the conformance one). With nftproxy it
// measures the disruption cases after the first set (disruption_test.go).
// Each selected test that neither passed nor skipped itself for a reason
// conformance.SelfSkips accepts, a failed suite node and a non-zero exit of
// ginkgo fail this test; the tables of docs/conformance.md are made from the
// reports by e2e/cmd/conformance-table (make conformance runs both).
func TestConformance(t *testing.T) {
	if os.Getenv(enableEnv) != "1" {
		t.Skipf("set %s=1 (make conformance) to run upstream's [sig-network] suite on a two-node cluster", enableEnv)
	}
	testbed.RequirePrivileges(t)
	start := time.Now()
	cfg := readConfig(t)
	tl := ensureTools(t, cfg.cluster.CNI)
	imagesDir := filepath.Join(cfg.out, "images")
	images := buildImages(t, tl, imagesDir)
	machine, err := conformance.DetectMachine(filepath.Join(imagesDir, "packages.txt"))
	if err != nil {
		t.Fatal(err)
	}
	for need, found := range machine.Lacks {
		t.Logf("this machine lacks %s: %s (its tests are skipped)", need, found)
	}
	t.Logf("tools and images ready after %v", time.Since(start).Round(time.Second))
	for _, proxy := range cfg.proxies {
		t.Run(proxy, func(t *testing.T) {
			begin := time.Now()
			c := startCluster(t, cfg, tl, images, proxy)
			t.Logf("%s: cluster up after %v", proxy, time.Since(begin).Round(time.Second))
			for i, set := range cfg.sets {
				if i > 0 {
					reconf := time.Now()
					c.configureProxy(set)
					t.Logf("%s: configured for %s in %v", proxy, set, time.Since(reconf).Round(time.Second))
				}
				suiteStart := time.Now()
				c.runSuite(cfg, set.Selection(machine))
				t.Logf("%s: %s ran in %v", proxy, set, time.Since(suiteStart).Round(time.Second))
				if i == 0 && proxy == proxyNftproxy && cfg.disruption {
					c.measureDisruption(cfg, images, set)
				}
			}
			t.Logf("%s: %v in all", proxy, time.Since(begin).Round(time.Second))
		})
	}
	t.Logf("make conformance's test: %v", time.Since(start).Round(time.Second))
}

// runSuite runs e2e.test through ginkgo in the control namespace (which
// reaches the API server, the nodes and every pod, as a CI machine beside a
// cluster would) with the selection's focus and skips, copies upstream's
// JUnit report to junit-PROXY.xml in the set's directory and records the
// selection and ginkgo's outcome beside it (run-PROXY.json). Then it
// checks that every selected test ran and passed (conformance.Check): each
// that did not, unless it skipped itself for a reason SelfSkips accepts,
// is an error, as are a failed suite node and ginkgo's non-zero exit.
func (c *cluster) runSuite(cfg config, sel conformance.Selection) {
	t := c.t
	t.Helper()
	if cfg.focus != "" {
		sel.Focus = cfg.focus
	}
	out := filepath.Join(cfg.out, sel.Set.Dir())
	report := filepath.Join(c.bed.Dir, "report-"+string(sel.Set))
	home := filepath.Join(c.bed.Dir, "home") // kubectl's cache: not the machine's ~/.kube
	for _, d := range []string{out, report, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	timeout := cfg.suiteTimeout
	if sel.Set == conformance.SetNetwork {
		timeout = cfg.networkTimeout
	}
	args := []string{"env", "HOME=" + home, c.tools.Ginkgo,
		fmt.Sprintf("--procs=%d", cfg.procs),
		"--timeout=" + timeout.String(),
		"--focus=" + sel.Focus,
		"--no-color",
		"--silence-skips",
	}
	if skip := sel.SkipPattern(); skip != "" {
		args = append(args, "--skip="+skip)
	}
	args = append(args, c.tools.E2E, "--",
		"--provider=local",
		"--kubeconfig="+c.bed.AdminKubeconfig,
		"--kubectl-path="+c.tools.Kubectl,
		"--num-nodes=2",
		"--dns-domain=cluster.local",
		"--report-dir="+report,
		"--e2e-output-dir="+report,
		"--allowed-not-ready-nodes=0",
		"--minStartupPods=0",
	)
	begin := time.Now()
	p := c.bed.Ctl.Start(args...)
	select {
	case <-p.Done():
	case <-time.After(timeout + 5*time.Minute):
		t.Errorf("ginkgo still running after %v; killing it", timeout+5*time.Minute)
		p.Kill()
	}
	run := conformance.Run{Selection: sel, SuiteSeconds: time.Since(begin).Seconds()}
	if err := p.Err(); err != nil {
		run.Ginkgo = err.Error()
	}
	log := filepath.Join(out, "ginkgo-"+c.proxy+".log")
	copyFile(t, p.LogPath, log)
	record, err := json.MarshalIndent(run, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "run-"+c.proxy+".json"), append(record, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(out, "junit-"+c.proxy+".xml")
	copyFile(t, filepath.Join(report, "junit_01.xml"), junit)
	rep, err := conformance.ReadJUnit(junit)
	if err != nil {
		t.Fatalf("%v (ginkgo: %v; log %s)", err, cmp.Or(run.Ginkgo, "exit 0"), log)
	}
	n := conformance.Check(sel, rep, nil)
	t.Logf("%s, set %s: %d selected of the report's %d; %d ran: %d passed, %d failed; %d skipped themselves for an accepted reason, %d for another; %d not run (ginkgo: %s)",
		c.proxy, sel.Set, n.Selected, n.Tests, n.Ran, n.Passed, n.Failed, n.SkippedAccepted, n.SkippedRejected, n.NotRun, cmp.Or(run.Ginkgo, "exit 0"))
	for _, pr := range n.Problems {
		t.Errorf("with %s, set %s: %s", c.proxy, sel.Set, pr)
	}
	if run.Ginkgo != "" {
		t.Errorf("with %s, set %s: ginkgo: %s; see %s", c.proxy, sel.Set, run.Ginkgo, log)
	}
}

// copyFile copies src to dst, failing the test if src cannot be read.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
