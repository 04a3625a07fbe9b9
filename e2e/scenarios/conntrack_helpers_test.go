package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// ctStream is a `probe stream` running in the background in a namespace: one flow (fixed
// source port) sending every 10 ms. See e2e/cmd/probe/stream.go for its output.
type ctStream struct {
	t    *testing.T
	proc *testbed.Process
	desc string
}

// ctEvent is one line of a stream's output: "KIND key=value ...".
type ctEvent struct {
	kind string
	kv   map[string]string
	raw  string
}

// time returns a "key=UnixNanos" field as a time (zero if absent or 0).
func (e ctEvent) time(key string) time.Time {
	n, err := strconv.ParseInt(e.kv[key], 10, 64)
	if err != nil || n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// int returns a numeric field (-1 if absent).
func (e ctEvent) int(key string) int {
	n, err := strconv.Atoi(e.kv[key])
	if err != nil {
		return -1
	}
	return n
}

// list returns a "a:N,b:M" field as a map.
func (e ctEvent) list(key string) map[string]string {
	out := map[string]string{}
	for _, item := range strings.Split(e.kv[key], ",") {
		if k, v, ok := strings.Cut(item, ":"); ok {
			out[k] = v
		}
	}
	return out
}

// listTime returns the time of name in a "a:T,b:T" field (zero if absent).
func (e ctEvent) listTime(key, name string) time.Time {
	return ctEvent{kv: map[string]string{"t": e.list(key)[name]}}.time("t")
}

func parseCTStream(log string) []ctEvent {
	var out []ctEvent
	for _, line := range strings.Split(log, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.Contains(f[1], "=") {
			continue // not an event (e.g. ip netns exec noise)
		}
		e := ctEvent{kind: f[0], kv: map[string]string{}, raw: line}
		for _, kv := range f[1:] {
			if k, v, ok := strings.Cut(kv, "="); ok {
				e.kv[k] = v
			}
		}
		out = append(out, e)
	}
	return out
}

// ctStartStream starts `probe stream` from ns to addr from source port sport. It runs until
// stop (at most 90 s).
func (c *cluster) ctStartStream(from testbed.Netns, proto string, addr netip.AddrPort, sport int) *ctStream {
	c.t.Helper()
	p := from.Start(c.probe, "stream", "--proto", proto, "--addr", addr.String(),
		"--interval", "10ms", "--duration", "90s", "--sport", strconv.Itoa(sport))
	s := &ctStream{t: c.t, proc: p, desc: fmt.Sprintf("%s stream %s -> %s (sport %d)", proto, from.NS, addr, sport)}
	c.t.Cleanup(func() { p.Stop(2 * time.Second) })
	return s
}

func (s *ctStream) events() []ctEvent { return parseCTStream(s.proc.Log()) }

// first waits up to timeout for the first answer from backend name and returns its time.
func (s *ctStream) first(name string, timeout time.Duration) (time.Time, bool) {
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		for _, e := range s.events() {
			if e.kind == "first" && e.kv["name"] == name {
				return e.time("at"), true
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
	}
}

// stop ends the stream and returns its summary line (failing the test without one).
func (s *ctStream) stop() ctEvent {
	s.t.Helper()
	s.proc.Stop(2 * time.Second)
	for _, e := range s.events() {
		if e.kind == "summary" {
			return e
		}
	}
	s.t.Fatalf("%s: no summary in its output:\n%s", s.desc, s.proc.Log())
	return ctEvent{}
}

// ctSwitchesTo returns the "switch" events to outcome to after time after.
func ctSwitchesTo(events []ctEvent, to string, after time.Time) []ctEvent {
	var out []ctEvent
	for _, e := range events {
		if e.kind == "switch" && e.kv["to"] == to && e.time("at").After(after) {
			out = append(out, e)
		}
	}
	return out
}

// ctFlow is one line of `conntrack -L`: the original and the reply tuple,
// and with nf_conntrack_acct on, the packets and bytes of both directions
// together.
type ctFlow struct {
	origSrc, origDst, replySrc, replyDst         string
	origSport, origDport, replySport, replyDport string
	packets, bytes                               uint64
	raw                                          string
}

// conntrack lists the flows of a node's conntrack table matching args (conntrack -L
// filters, e.g. "-p", "udp", "-d", VIP). It returns the parsed flows and the raw output.
func (c *cluster) ctList(n *testbed.Node, args ...string) ([]ctFlow, string) {
	c.t.Helper()
	out, err := n.Exec(context.Background(), append([]string{"conntrack", "-L"}, args...)...)
	if err != nil {
		c.t.Fatalf("conntrack -L %v on %s: %v", args, n.Name, err)
	}
	var flows []ctFlow
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := ctFlow{raw: line}
		srcs, dsts, sports, dports := 0, 0, 0, 0
		for _, tok := range strings.Fields(line) {
			k, v, ok := strings.Cut(tok, "=")
			if !ok {
				continue
			}
			switch k {
			case "src":
				f.origSrc, f.replySrc = ctPick(srcs, f.origSrc, f.replySrc, v)
				srcs++
			case "dst":
				f.origDst, f.replyDst = ctPick(dsts, f.origDst, f.replyDst, v)
				dsts++
			case "sport":
				f.origSport, f.replySport = ctPick(sports, f.origSport, f.replySport, v)
				sports++
			case "dport":
				f.origDport, f.replyDport = ctPick(dports, f.origDport, f.replyDport, v)
				dports++
			case "packets", "bytes":
				x, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					c.t.Fatalf("conntrack -L on %s: %q: %v", n.Name, tok, err)
				}
				if k == "packets" {
					f.packets += x
				} else {
					f.bytes += x
				}
			}
		}
		if srcs == 2 {
			flows = append(flows, f)
		}
	}
	return flows, out
}

// pick sets the first (i == 0) or the second (i == 1) of a pair of values.
func ctPick(i int, first, second, v string) (string, string) {
	if i == 0 {
		return v, second
	}
	return first, v
}

// ctNodePortService creates a selector-less Service of type NodePort with one port and
// returns its ClusterIP and node port.
func (c *cluster) ctNodePortService(name string, port int32, proto v1.Protocol) (netip.Addr, int32) {
	c.t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: v1.ServiceSpec{
			Type:  v1.ServiceTypeNodePort,
			Ports: []v1.ServicePort{{Name: strings.ToLower(string(proto)), Port: port, Protocol: proto}},
		},
	}
	got, err := c.client.CoreV1().Services(c.ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create service %s: %v", name, err)
	}
	return netip.MustParseAddr(got.Spec.ClusterIP), got.Spec.Ports[0].NodePort
}

// ctDeleteService deletes a Service and the EndpointSlices c.endpoints wrote for it (as the
// garbage collector would).
func (c *cluster) ctDeleteService(name string) {
	c.t.Helper()
	ctx := context.Background()
	if err := c.client.CoreV1().Services(c.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("delete service %s: %v", name, err)
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		c.client.DiscoveryV1().EndpointSlices(c.ns).Delete(ctx, name+"-"+fam, metav1.DeleteOptions{})
	}
}

// recovery logs a measured time in the form the closing note collects:
// "RECOVERY <label> <N>ms".
func ctRecovery(t *testing.T, label string, d time.Duration) {
	t.Helper()
	t.Logf("RECOVERY %s %dms", label, d.Milliseconds())
}

// ctFlows lists every TCP flow of n's conntrack table.
func (c *cluster) ctFlows(n *testbed.Node) []ctFlow {
	flows, _ := c.ctList(n, "-p", "tcp")
	return flows
}
