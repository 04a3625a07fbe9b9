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
    <testcase name="[It] [sig-network] Traffic Distribution should route traffic to an endpoint in the same zone when using PreferClose" classname="Kubernetes e2e suite" status="skipped" time="0.1">
      <skipped message="skipped - Requires &gt;= 3 zones"></skipped>
    </testcase>
    <testcase name="[It] [sig-network] Services should be able to up and down services" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[It] [sig-apps] Deployment should run the lifecycle" classname="Kubernetes e2e suite" status="skipped" time="0">
      <skipped message="skipped"></skipped>
    </testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="passed" time="0.2"></testcase>
  </testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	rep, err := ParseJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Tests
	if len(res) != 7 {
		t.Errorf("%d tests, want 7 (the suite nodes are none): %v", len(res), res)
	}
	if len(rep.Suite) != 2 || rep.Suite[0].Name != "[SynchronizedBeforeSuite]" || rep.Suite[1].Status != "passed" {
		t.Errorf("suite nodes %+v", rep.Suite)
	}
	basic := res["[sig-network] Services should serve a basic endpoint from pods  [Conformance]"]
	if basic.Status != "passed" || basic.Seconds != 12.5 || basic.Failed() {
		t.Errorf("basic endpoint: %+v", basic)
	}
	aff := res["[sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance]"]
	if aff.Status != "failed" || aff.Message != "[FAILED] affinity broke: got 3 hosts" || !aff.Failed() {
		t.Errorf("affinity: %+v", aff)
	}
	lb := res["[sig-network] Services should work with the LoadBalancer type"]
	if lb.Status != "skipped" || lb.Message != "Only supported for providers [gce gke aws] (not local)" || lb.Failed() {
		t.Errorf("load balancer: %+v", lb)
	}
	if r := res["[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]"]; r.Message != "" || r.Failed() {
		t.Errorf("left out: %+v", r)
	}
	if _, err := ParseJUnit(strings.NewReader("<testsuites></testsuites>")); err == nil {
		t.Error("an empty report was accepted")
	}
}

// TestCheck: every selected test must pass or skip itself for an accepted
// reason; a failure, another skip, a test the run did not get to and a
// failed suite node are each a problem.
func TestCheck(t *testing.T) {
	rep, err := ParseJUnit(strings.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	sel := SetNetwork.Selection(lacking)
	c := Check(sel, rep, nil)
	// Selected: basic, affinity, load balancer (self-skip, not accepted),
	// traffic distribution (accepted), up and down (not run).
	if c.Selected != 5 || c.Ran != 2 || c.Passed != 1 || c.Failed != 1 || c.SkippedAccepted != 1 || c.SkippedRejected != 1 || c.NotRun != 1 {
		t.Errorf("Check = %+v", c)
	}
	if len(c.Problems) != 3 || c.OK() {
		t.Errorf("problems %q", c.Problems)
	}
	for i, want := range []string{"up and down services: skipped without a reason", "session affinity", "LoadBalancer type: skipped itself"} {
		if i < len(c.Problems) && !strings.Contains(c.Problems[i], want) {
			t.Errorf("problem %d %q lacks %q", i, c.Problems[i], want)
		}
	}

	// A test the report lacks, and a suite node that failed.
	rep.Suite = append(rep.Suite, SuiteNode{Name: "[SynchronizedAfterSuite]", Result: Result{Status: "failed", Message: "cleanup"}})
	c = Check(SetConformance.Selection(lacking), rep, []string{
		"[sig-network] Services should serve a basic endpoint from pods  [Conformance]",
		"[sig-network] EndpointSlice should support creating EndpointSlice API operations [Conformance]",
	})
	if c.Selected != 2 || c.Passed != 1 || c.NotRun != 1 || len(c.Problems) != 2 ||
		!strings.Contains(c.Problems[0], "not in the report") || !strings.Contains(c.Problems[1], "[SynchronizedAfterSuite]") {
		t.Errorf("Check = %+v", c)
	}

	// All passed: OK; nothing selected: not.
	ok, _ := ParseJUnit(strings.NewReader(strings.ReplaceAll(report, `status="failed"`, `status="passed"`)))
	if c := Check(SetConformance.Selection(lacking), ok, nil); !c.OK() || c.Selected != 2 {
		t.Errorf("Check = %+v", c)
	}
	if c := Check(Selection{Focus: `nothing matches`}, ok, nil); c.OK() {
		t.Errorf("a selection of nothing passed: %+v", c)
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
			"- nftproxy: 2 selected of 2; 2 ran: 1 passed, 1 failed; 0 skipped themselves for an accepted reason, 0 for another; 0 not run; **ginkgo: exit status 1**, suite nodes passed",
			"- kube-proxy: 2 selected of 2; 2 ran: 2 passed, 0 failed; 0 skipped themselves for an accepted reason, 0 for another; 0 not run; ginkgo exited 0, suite nodes passed",
			"| Test | nftproxy | kube-proxy | Why not run |",
			"| [sig-network] Services should have session affinity work for NodePort service [LinuxOnly] [Conformance] | **failed** | passed |  |",
		}, []string{"LoadBalancer", "sig-apps"}},
		{SetNetwork, []string{
			"- nftproxy: 5 selected of 6; 2 ran: 1 passed, 1 failed; 1 skipped themselves for an accepted reason, 1 for another; 1 not run;",
			"| [sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4] | — | — | reaches the Internet",
			"| [sig-network] Services should work with the LoadBalancer type | skipped | skipped | the test skips itself: Only supported for providers [gce gke aws] (not local) (**not accepted**) |",
			"| [sig-network] Traffic Distribution should route traffic to an endpoint in the same zone when using PreferClose | skipped | skipped | the test skips itself: Requires >= 3 zones (accepted: the nodes are in no zone",
			"| [sig-network] Services should be able to up and down services | **not run** | **not run** |  |",
		}, []string{"sig-apps"}},
	} {
		sel := tc.set.Selection(lacking)
		got := Table(tc.set, []Column{
			{"nftproxy", nft, Run{Selection: sel, Ginkgo: "exit status 1"}},
			{"kube-proxy", kp, Run{Selection: sel}},
		})
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
	cb, ce := markers(Cluster{CNI: CNIBridge}, SetConformance)
	nb, ne := markers(Cluster{CNI: CNIBridge}, SetNetwork)
	doc := "# Conformance\n\n" + cb + "\nold\n" + ce + "\n\n" + nb + "\nold too\n" + ne + "\nafter\n"
	got, err := ReplaceTable(doc, Cluster{CNI: CNIBridge}, SetNetwork, "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "# Conformance\n\n" + cb + "\nold\n" + ce + "\n\n" + nb + "\nnew\n" + ne + "\nafter\n"; got != want {
		t.Errorf("ReplaceTable = %q, want %q", got, want)
	}
	// Another CNI's table of the same set has its own markers.
	fb, fe := markers(Cluster{CNI: CNIFlannelnftables}, SetNetwork)
	doc = nb + "\nbridge\n" + ne + "\n" + fb + "\nflannel\n" + fe + "\n"
	if got, err := ReplaceTable(doc, Cluster{CNI: CNIFlannelnftables}, SetNetwork, "new\n"); err != nil || got != nb+"\nbridge\n"+ne+"\n"+fb+"\nnew\n"+fe+"\n" {
		t.Errorf("ReplaceTable(flannel-nftables) = %q, %v", got, err)
	}
	// So has the IPv6-first one.
	if b, _ := markers(Cluster{CNI: CNIFlannelnftables, IPv6Primary: true}, SetNetwork); b == fb || !strings.Contains(b, "flannel-nftables-ipv6 sig-network") {
		t.Errorf("IPv6-first markers %q", b)
	}
	if _, err := ReplaceTable("no markers", Cluster{CNI: CNIBridge}, SetConformance, "x"); err == nil {
		t.Error("a doc without markers was accepted")
	}
}
