package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// monitorOn runs a Monitor in ns that ignores the commits of ours; it
// returns the channel its reports arrive on.
func monitorOn(t *testing.T, ns *testNS, ours ...*Netlink) (*Monitor, <-chan Commit) {
	t.Helper()
	var ports []uint32
	for _, n := range ours {
		ports = append(ports, n.PortID())
	}
	m, err := NewMonitor(NetlinkOptions{NetNSFd: ns.Fd}, ports...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan Commit, 100)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx, func(c Commit) { reports <- c }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("monitor: %v", err)
		}
		m.Close()
	})
	return m, reports
}

// next returns the next report.
func next(t *testing.T, reports <-chan Commit) Commit {
	t.Helper()
	select {
	case c := <-reports:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no report from the monitor")
	}
	return Commit{}
}

func changeLines(c Commit) []string {
	var out []string
	for _, ch := range c.Changes {
		out = append(out, ch.String())
	}
	slices.Sort(out)
	return out
}

// TestMonitorReportsForeignCommits: every kind of change another process
// commits to table nftproxy is reported with the process that made it;
// nftproxy's own commits and changes to other tables are not. (A report
// that should not be made would come before the one expected next.)
func TestMonitorReportsForeignCommits(t *testing.T) {
	ns := newTestNS(t)
	f := nft.IPv4
	n := ns.netlink(t)
	svcs := nfttest.MakeServices(f, 10, 2)
	committed := nfttest.RealisticRuleset(f, svcs)
	_, reports := monitorOn(t, ns, n)
	apply(t, n, nft.FullRewrite(committed))
	next2 := nfttest.RealisticRuleset(f, append(svcs, nfttest.MakeService(f, 50, 2)))
	apply(t, n, nft.Diff(committed, next2))
	ns.mustNft(t, "", "add", "table", "ip", "firewall")
	ns.mustNft(t, "", "add", "chain", "ip", "firewall", "input", "{ type filter hook input priority 0; }")

	svc := svcs[3]
	tampers := []struct {
		name, nft string
		want      []string
	}{
		{"delete a service-ips element", fmt.Sprintf("delete element ip nftproxy service-ips { %s . tcp . 80 }", svc.ClusterIP),
			[]string{"ip deleted: 1 element of set service-ips"}},
		{"flush a service chain", fmt.Sprintf("flush chain ip nftproxy %s", svc.Chain()),
			[]string{"ip deleted: 2 rule in chain " + svc.Chain()}},
		{"insert a drop rule into services", "insert rule ip nftproxy services drop",
			[]string{"ip added: 1 rule in chain services"}},
		{"delete the table", "delete table ip nftproxy",
			nil}, // everything: checked below
	}
	for _, tc := range tampers {
		t.Run(tc.name, func(t *testing.T) {
			ns.mustNft(t, tc.nft+"\n", "-f", "-")
			c := next(t, reports)
			if c.Process != "nft" || c.PID == 0 || c.GenID == 0 || c.Lost {
				t.Errorf("commit by %q pid %d gen %d lost %v, want nft's", c.Process, c.PID, c.GenID, c.Lost)
			}
			if got := c.Families(); !slices.Equal(got, []nft.Family{nft.IPv4}) {
				t.Errorf("families %v, want [ip]", got)
			}
			got := changeLines(c)
			if tc.want != nil && !slices.Equal(got, tc.want) {
				t.Errorf("changes %q, want %q", got, tc.want)
			}
			if tc.want == nil && !slices.Contains(got, "ip deleted: 1 table") {
				t.Errorf("changes %q, want the table deleted among them", got)
			}
		})
	}
}

// TestMonitorPause: while paused nothing is reported; a pause during which
// only nftproxy committed is silent, one during which another process
// committed reports a Lost commit.
func TestMonitorPause(t *testing.T) {
	ns := newTestNS(t)
	f := nft.IPv6
	n := ns.netlink(t)
	m, reports := monitorOn(t, ns, n)
	rs := nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 10, 2))

	resume := m.Pause()
	apply(t, n, nft.FullRewrite(rs))
	m.Committed(n.LastBatch().GenID)
	resume()
	ns.mustNft(t, "", "add", "chain", "ip6", nft.TableName, "probe-1")
	if c := next(t, reports); c.Lost || len(c.Changes) != 1 || c.Changes[0].Name != "probe-1" {
		t.Fatalf("after a pause with only our commit: %+v, want the probe's chain", c)
	}

	// A commit of ours that the kernel made before a pause began and that
	// is reported after (another family's): not one the pause missed.
	apply(t, n, nft.FullRewrite(rs))
	early := n.LastBatch().GenID
	if early == 0 {
		t.Fatal("no generation reported for a commit")
	}
	resume = m.Pause()
	m.Committed(early)
	resume()
	ns.mustNft(t, "", "add", "chain", "ip6", nft.TableName, "probe-early")
	if c := next(t, reports); c.Lost || len(c.Changes) != 1 || c.Changes[0].Name != "probe-early" {
		t.Fatalf("after a pause with a commit of ours from before it: %+v, want the probe's chain", c)
	}

	// Nested pauses, as two families syncing at once; another process
	// commits in the middle.
	resumeA, resumeB := m.Pause(), m.Pause()
	ns.mustNft(t, "", "add", "chain", "ip6", nft.TableName, "unseen")
	resumeA()
	resumeB()
	if c := next(t, reports); !c.Lost {
		t.Fatalf("after a pause with a foreign commit: %+v, want Lost", c)
	}
	ns.mustNft(t, "", "add", "chain", "ip6", nft.TableName, "probe-2")
	if c := next(t, reports); c.Lost || c.Changes[0].Name != "probe-2" {
		t.Fatalf("after resuming: %+v, want the probe's chain", c)
	}
}
