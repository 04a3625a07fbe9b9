package conformance

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
)

// sigNetworkTests are the [sig-network] tests of e2e.test v1.37.2
// (ginkgo --dry-run -v --focus='\[sig-network\]', labels left out).
func sigNetworkTests(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("testdata/sig-network-v1.37.2.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var names []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		names = append(names, sc.Text())
	}
	return names
}

// lacking is a machine like ours: a kernel without SCTP, Debian 12's iperf.
var lacking = Machine{Lacks: map[Need]string{NeedSCTP: "socket: protocol not supported", NeedIperf22: "iperf 2.1.8"}}

// TestSelectionOfV1372 checks the sets against the tests of v1.37.2: the 47
// conformance tests, the 3 localhost NodePort tests, and a reason for each
// test the broader set leaves out, with every Skips entry covering at least
// one test (no stale entry); on a machine that lacks nothing, the SCTP and
// iperf tests run too.
func TestSelectionOfV1372(t *testing.T) {
	names := sigNetworkTests(t)
	if len(names) != 249 {
		t.Fatalf("%d tests in testdata, want 249", len(names))
	}
	for _, tc := range []struct {
		set     Set
		machine Machine
		want    int
	}{
		{SetConformance, lacking, 47},
		{SetConformance, Machine{}, 47},
		{SetLocalhostNodePorts, lacking, 3},
		{SetNetwork, lacking, 164},
		{SetNetwork, Machine{}, 173},
	} {
		sel := tc.set.Selection(tc.machine)
		got, dualStack := 0, 0
		used := make([]int, len(sel.Skips))
		for _, n := range names {
			if sel.Selected(n) {
				got++
				if strings.Contains(n, "[Feature:IPv6DualStack]") {
					dualStack++
				}
				continue
			}
			if tc.set != SetNetwork || !regexp.MustCompile(sel.Focus).MatchString(n) {
				continue
			}
			if sel.SkipReason(n) == "" {
				t.Errorf("%s: left out without a reason: %s", tc.set, n)
			}
			for i, sk := range sel.Skips {
				if regexp.MustCompile(sk.Pattern).MatchString(n) {
					used[i]++
				}
			}
		}
		if got != tc.want {
			t.Errorf("%s on %v selects %d, want %d", tc.set, tc.machine, got, tc.want)
		}
		if tc.set == SetNetwork && dualStack < 22 {
			t.Errorf("%s selects %d [Feature:IPv6DualStack] tests, want 22 or more", tc.set, dualStack)
		}
		for i, n := range used {
			if n == 0 {
				t.Errorf("%s: skip %s covers no test of v1.37.2", tc.set, sel.Skips[i].Pattern)
			}
		}
	}
}

func TestSelection(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		conformance, wide, local bool
	}{
		{"[sig-network] Services should serve a basic endpoint from pods  [Conformance]", true, true, false},
		{"[sig-network] Services should be able to up and down services", false, true, false},
		{"[sig-network] Netpol API should support creating NetworkPolicy API operations", false, true, false},
		{"[sig-network] [Feature:IPv6DualStack] should create service with ipv4,v6 cluster ip", false, true, false},
		{"[sig-network] [Feature:IPv6DualStack] Granular Checks: Services Secondary IP Family [LinuxOnly] should function for pod-Service: sctp [Feature:SCTPConnectivity]", false, false, false},
		{"[sig-network] LocalhostNodePorts should proxy localhost NodePort traffic to backends across nodes [Feature:LocalhostNodePorts]", false, false, true},
		{"[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]", false, false, false},
		{"[sig-network] Services should work after restarting kube-proxy [Disruptive]", false, false, false},
		{"[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]", false, false, false},
	} {
		for _, c := range []struct {
			set  Set
			want bool
		}{{SetConformance, tc.conformance}, {SetNetwork, tc.wide}, {SetLocalhostNodePorts, tc.local}} {
			if got := c.set.Selection(lacking).Selected(tc.name); got != c.want {
				t.Errorf("%s selects %q: %v", c.set, tc.name, got)
			}
		}
	}
	for _, s := range Sets {
		sel := s.Selection(lacking)
		for _, p := range []string{sel.Focus, sel.SkipPattern()} {
			if _, err := regexp.Compile(p); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
		if s != SetNetwork && sel.SkipPattern() != "" {
			t.Errorf("the %s set skips tests", s)
		}
	}
}

// TestMachineDependentSkips: a skip for what a machine may lack applies
// only where it lacks it, and says what was found there.
func TestMachineDependentSkips(t *testing.T) {
	sctp := "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: sctp [LinuxOnly] [Feature:SCTPConnectivity]"
	iperf := "[sig-network] Networking IPerf2 [Feature:Networking-Performance] should run iperf2"
	sel := SetNetwork.Selection(lacking)
	if sel.Selected(sctp) || sel.Selected(iperf) {
		t.Error("SCTP or iperf test selected on a machine that lacks them")
	}
	if r := sel.SkipReason(sctp); !strings.Contains(r, "(socket: protocol not supported)") {
		t.Errorf("SCTP skip reason %q lacks what was found", r)
	}
	full := SetNetwork.Selection(Machine{})
	if !full.Selected(sctp) || !full.Selected(iperf) {
		t.Error("SCTP or iperf test left out on a machine that has them")
	}
	if r := full.SkipReason(sctp); r != "" {
		t.Errorf("SCTP skipped on a machine with SCTP: %q", r)
	}
}

func TestParseSet(t *testing.T) {
	for _, s := range Sets {
		if got, err := ParseSet(string(s)); err != nil || got != s {
			t.Errorf("ParseSet(%s) = %s, %v", s, got, err)
		}
	}
	if _, err := ParseSet("all"); err == nil {
		t.Error("ParseSet accepted an unknown set")
	}
	if r := SetNetwork.Runs(); len(r) != 2 || r[1] != SetLocalhostNodePorts {
		t.Errorf("sig-network runs %v", r)
	}
	if SetConformance.Dir() != "" || SetNetwork.Dir() != "sig-network" {
		t.Error("Dir")
	}
	if SetLocalhostNodePorts.ProxyConfig() == nil || SetNetwork.ProxyConfig() != nil {
		t.Error("ProxyConfig")
	}
}

func TestAcceptedSkip(t *testing.T) {
	if AcceptedSkip("[sig-network] Traffic Distribution should route traffic correctly between pods on multiple nodes when using PreferClose", "Requires >= 3 zones") == "" {
		t.Error("zones skip not accepted")
	}
	if AcceptedSkip("[sig-network] Traffic Distribution should route traffic correctly between pods on multiple nodes when using PreferClose", "Requires at least 2 nodes") != "" {
		t.Error("a test skipping for another reason than its accepted one was accepted")
	}
	if AcceptedSkip("[sig-network] Services should be able to up and down services", "Requires >= 3 zones") != "" {
		t.Error("a test without an accepted skip was accepted")
	}
}

func TestIperfProblem(t *testing.T) {
	for v, ok := range map[string]bool{"2.1.8+dfsg-1": false, "2.2.1+dfsg-1": true, "1:2.2.0-1": true, "3.12-1": true, "2.0.13+dfsg1-2": false} {
		if got := IperfProblem(v) == ""; got != ok {
			t.Errorf("IperfProblem(%s) = %q", v, IperfProblem(v))
		}
	}
	if IperfProblem("x.y") == "" {
		t.Error("an unreadable version passed")
	}
}
