package scenarios

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestRewriteUnderLoad: nftproxy restarts six times while a client opens
// 100 new connections a second to a ClusterIP of a cluster of a thousand
// Services and holds 20 long-lived ones. Each restart switches
// --own-tables, so that the table's persistence must change and each
// start rewrites the IPv4 table whole instead of reading it back (see
// nft/nftnl/rewrite.go: the rewrite hands over through a second table).
// No connection may be refused or broken; the old rewrite (add, delete,
// add in one batch) refused a few at each restart.
func TestRewriteUnderLoad(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	c.storeUnanswered("rw", 1000)
	a, b := c.backendEcho(0, "rw-a"), c.backendEcho(1, "rw-b")
	client := n1.AddPod("rw-client")
	ips := c.service("rw-web", 80, false, v1.ProtocolTCP)
	c.endpoints("rw-web", backendPort, a, b)
	addr := vip(ips, 80)
	c.eventually(client.Netns, "tcp", addr, 10, "rw-a and rw-b", onlyFrom("rw-a", "rw-b"))

	base := c.args[n1.Name]
	l := c.startLoad(client, addr, 100, 20)
	for i := range 6 {
		own := fmt.Sprintf("--own-tables=%v", i%2 == 1) // the default is true
		p := c.restartProxy(n1, withArgs(base, own))
		if !strings.Contains(p.Log(), `"No table to read back; writing it" ipFamily="IPv4"`) {
			t.Fatalf("restart %d (%s) did not rewrite the IPv4 table:\n%s", i, own, p.Log())
		}
	}
	expectNothingLost(t, "restarts that rewrite the table", l.Stop())
}
