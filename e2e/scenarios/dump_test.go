package scenarios

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/nft"
)

// TestDump: `nftproxy dump` against the API server, for each node, prints
// the tables the node's running nftproxy programmed into its kernel (`nft
// list table`, up to the endpoints-map slots and the order of elements),
// for Services of every kind; and `kubectl get
// svc,endpointslices,nodes,servicecidrs -A -o yaml` of the same objects,
// given to --from-file, gives the same dump.
func TestDump(t *testing.T) {
	c := newCluster(t)
	kubectl := filepath.Join(testbed.EnsureBinaries(t), "kubectl")
	a, b := c.backend(0, "a"), c.backend(1, "b")
	c.service("web", 80, true, v1.ProtocolTCP, v1.ProtocolUDP)
	c.endpoints("web", backendPort, a, b)
	c.extCreate("np", v1.ServiceTypeNodePort, false, nil)
	c.endpoints("np", backendPort, b)
	c.extCreate("lb", v1.ServiceTypeLoadBalancer, true, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "2001:db8::/64"}
		s.Spec.ExternalIPs = []string{"203.0.113.7"}
	})
	c.extSetIngress("lb", v1.LoadBalancerIngress{IP: "198.51.100.7"}, v1.LoadBalancerIngress{IP: "2001:db8:51::7"})
	c.endpoints("lb", backendPort, a, b)
	c.extCreate("local", v1.ServiceTypeLoadBalancer, false, func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	})
	c.endpoints("local", backendPort, a)
	c.extCreate("sticky", v1.ServiceTypeClusterIP, false, func(s *v1.Service) {
		timeout := int32(300)
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
	})
	c.endpoints("sticky", backendPort, a, b)
	c.service("empty", 80, true, v1.ProtocolTCP)

	fromAPI := map[string]string{}
	for _, n := range c.nodes {
		fromAPI[n.Name] = c.awaitDumpEqualsKernel(n)
	}
	if fromAPI["n1"] == fromAPI["n2"] {
		t.Errorf("the dumps of n1 and n2 are the same: the node is not taken into account")
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	listing, err := c.bed.Ctl.Exec(ctx, kubectl, "--kubeconfig", c.bed.AdminKubeconfig,
		"get", "svc,endpointslices,nodes,servicecidrs", "-A", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "objects.yaml")
	if err := os.WriteFile(file, []byte(listing), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.nodes {
		// No --kubeconfig: the dump reads the file only.
		args := []string{c.args[n.Name][0], "dump", "--from-file", file, "--hostname-override", n.Name, "--cluster-cidr", clusterCIDRs}
		if got := n.MustExec(t, args...); got != fromAPI[n.Name] {
			t.Errorf("%s: dump --from-file of kubectl's YAML differs from the dump of the API:\n%s",
				n.Name, firstDifferences(got, fromAPI[n.Name], 10))
		}
	}
}

// dumpCommand is n's nftproxy command line as `nftproxy dump`.
func (c *cluster) dumpCommand(n *testbed.Node) []string {
	args := c.args[n.Name]
	return slices.Concat(args[:1], []string{"dump"}, args[1:])
}

// awaitDumpEqualsKernel waits, for up to 30 s, until `nftproxy dump` for
// node n (its proxy's own command line) equals n's kernel tables, both
// canonical with the slots resolved, and returns the dump as printed. The
// proxy syncs the Services created last while the test waits.
func (c *cluster) awaitDumpEqualsKernel(n *testbed.Node) string {
	c.t.Helper()
	var dump, want, got string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		dump = n.MustExec(c.t, c.dumpCommand(n)...)
		want, got = c.tables(n), resolvedTables(c.t, dump)
		if got == want {
			return dump
		}
	}
	c.t.Fatalf("%s: the dump differs from the kernel's tables:\n%s\ndump:\n%s", n.Name, firstDifferences(got, want, 20), dump)
	return ""
}

// resolvedTables is a dump (an ip and an ip6 table) as testbed.Tables puts
// a node's tables: each canonical, with the endpoints slots resolved.
func resolvedTables(t *testing.T, dump string) string {
	t.Helper()
	i := strings.Index(dump, "table ip6 ")
	if !strings.HasPrefix(dump, "table ip ") || i < 0 {
		t.Fatalf("the dump is not an ip and an ip6 table:\n%s", dump)
	}
	return testbed.ResolveSlots(nft.Canonical(dump[:i])) + testbed.ResolveSlots(nft.Canonical(dump[i:]))
}
