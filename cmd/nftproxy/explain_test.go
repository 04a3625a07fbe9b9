package main

import (
	"context"
	"encoding/json"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
)

// runExplainCommand runs `nftproxy explain args…` on the tables of ns, on
// a node with n1's addresses whose routes all leave by eth0.
func runExplainCommand(t *testing.T, ns *netns.NS, args ...string) (int, string, string) {
	t.Helper()
	savedLoader, savedNode := newExplainLoader, explainNode
	t.Cleanup(func() { newExplainLoader, explainNode = savedLoader, savedNode })
	newExplainLoader = func() (nft.Loader, io.Closer, error) {
		n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd, ReadOnly: true, Rules: true})
		return n, n, err
	}
	explainNode.localAddrs = func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.10.0.11"), netip.MustParseAddr("fd00:10::11")}, nil
	}
	explainNode.routeInterface = func(netip.Addr) (string, error) { return "eth0", nil }
	var stdout, stderr strings.Builder
	env := testEnv(nil)
	env.stdout, env.stderr = &stdout, &stderr
	code := execute(context.Background(), append([]string{"explain"}, args...), env)
	return code, stdout.String(), stderr.String()
}

// explainJSON runs explain with -o json and decodes the report.
func explainJSON(t *testing.T, ns *netns.NS, args ...string) explanation {
	t.Helper()
	code, out, errOut := runExplainCommand(t, ns, append([]string{"-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("explain %v: exit %d: %s", args, code, errOut)
	}
	var ex explanation
	if err := json.Unmarshal([]byte(out), &ex); err != nil {
		t.Fatalf("explain %v: %v\n%s", args, err, out)
	}
	return ex
}

// TestExplainAgainstKernel: explain reads the tables a proxy programmed
// and says, for packets of each kind of Service, where they go, with what
// odds and why; after the table is tampered with it follows the tampered
// rule.
func TestExplainAgainstKernel(t *testing.T) {
	ns := netns.New(t, "nftproxy-explain", "nft")
	owner := programDesired(t, ns, fake.NewClientset(dumpTestObjects()...))
	type outcome struct {
		verdict, to, reason string
		masq                bool
	}
	half := 0.5
	cases := []struct {
		name    string
		args    []string
		service string
		want    []outcome
		share   *float64
	}{
		{"ClusterIP from a pod", []string{"--from", "10.244.1.9", "10.96.0.10:80"}, "ns/web:tcp",
			[]outcome{{"accept", "10.244.1.2:8080", "", false}, {"accept", "10.244.2.2:8080", "", false}}, &half},
		{"ClusterIP UDP", []string{"--from", "10.244.1.9", "-p", "udp", "10.96.0.10:53"}, "ns/web:udp",
			[]outcome{{"accept", "10.244.1.2:8080", "", false}, {"accept", "10.244.2.2:8080", "", false}}, &half},
		{"ClusterIP in IPv6", []string{"--from", "fd00:244::9", "[fd00:96::10]:80"}, "ns/web:tcp",
			[]outcome{{"accept", "[fd00:244:1::2]:8080", "", false}}, nil},
		{"NodePort from the node, masqueraded", []string{"10.10.0.11:30011"}, "ns/np:tcp",
			[]outcome{{"accept", "10.244.2.3:8080", "", true}}, nil},
		{"LB IP from outside its source ranges", []string{"--from", "203.0.113.99", "192.0.2.12:80"}, "ns/lb:tcp",
			[]outcome{{"drop", "", "source outside loadBalancerSourceRanges", false}}, nil},
		{"LB IP from inside its source ranges", []string{"--from", "198.51.100.7", "192.0.2.12:80"}, "ns/lb:tcp",
			[]outcome{{"accept", "10.244.1.4:8080", "", true}, {"accept", "10.244.2.4:8080", "", true}}, &half},
		{"no endpoints", []string{"--from", "10.244.1.9", "10.96.0.15:80"}, "ns/empty:tcp",
			[]outcome{{"reject", "", "services with no endpoints: reject, or drop when only a Local policy has none", false}}, nil},
		{"unallocated ClusterIP", []string{"--from", "10.244.1.9", "10.96.0.99:80"}, "",
			[]outcome{{"drop", "", "drop traffic to unallocated ClusterIPs", false}}, nil},
		{"not a Service", []string{"--from", "10.244.1.9", "10.244.2.2:8080"}, "",
			[]outcome{{"accept", "", "", false}}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ex := explainJSON(t, ns, tc.args...)
			var got []outcome
			for _, o := range ex.Outcomes {
				got = append(got, outcome{o.Verdict, o.To, o.Reason, o.Masquerade})
				if o.Service != tc.service || tc.share != nil && o.Share != *tc.share {
					t.Errorf("service %q share %v, want %q %v", o.Service, o.Share, tc.service, tc.share)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("outcomes %+v, want %+v\n%+v", got, tc.want, ex)
			}
		})
	}

	// The text names the Service, each endpoint with its odds, and the path.
	code, out, _ := runExplainCommand(t, ns, "--from", "10.244.1.9", "10.96.0.10:80")
	for _, want := range []string{"tcp 10.244.1.9 arriving on eth0 -> 10.96.0.10:80", "service ns/web:tcp",
		" 50.00%  DNAT to 10.244.1.2:8080, source kept", "chain services", "vmap @service-ips: 10.96.0.10 . tcp . 80 (ns/web:tcp)"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("explain text (exit %d) lacks %q:\n%s", code, want, out)
		}
	}

	// Tampered: a rule put first in chain services drops the ClusterIP.
	owner.Close() // the table is no longer owned, so nft can change it
	if _, err := ns.Run("", "nft", "insert", "rule", "ip", nft.TableName, "services", "ip", "daddr", "10.96.0.10", "counter", "drop"); err != nil {
		t.Fatal(err)
	}
	ex := explainJSON(t, ns, "--from", "10.244.1.9", "10.96.0.10:80")
	if len(ex.Outcomes) != 1 || ex.Outcomes[0].Verdict != "drop" || len(ex.Outcomes[0].Warnings) != 1 ||
		!strings.Contains(ex.Outcomes[0].Warnings[0], "ip daddr 10.96.0.10 [counter] drop") {
		t.Errorf("tampered table: %+v", ex.Outcomes)
	}
}

// TestExplainUsage: bad command lines are exit status 2 with a reason.
func TestExplainUsage(t *testing.T) {
	ns := netns.New(t, "nftproxy-explain", "nft")
	for _, args := range [][]string{
		{},
		{"10.96.0.10"},
		{"-p", "icmp", "10.96.0.10:80"},
		{"-o", "yaml", "10.96.0.10:80"},
		{"--from", "fd00::1", "10.96.0.10:80"},
		{"10.96.0.10:80", "10.96.0.11:80"},
	} {
		if code, _, errOut := runExplainCommand(t, ns, args...); code != 2 || errOut == "" {
			t.Errorf("explain %v: exit %d, stderr %q; want 2 with a reason", args, code, errOut)
		}
	}
	// No table in the namespace: said plainly.
	if code, _, errOut := runExplainCommand(t, ns, "10.96.0.10:80"); code != 2 || !strings.Contains(errOut, "no table ip nftproxy") {
		t.Errorf("explain without a table: exit %d, %q", code, errOut)
	}
}
