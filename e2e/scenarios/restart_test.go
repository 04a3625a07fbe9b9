package scenarios

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// TestRestart: nftproxy restarted with unchanged API state reads its table
// back and writes nothing, and connections through a ClusterIP made during
// the restart all succeed (upstream rewrites everything, kubernetes#130119).
func TestRestart(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	a, b := c.backend(1, "a"), c.backend(1, "b")
	client := n1.AddPod("client")
	ips := c.service("web", 80, false, v1.ProtocolTCP)
	c.endpoints("web", backendPort, a, b)
	addr := vip(ips, 80)
	c.eventually(client.Netns, "tcp", addr, 30, "a and b", onlyFrom("a", "b"))

	// About 4 s of connections, one every 10 ms, each from a new port.
	dialer := client.Start(c.probe, "dial", "--proto", "tcp", "--addr", addr.String(),
		"--timeout", "1s", "--count", "400", "--interval", "10ms")
	time.Sleep(500 * time.Millisecond)
	c.proxy[n1.Name].Stop(10 * time.Second)
	started := time.Now()
	c.proxy[n1.Name] = n1.Start(c.args[n1.Name]...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The families sync side by side: wait for IPv4's, which may come second.
	if err := c.proxy[n1.Name].WaitForLog(ctx, `"Synced" ipFamily="IPv4"`); err != nil {
		t.Fatal(err)
	}
	synced := regexp.MustCompile(`"Synced" ipFamily="IPv4" full=true fromKernel=true .* ops=(\d+)`).FindStringSubmatch(c.proxy[n1.Name].Log())
	if synced == nil {
		t.Fatalf("no first IPv4 sync from the table read back in the log:\n%s", c.proxy[n1.Name].Log())
	}
	if synced[1] != "0" {
		t.Errorf("restart with unchanged API state sent %s operations, want 0", synced[1])
	}
	t.Logf("RESTART first sync %v after start, %s ops", time.Since(started).Round(time.Millisecond), synced[1])

	select {
	case <-dialer.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("dialer did not finish")
	}
	lines := strings.Split(strings.TrimSpace(dialer.Log()), "\n")
	got := answeredBy(lines)
	if n := got["a"] + got["b"]; n != 400 {
		failed := map[string]int{}
		for _, l := range lines {
			if f := strings.Fields(l); len(f) != 2 || (f[0] != "a" && f[0] != "b") {
				failed[l]++
			}
		}
		t.Errorf("%d of 400 connections during the restart answered; failures: %v", n, failed)
	}
	t.Logf("RESTART connections %d/400 answered (a %d, b %d)", got["a"]+got["b"], got["a"], got["b"])
}

// TestEarlyConnectionAttempt: a client that tried a ClusterIP before its node had
// rules (the node's first start, say) is not refused once they exist. Its attempt went
// past without DNAT, and conntrack keeps it in SYN_SENT for two minutes: every
// retransmitted SYN, and any new connection from the same source port, belongs to it and
// skips the NAT hook, so the rules never see it and it ends in the check that refuses
// traffic to a ClusterIP that was not DNATed. The sync that installs a TCP frontend
// deletes such attempts (upstream kube-proxy does not).
func TestEarlyConnectionAttempt(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	a := c.backend(1, "early-a")
	client := n1.AddPod("early")
	ips := c.service("early", 80, false, v1.ProtocolTCP)
	c.endpoints("early", backendPort, a)
	addr := vip(ips, 80)
	c.eventually(client.Netns, "tcp", addr, 3, "early-a", onlyFrom("early-a"))

	// The node without nftproxy and without its tables.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c.proxy[n1.Name].Stop(10 * time.Second)
	if out, err := n1.Exec(ctx, c.args[n1.Name][0], "--cleanup"); err != nil {
		t.Fatalf("nftproxy --cleanup: %v\n%s", err, out)
	}
	// Another program's rules that use conntrack (a CNI's, say): without any, the
	// kernel tracks no connection in the namespace. nftproxy's own first batch does
	// the same while the kernel processes it: its base chains are hooked, and so
	// conntrack enabled, before its rules are committed.
	if out, err := n1.Exec(ctx, "nft", "add table ip early-other; add chain ip early-other check { type filter hook forward priority 10; ct state invalid drop; }"); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}

	// The early attempt, from a fixed source port: nothing answers it (the control
	// namespace has no route to the ClusterIP), and the node keeps it un-NATed.
	const sport = "42101"
	dialFrom := func() string {
		out, err := client.Exec(ctx, c.probe, "dial", "--proto", "tcp", "--addr", addr.String(),
			"--timeout", "1s", "--source-port", sport)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		return strings.TrimSpace(out)
	}
	if got := dialFrom(); strings.HasPrefix(got, "early-a ") {
		t.Fatalf("answered without rules on %s: %q", n1.Name, got)
	}
	attempt := []string{"-p", "tcp", "-d", ips[0].String(), "--orig-port-src", sport}
	flows, raw := c.ctList(n1, attempt...)
	if len(flows) != 1 || flows[0].replySrc != ips[0].String() || !strings.Contains(raw, "UNREPLIED") {
		t.Fatalf("want one unanswered flow from port %s to %s, not DNATed, on %s:\n%s", sport, ips[0], n1.Name, raw)
	}

	// nftproxy starts; its first sync deletes the attempt, and the same port then
	// reaches the Service.
	started := time.Now()
	c.proxy[n1.Name] = n1.Start(c.args[n1.Name]...)
	if err := c.proxy[n1.Name].WaitForLog(ctx, "Synced"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if flows, raw = c.ctList(n1, attempt...); len(flows) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the first sync, the early attempt is still in %s's conntrack table:\n%s", n1.Name, raw)
		}
	}
	t.Logf("EARLY attempt deleted %v after start", time.Since(started).Round(time.Millisecond))
	if got := dialFrom(); !strings.HasPrefix(got, "early-a ") {
		t.Errorf("from source port %s after the first sync: %q, want an answer from early-a", sport, got)
	}
}
