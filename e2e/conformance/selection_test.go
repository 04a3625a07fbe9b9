package conformance

import (
	"bufio"
	"os"
	"regexp"
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

// TestSelectionOfV1372 checks the sets against the tests of v1.37.2: the 47
// conformance tests, and a reason for each test the broader set leaves out,
// with every Skips entry covering at least one test (no stale entry).
func TestSelectionOfV1372(t *testing.T) {
	names := sigNetworkTests(t)
	if len(names) != 249 {
		t.Fatalf("%d tests in testdata, want 249", len(names))
	}
	conf, wide := 0, 0
	used := make([]int, len(Skips))
	for _, n := range names {
		if SetConformance.Selected(n) {
			conf++
		}
		if SetNetwork.Selected(n) {
			wide++
			continue
		}
		if SkipReason(n) == "" {
			t.Errorf("left out without a reason: %s", n)
		}
		for i, sk := range Skips {
			if regexp.MustCompile(sk.Pattern).MatchString(n) {
				used[i]++
			}
		}
	}
	if conf != 47 || wide != 142 {
		t.Errorf("conformance selects %d (want 47), sig-network %d (want 142)", conf, wide)
	}
	for i, n := range used {
		if n == 0 {
			t.Errorf("Skips[%d] (%s) covers no test of v1.37.2", i, Skips[i].Pattern)
		}
	}
}

func TestSelection(t *testing.T) {
	for _, tc := range []struct {
		name              string
		conformance, wide bool
	}{
		{"[sig-network] Services should serve a basic endpoint from pods  [Conformance]", true, true},
		{"[sig-network] Services should be able to up and down services", false, true},
		{"[sig-network] Netpol API should support creating NetworkPolicy API operations", false, true},
		{"[sig-network] Services should serve endpoints on same port and different protocol for internal traffic on Type LoadBalancer", false, true},
		{"[sig-network] Networking should provide Internet connection for containers [Feature:Networking-IPv4]", false, false},
		{"[sig-network] Services should work after restarting kube-proxy [Disruptive]", false, false},
		{"[sig-apps] Deployment should run the lifecycle of a Deployment [Conformance]", false, false},
	} {
		if got := SetConformance.Selected(tc.name); got != tc.conformance {
			t.Errorf("conformance selects %q: %v", tc.name, got)
		}
		if got := SetNetwork.Selected(tc.name); got != tc.wide {
			t.Errorf("sig-network selects %q: %v", tc.name, got)
		}
	}
	for _, s := range []Set{SetConformance, SetNetwork} {
		for _, p := range []string{s.Focus(), s.SkipPattern()} {
			if _, err := regexp.Compile(p); err != nil {
				t.Errorf("%s: %v", s, err)
			}
		}
	}
	if SetConformance.SkipPattern() != "" {
		t.Error("the conformance set skips tests")
	}
}
