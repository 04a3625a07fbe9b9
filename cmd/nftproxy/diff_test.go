package main

import (
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// runDiffCommand runs `nftproxy diff` with dumpArgs' flags and extra
// ones against the kernel tables of ns and the API client, and returns
// the exit status and standard output.
func runDiffCommand(t *testing.T, ns *netns.NS, client kubernetes.Interface, extra ...string) (int, string) {
	t.Helper()
	savedClient, savedLoader := newDumpClient, newDiffLoader
	t.Cleanup(func() { newDumpClient, newDiffLoader = savedClient, savedLoader })
	newDumpClient = func(clientOptions) (kubernetes.Interface, error) { return client, nil }
	newDiffLoader = func() (nft.Loader, io.Closer, error) {
		n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd, ReadOnly: true})
		return n, n, err
	}
	var stdout, stderr syncBuffer
	env := testEnv(nil)
	env.stdout, env.stderr = &stdout, &stderr
	args := append(append([]string{"diff"}, dumpArgs[1:]...), extra...)
	code := execute(context.Background(), args, env)
	if err := logsapi.ResetForTest(nil); err != nil {
		t.Fatal(err)
	}
	if code == 2 {
		t.Fatalf("nftproxy %v: exit status 2: %s", args, stderr.String())
	}
	return code, stdout.String()
}

// programDesired writes, in ns, the tables a proxy with dumpArgs' flags
// programs for client's objects, as the proxy does (an owned table).
func programDesired(t *testing.T, ns *netns.NS, client kubernetes.Interface) *nftnl.Netlink {
	t.Helper()
	o, err := parseCommandOptions("test", dumpArgs[1:], testEnv(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := watch.List(context.Background(), client, o.Proxier.NodeName)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := watch.NewSnapshot(o.Proxier.NodeName, objs)
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd, OwnTable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	for _, f := range enabledFamilies(o.Proxier) {
		if err := n.Apply(context.Background(), nft.FullRewrite(proxier.Desired(o.Proxier, f, snap))); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestDiffAgainstKernel: tables programmed as the proxy does (and owned by
// its socket) diff clean, exit 0 and print nothing; without them every
// family's table is missing; after an element is deleted, another added to
// the same set and a rule added to a Service chain (the table not owned
// then), diff exits 1 and names exactly those, in text and JSON.
func TestDiffAgainstKernel(t *testing.T) {
	ns := netns.New(t, "nftproxy-diff", "nft")
	client := fake.NewClientset(dumpTestObjects()...)
	if code, out := runDiffCommand(t, ns, client); code != 1 || strings.Count(out, ": missing in the kernel") != 2 {
		t.Errorf("no tables: exit %d:\n%s", code, out)
	}
	programmed := programDesired(t, ns, client)
	if code, out := runDiffCommand(t, ns, client); code != 0 || out != "" {
		t.Fatalf("tables as programmed: exit %d:\n%s", code, out)
	}
	// Closed, the proxy's socket leaves the table ownerless: nft may
	// change it.
	programmed.Close()
	chain := dispatchChain(t, ns, "10.96.0.11")
	tamper := "delete element ip nftproxy cluster-ips { 10.96.0.11 }\n" +
		"add element ip nftproxy cluster-ips { 10.96.9.9 }\n" +
		"add rule ip nftproxy " + chain + " counter\n"
	if out, err := ns.Run(tamper, "nft", "-f", "-"); err != nil {
		t.Fatalf("tampering: %v %s", err, out)
	}
	code, out := runDiffCommand(t, ns, client)
	t.Logf("tampered:\n%s", out)
	want := "table ip nftproxy: cluster-ips elements differ: 1 missing, 1 extra\n" +
		"\t- element 10.96.9.9\n\t+ element 10.96.0.11\n" +
		"table ip nftproxy: chain " + chain + " rules differ: the kernel has 2 rules, 1 rule desired; desired:\n"
	if code != 1 || !strings.HasPrefix(out, want) || strings.Count(out, "table ") != 2 {
		t.Errorf("tampered: exit %d:\n%s\nwant 1 and\n%s\t+ <the desired rules>", code, out, want)
	}
	code, out = runDiffCommand(t, ns, client, "-o", "json")
	var drifts []nft.Drift
	if err := json.Unmarshal([]byte(out), &drifts); err != nil || code != 1 || len(drifts) != 2 || drifts[0].IPFamily != "IPv4" || len(drifts[0].Sets) != 1 ||
		len(drifts[0].Chains) != 1 || drifts[0].Chains[0].Name != chain || !drifts[1].Empty() {
		t.Errorf("tampered, JSON: exit %d, %v:\n%s", code, err, out)
	}
}

// dispatchChain is the chain service-ips, in ns's IPv4 table, sends TCP
// traffic to ClusterIP vip to: the pick chain of its number of endpoints.
func dispatchChain(t *testing.T, ns *netns.NS, vip string) string {
	t.Helper()
	listing, err := ns.Run("", "nft", "list", "table", "ip", nft.TableName)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(regexp.QuoteMeta(vip+" . tcp . ") + `\d+ comment "[^"]*" : goto ([^,\s}]+)`).FindStringSubmatch(listing)
	if m == nil {
		t.Fatalf("no service-ips element of %s:\n%s", vip, listing)
	}
	return m[1]
}

// TestDiffRefusesBadOptions: diff runs none of the proxy's commands and
// knows two output formats; either mistake is exit status 2, as an error
// is (1 would say the tables differ).
func TestDiffRefusesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"diff", "--cleanup"}, "--cleanup: not a diff option"},
		{[]string{"diff", "-o", "yaml"}, `--output "yaml": not text or json`},
		{[]string{"diff", "--init-only"}, "--init-only: not a diff option"},
		{[]string{"diff", "stray", "arg"}, "unexpected arguments"},
	} {
		if code, _, stderr := executeForTest(t, nil, tc.args...); code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2, %q", tc.args, code, stderr, tc.want)
		}
	}
}
