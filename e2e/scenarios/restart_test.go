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
	if err := c.proxy[n1.Name].WaitForLog(ctx, "Synced"); err != nil {
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
