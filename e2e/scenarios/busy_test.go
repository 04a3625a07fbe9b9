package scenarios

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	proxyreaders "github.com/nftproxy/nftproxy/proxier/readers"
)

// TestReadersOnABusyNode: thousands of Services in the API, tens of
// EndpointSlice updates a second on other Services, nftproxy with its
// defaults. With a process listening on a netfilter socket (`nft monitor`)
// no change waits. With a process stuck in the middle of a dump (it asked
// for one and stopped reading), changes still reach the data path within a
// fraction of a second. Every listing of the ruleset by nft, and another
// process's `nft -f` reload of its own table, finishes within a few times
// what it takes on the idle node, the stuck reader still there; a change of
// a Service still reaches the data path meanwhile, and its latency is
// reported beside them. A table deleted while the stuck reader is there is
// repaired at once. Without the wait for readers (--max-reader-wait=0) the
// same listing does not finish: the control that shows the bed reproduces
// the starvation.
func TestReadersOnABusyNode(t *testing.T) {
	c := newCluster(t)
	n1 := c.nodes[0]
	size := 5000
	if testing.Short() {
		size = 2000
	}
	svcs := c.storeUnanswered("busy", size)
	a, b := c.backend(1, "busy-a"), c.backend(1, "busy-b")
	client := n1.AddPod("busy-client")
	ips := c.service("busy-web", 80, false, v1.ProtocolTCP)
	c.endpoints("busy-web", backendPort, a)
	addr := vip(ips, 80)

	// nftproxy with its defaults (the cluster's proxies sync on every
	// change: --iptables-min-sync-period 0s).
	defaults := slices.DeleteFunc(slices.Clone(c.args[n1.Name]), func(s string) bool {
		return s == "--iptables-min-sync-period" || s == "0s"
	})
	p := c.restartProxy(n1, defaults)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := waitFamiliesSynced(ctx, p, 0); err != nil {
		t.Fatal(err)
	}
	c.eventually(client.Netns, "tcp", addr, 3, "busy-a", onlyFrom("busy-a"))
	// Another process's table, large enough that reading the whole ruleset
	// takes longer than a few commits apart (the control below).
	n1.MustExec(t, "nft", "-f", writeTemp(t, foreignReload(100000, 500)))

	readers := []struct {
		name string
		args []string
	}{
		{"nft list table ip nftproxy", []string{"nft", "list", "table", "ip", "nftproxy"}},
		{"nft list ruleset", []string{"nft", "list", "ruleset"}},
		{"nft -f (a foreign table's reload)", []string{"nft", "-f", writeTemp(t, foreignReload(100000, 500))}},
	}
	idle := map[string]time.Duration{}
	for _, r := range readers {
		var times []time.Duration
		for range 3 {
			d, err := timeCommand(ctx, n1, time.Minute, r.args...)
			if err != nil {
				t.Fatalf("%s, idle: %v", r.name, err)
			}
			times = append(times, d)
		}
		idle[r.name] = medianDuration(times)
	}

	ch := c.startChurn(svcs, 30)
	defer ch.stop()
	mover := &mover{c: c, client: client, addr: addr, pods: []*testbed.Pod{a, b}}

	// A process that listens (nft monitor) holds nothing: no change waits.
	// It lists the ruleset as it starts (a read, which takes about as long
	// as nft list ruleset here); once it prints the churn's first event it
	// only listens, and its socket stops counting as a reader within the
	// longest linger.
	monitor := n1.Start("nft", "monitor")
	defer monitor.Stop(5 * time.Second)
	listening, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := monitor.WaitForLog(listening, "nftproxy"); err != nil {
		t.Fatalf("nft monitor printed no event of the churn: %v", err)
	}
	time.Sleep(proxyreaders.DefaultConfig.MaxLinger)
	waits := c.metric(n1, "nftproxy_reader_wait_seconds_count")
	quiet := mover.times(t, 5)
	if waited := c.metric(n1, "nftproxy_reader_wait_seconds_count") - waits; waited != 0 {
		t.Errorf("%v syncs waited for readers with only nft monitor on the node", waited)
	}
	if worst := slices.Max(quiet); worst > time.Second {
		t.Errorf("a change took %v to reach the data path with only nft monitor on the node", worst)
	}

	// A process stuck in the middle of a dump holds changes once, for the
	// stall limit, then never again.
	stuck := n1.Start(c.probe, "stuck-reader", "--family", "ip", "--table", "nftproxy", "--set", "service-ips")
	defer stuck.Stop(5 * time.Second)
	if err := stuck.WaitForLog(ctx, "stuck"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the stall limit: the stuck reader holds the first wait that meets it
	withStuck := mover.times(t, 5)
	if stalled := c.metric(n1, "nftproxy_readers_ignored_total", "reason=stalled"); stalled < 1 {
		t.Errorf("nftproxy_readers_ignored_total{reason=\"stalled\"} = %v with a reader stuck in a dump, want 1 or more", stalled)
	}
	if p50, worst := medianDuration(withStuck), slices.Max(withStuck); p50 > 250*time.Millisecond || worst > 2*time.Second {
		t.Errorf("with a reader stuck in a dump, a change reached the data path in p50 %v, max %v: want at most 250ms and 2s", p50, worst)
	}

	// Listings one after the other, changes timed meanwhile.
	listing := make(chan struct{})
	var during []time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(listing)
		for i := range 5 {
			for _, r := range readers {
				bound := 3*idle[r.name] + 500*time.Millisecond
				d, err := timeCommand(ctx, n1, bound, r.args...)
				t.Logf("BUSY %s under %.0f updates/s, #%d: %v (idle %v, bound %v)", r.name, ch.rate(), i+1,
					d.Round(time.Millisecond), idle[r.name].Round(time.Millisecond), bound.Round(time.Millisecond))
				if err != nil {
					t.Errorf("%s under churn did not finish within %v (idle %v): %v", r.name, bound, idle[r.name], err)
				}
			}
		}
	})
	for {
		select {
		case <-listing:
		default:
			during = append(during, mover.times(t, 1)...)
			continue
		}
		break
	}
	wg.Wait()
	waited := c.metric(n1, "nftproxy_reader_wait_seconds_count") - waits
	t.Logf("BUSY %d Services, %.0f updates/s: a change reaches the data path in p50 %v, max %v with nft monitor; p50 %v, max %v with a reader stuck in a dump; p50 %v, max %v (%d changes) while nft lists; %v syncs waited for readers",
		size, ch.rate(), medianDuration(quiet).Round(time.Millisecond), slices.Max(quiet).Round(time.Millisecond),
		medianDuration(withStuck).Round(time.Millisecond), slices.Max(withStuck).Round(time.Millisecond),
		medianDuration(during).Round(time.Millisecond), slices.Max(during).Round(time.Millisecond), len(during), waited)
	if waited == 0 {
		t.Error("nftproxy_reader_wait_seconds counts no wait though nft listed under churn")
	}
	if worst := slices.Max(during); worst > 10*time.Second+2*time.Second {
		t.Errorf("a change took %v to reach the data path while nft listed: longer than --max-reader-wait allows", worst)
	}

	// A table deleted while the stuck reader is there (tables not owned,
	// as on kernels before 6.9) is repaired at once.
	c.restartProxy(n1, withArgs(defaults, "--own-tables=false"))
	if err := waitFamiliesSynced(ctx, c.proxy[n1.Name], 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	deleted := time.Now()
	n1.MustExec(t, "nft", "delete", "table", "ip", "nftproxy")
	for {
		if name, err := mover.ask(); err == nil && name == mover.pods[mover.next].Name {
			break
		}
		if time.Since(deleted) > time.Minute {
			t.Fatal("busy-web did not answer again in a minute after its table was deleted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	repaired := time.Since(deleted)
	t.Logf("BUSY a deleted table, a reader stuck in a dump: busy-web answered again %v later", repaired.Round(time.Millisecond))
	if repaired > 2*time.Second {
		t.Errorf("busy-web answered again %v after its table was deleted, with a reader stuck in a dump: want a repair at once", repaired)
	}

	// The control: commits do not wait, and the listing never ends.
	c.restartProxy(n1, withArgs(defaults, "--max-reader-wait=0"))
	if err := waitFamiliesSynced(ctx, c.proxy[n1.Name], 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	limit := 5*idle["nft list ruleset"] + 3*time.Second
	syncs := c.metric(n1, "nftproxy_syncs_total", "ip_family=IPv4", "result=success")
	d, err := timeCommand(ctx, n1, limit, "nft", "list", "ruleset")
	commits := c.metric(n1, "nftproxy_syncs_total", "ip_family=IPv4", "result=success") - syncs
	if err == nil {
		t.Errorf("with --max-reader-wait=0, nft list ruleset under %.0f updates/s (%.0f commits meanwhile) finished in %v: the bed does not reproduce readers being starved",
			ch.rate(), commits, d)
	} else {
		t.Logf("BUSY control: with --max-reader-wait=0 nft list ruleset did not finish in %v (%.0f commits meanwhile)", limit, commits)
	}
}

// foreignReload is another process's table, reloaded whole with nft -f (a
// firewall's): a set of n elements and rules rules.
func foreignReload(n, rules int) string {
	var b strings.Builder
	b.WriteString("table ip busyfw\nflush table ip busyfw\ntable ip busyfw {\n\tset allowed { type ipv4_addr; elements = { ")
	for i := range n {
		fmt.Fprintf(&b, "172.16.%d.%d, ", (i>>8)&255, i&255)
	}
	b.WriteString("172.31.255.255 }; }\n\tchain input { type filter hook input priority 10; policy accept;\n\t\tip saddr @allowed accept\n")
	for i := range rules {
		fmt.Fprintf(&b, "\t\tip saddr 192.0.2.%d tcp dport %d accept\n", i%250+1, 1000+i)
	}
	b.WriteString("\t}\n}\n")
	return b.String()
}

// timeCommand runs args in n and returns how long it took; an error if it
// failed or took longer than limit.
func timeCommand(ctx context.Context, n *testbed.Node, limit time.Duration, args ...string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	_, err := n.Exec(ctx, args...)
	d := time.Since(start)
	if err != nil && ctx.Err() != nil {
		return d, fmt.Errorf("still running after %v", limit)
	}
	return d, err
}

func medianDuration(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	return s[len(s)/2]
}

// churn updates random Services' EndpointSlices at a steady rate.
type churn struct {
	stopc   chan struct{}
	done    chan struct{}
	start   time.Time
	updates int
	mu      sync.Mutex
}

func (c *cluster) startChurn(svcs []testbed.StoredService, perSecond int) *churn {
	ch := &churn{stopc: make(chan struct{}), done: make(chan struct{}), start: time.Now()}
	// A ticker hands the updates to a few writers, so that a slow API
	// server (a busy machine) does not slow the churn down.
	work := make(chan int, perSecond)
	var writers sync.WaitGroup
	for range 4 {
		writers.Go(func() {
			for gen := range work {
				k := (gen * 7919) % len(svcs)
				es := unansweredSlice(svcs[k].Name, k, gen)
				es.Namespace = c.ns
				if _, err := c.client.DiscoveryV1().EndpointSlices(c.ns).Update(context.Background(), es, metav1.UpdateOptions{}); err == nil {
					ch.mu.Lock()
					ch.updates++
					ch.mu.Unlock()
				}
			}
		})
	}
	go func() {
		defer close(ch.done)
		defer writers.Wait()
		defer close(work)
		tick := time.NewTicker(time.Second / time.Duration(perSecond))
		defer tick.Stop()
		for gen := 1; ; gen++ {
			select {
			case <-ch.stopc:
				return
			case <-tick.C:
			}
			select {
			case work <- gen:
			default: // the writers are behind: this tick is lost
			}
		}
	}()
	return ch
}

// rate is the updates per second so far.
func (ch *churn) rate() float64 {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return float64(ch.updates) / time.Since(ch.start).Seconds()
}

func (ch *churn) stop() {
	select {
	case <-ch.stopc:
	default:
		close(ch.stopc)
	}
	<-ch.done
}

// mover moves a Service between two pods and times each move from the API
// write until the new pod answers through the ClusterIP.
type mover struct {
	c      *cluster
	client *testbed.Pod
	addr   netip.AddrPort
	pods   []*testbed.Pod
	next   int
}

func (m *mover) times(t *testing.T, n int) []time.Duration {
	var out []time.Duration
	for range n {
		m.next = (m.next + 1) % len(m.pods)
		pod := m.pods[m.next]
		written := time.Now()
		if err := m.c.writeEndpoints("busy-web", backendPort, pod); err != nil {
			t.Fatal(err)
		}
		for {
			if name, err := m.ask(); err == nil && name == pod.Name {
				break
			}
			if time.Since(written) > time.Minute {
				t.Fatalf("busy-web did not move to %s in a minute", pod.Name)
			}
			time.Sleep(5 * time.Millisecond)
		}
		out = append(out, time.Since(written))
	}
	return out
}

// ask connects to the ClusterIP from the client pod and returns the name
// the server answers with.
func (m *mover) ask() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	conn, err := m.client.DialContext(ctx, "tcp", m.addr.String())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(line, " ")
	return name, nil
}

// writeTemp writes content to a file of the test's and returns its path.
func writeTemp(t *testing.T, content string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "*.nft")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
