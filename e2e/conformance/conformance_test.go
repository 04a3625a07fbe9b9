package conformance_test

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/conformance"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestConformance runs upstream's [sig-network] tests (the conformance ones,
// or the broader set: NFTPROXY_CONFORMANCE_SET) on a fresh two-node cluster
// per proxy, nftproxy first, then upstream kube-proxy, and writes
// junit-PROXY.xml and ginkgo-PROXY.log into bin/conformance. With nftproxy
// it then measures the disruption cases (disruption_test.go). A test that
// fails fails this test; the table of docs/conformance.md is made from the
// reports by e2e/cmd/conformance-table (make conformance runs both).
func TestConformance(t *testing.T) {
	if os.Getenv(enableEnv) != "1" {
		t.Skipf("set %s=1 (make conformance) to run upstream's [sig-network] suite on a two-node cluster", enableEnv)
	}
	testbed.RequirePrivileges(t)
	start := time.Now()
	cfg := readConfig(t)
	tl := ensureTools(t)
	images := buildImages(t, tl, filepath.Join(cfg.out, "images"))
	t.Logf("tools and images ready after %v", time.Since(start).Round(time.Second))
	for _, proxy := range cfg.proxies {
		t.Run(proxy, func(t *testing.T) {
			begin := time.Now()
			c := startCluster(t, cfg, tl, images, proxy)
			t.Logf("%s: cluster up after %v", proxy, time.Since(begin).Round(time.Second))
			suiteStart := time.Now()
			c.runSuite(cfg)
			t.Logf("%s: suite ran in %v", proxy, time.Since(suiteStart).Round(time.Second))
			if proxy == proxyNftproxy && cfg.disruption {
				c.measureDisruption(cfg, images)
			}
			t.Logf("%s: %v in all", proxy, time.Since(begin).Round(time.Second))
		})
	}
	t.Logf("make conformance's test: %v", time.Since(start).Round(time.Second))
}

// runSuite runs e2e.test through ginkgo in the control namespace (which
// reaches the API server, the nodes and every pod, as a CI machine beside a
// cluster would) and copies upstream's JUnit report to
// bin/conformance/junit-PROXY.xml. Each selected test that does not pass is
// an error of this test.
func (c *cluster) runSuite(cfg config) {
	t := c.t
	t.Helper()
	report := filepath.Join(c.bed.Dir, "report")
	home := filepath.Join(c.bed.Dir, "home") // kubectl's cache: not the machine's ~/.kube
	for _, d := range []string{report, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"env", "HOME=" + home, c.tools.Ginkgo,
		fmt.Sprintf("--procs=%d", cfg.procs),
		"--timeout=" + cfg.suiteTimeout.String(),
		"--focus=" + cmp.Or(cfg.focus, cfg.set.Focus()),
		"--no-color",
		"--silence-skips",
	}
	if skip := cfg.set.SkipPattern(); skip != "" {
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
	p := c.bed.Ctl.Start(args...)
	select {
	case <-p.Done():
	case <-time.After(cfg.suiteTimeout + 5*time.Minute):
		t.Errorf("ginkgo still running after %v; killing it", cfg.suiteTimeout+5*time.Minute)
		p.Kill()
	}
	copyFile(t, p.LogPath, filepath.Join(cfg.out, "ginkgo-"+c.proxy+".log"))
	junit := filepath.Join(cfg.out, "junit-"+c.proxy+".xml")
	copyFile(t, filepath.Join(report, "junit_01.xml"), junit)
	results, err := conformance.ReadJUnit(junit)
	if err != nil {
		t.Fatalf("%v (ginkgo: %v; log %s)", err, p.Err(), filepath.Join(cfg.out, "ginkgo-"+c.proxy+".log"))
	}
	ran, passed := 0, 0
	var failed []string
	for name, r := range results {
		if !cfg.selected(name) || !r.Ran() {
			continue
		}
		ran++
		if r.Status == "passed" {
			passed++
		} else {
			failed = append(failed, fmt.Sprintf("%s: %s: %s", name, r.Status, r.Message))
		}
	}
	t.Logf("%s: %d of the selected tests ran, %d passed (ginkgo: %v)", c.proxy, ran, passed, p.Err())
	for _, f := range failed {
		t.Errorf("with %s: %s", c.proxy, f)
	}
	if ran == 0 {
		t.Errorf("no test ran; see %s", filepath.Join(cfg.out, "ginkgo-"+c.proxy+".log"))
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
