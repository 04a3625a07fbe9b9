package conformance

import (
	"strings"
	"testing"
)

// report is a JUnit report as upstream's framework writes it (junit_01.xml),
// shortened.
const report = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="6" disabled="0" errors="0" failures="1" time="100">
  <testsuite name="Kubernetes e2e suite" package="/" tests="6" disabled="0" skipped="3" errors="0" failures="1" time="100">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1"></testcase>
    <testcase name="[It] [sig-network] Services should serve a basic endpoint from pods  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="12.5"></testcase>
    <testcase name="[It] [sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]" classname="Kubernetes e2e suite" status="failed" time="40">
      <failure message="" type="failed">
[FAILED] affinity broke: got 3 hosts
In [It] at: service.go:1234</failure>
    </testcase>
    <testcase name="[It] [sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] Services should work with the LoadBalancer type" classname="Kubernetes e2e suite" status="skipped" time="0.1">
      <skipped message="skipped - Only supported for providers [gce gke aws] (not local)"></skipped>
    </testcase>
    <testcase name="[It] [sig-apps] Deployment should run the lifecycle" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
  </testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	res, err := ParseJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 5 {
		t.Errorf("%d tests, want 5 (the suite node is none): %v", len(res), res)
	}
	basic := res["[sig-network] Services should serve a basic endpoint from pods  [Conformance]"]
	if basic.Status != "passed" || basic.Seconds != 12.5 || !basic.Ran() {
		t.Errorf("basic endpoint: %+v", basic)
	}
	aff := res["[sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]"]
	if aff.Status != "failed" || aff.Message != "[FAILED] affinity broke: got 3 hosts" || !aff.Ran() {
		t.Errorf("affinity: %+v", aff)
	}
	lb := res["[sig-network] Services should work with the LoadBalancer type"]
	if lb.Status != "skipped" || lb.Message != "Only supported for providers [gce gke aws] (not local)" || lb.Ran() {
		t.Errorf("load balancer: %+v", lb)
	}
	if r := res["[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]"]; r.Message != "" || r.Ran() {
		t.Errorf("left out: %+v", r)
	}
	if _, err := ParseJUnit(strings.NewReader("<testsuites></testsuites>")); err == nil {
		t.Error("an empty report was accepted")
	}
}

func TestTable(t *testing.T) {
	nft, err := ParseJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := ParseJUnit(strings.NewReader(strings.ReplaceAll(report, `status="failed"`, `status="passed"`)))
	for _, tc := range []struct {
		set  Set
		want []string
		not  []string
	}{
		{SetConformance, []string{
			"- nftproxy: 1 passed, 1 failed, 0 skipped, 0 not run (of 2)",
			"- kube-proxy: 2 passed, 0 failed, 0 skipped, 0 not run (of 2)",
			"| Test | nftproxy | kube-proxy | Why not run |",
			"| [sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance] | **failed** | passed |  |",
		}, []string{"LoadBalancer", "sig-apps"}},
		{SetNetwork, []string{
			"- nftproxy: 1 passed, 1 failed, 1 skipped, 1 not run (of 4)",
			"| [sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4] | — | — | reaches the Internet",
			"| [sig-network] Services should work with the LoadBalancer type | skipped | skipped | the test skips itself: Only supported for providers",
		}, []string{"sig-apps"}},
	} {
		got := Table(tc.set, []Column{{"nftproxy", nft}, {"kube-proxy", kp}})
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: table lacks %q:\n%s", tc.set, w, got)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(got, n) {
				t.Errorf("%s: table has %q:\n%s", tc.set, n, got)
			}
		}
	}
}

func TestReplaceTable(t *testing.T) {
	cb, ce := markers(SetConformance)
	nb, ne := markers(SetNetwork)
	doc := "# Conformance\n\n" + cb + "\nold\n" + ce + "\n\n" + nb + "\nold too\n" + ne + "\nafter\n"
	got, err := ReplaceTable(doc, SetNetwork, "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Conformance\n\n" + cb + "\nold\n" + ce + "\n\n" + nb + "\nnew\n" + ne + "\nafter\n"; got != want {
		t.Errorf("ReplaceTable = %q, want %q", got, want)
	}
	if _, err := ReplaceTable("no markers", SetConformance, "x"); err == nil {
		t.Error("a doc without markers was accepted")
	}
}
