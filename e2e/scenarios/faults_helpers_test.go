package scenarios

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// Helpers of the fault tests: a load that counts lost connections, the
// proxy's metrics, restarts, and "the table equals what a fresh proxy
// writes".

// waitFamiliesSynced waits until p logged a sync of each family, after the log's
// first skip bytes.
func waitFamiliesSynced(ctx context.Context, p *testbed.Process, skip int) error {
	for _, fam := range []string{"IPv4", "IPv6"} {
		want := `"Synced" ipFamily="` + fam + `"`
		for !strings.Contains(logFrom(p, skip), want) {
			if err := p.WaitForLog(ctx, want); err != nil {
				return err
			}
			if !strings.Contains(logFrom(p, skip), want) {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
	}
	return nil
}

func logFrom(p *testbed.Process, skip int) string {
	l := p.Log()
	return l[min(skip, len(l)):]
}

// startProxy starts nftproxy on n with args and waits for its first syncs.
func (c *cluster) startProxy(n *testbed.Node, args []string) *testbed.Process {
	c.t.Helper()
	c.args[n.Name] = args
	p := n.Start(args...)
	c.proxy[n.Name] = p
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := waitFamiliesSynced(ctx, p, 0); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// restartProxy stops n's nftproxy (SIGTERM) and starts it with args (nil:
// the same as before).
func (c *cluster) restartProxy(n *testbed.Node, args []string) *testbed.Process {
	c.t.Helper()
	if args == nil {
		args = c.args[n.Name]
	}
	c.proxy[n.Name].Stop(10 * time.Second)
	return c.startProxy(n, args)
}

// withArgs returns args with extra appended, as a new slice.
func withArgs(args []string, extra ...string) []string {
	return append(append([]string(nil), args...), extra...)
}

// startLoad opens rate new TCP connections per second to addr from pod,
// and holds hold long-lived ones (the backends must run serve --echo).
func (c *cluster) startLoad(pod *testbed.Pod, addr netip.AddrPort, rate, hold int) *testbed.Load {
	c.t.Helper()
	return testbed.StartLoad(c.t, pod, c.probe, addr, rate, hold)
}

// expectNothingLost fails the test unless every connection of r was
// answered and no long-lived one broke.
func expectNothingLost(t *testing.T, what string, r testbed.LoadResult) {
	t.Helper()
	lost, summary := r.Lost()
	t.Logf("%s: %s", what, summary)
	if lost {
		t.Errorf("%s: lost connections", what)
	}
}

// metric sums the samples of metric name on n's metrics server whose labels
// include every label given ("k=v").
func (c *cluster) metric(n *testbed.Node, name string, labels ...string) float64 {
	c.t.Helper()
	v, err := testbed.Metric(n.Netns, name, labels...)
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// tables returns n's nftproxy tables of both families, canonical and with
// the endpoint slots resolved (testbed.ResolveSlots).
func (c *cluster) tables(n *testbed.Node) string {
	c.t.Helper()
	s, err := testbed.Tables(n.Netns)
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

// expectFreshTables checks that n's tables equal what a fresh nftproxy
// writes for the same API state: it records them, stops the proxy, deletes
// its tables (--cleanup), starts it again and compares.
func (c *cluster) expectFreshTables(n *testbed.Node) {
	c.t.Helper()
	got := c.tables(n)
	c.proxy[n.Name].Stop(10 * time.Second)
	n.MustExec(c.t, c.args[n.Name][0], "--cleanup")
	c.startProxy(n, c.args[n.Name])
	if want := c.tables(n); got != want {
		c.t.Errorf("the tables differ from a fresh proxy's:\n%s", firstDifferences(got, want, 10))
	}
}

var firstDifferences = testbed.FirstDifferences
