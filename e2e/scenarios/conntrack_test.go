package scenarios

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// ctMaxRecovery is how soon after an EndpointSlice update a long-lived UDP or SCTP flow
// must reach the new backend (issue 3).
const ctMaxRecovery = time.Second

// TestConntrack proves that no stale UDP or SCTP conntrack flow survives a change: a client
// sending every 10 ms from one source port (one conntrack flow, like a DNS client) follows
// its Service to a new backend within ctMaxRecovery, even though the old backend still runs
// and would keep answering a stale flow forever. Measured times are logged as
// "RECOVERY <case> <N>ms".
func TestConntrack(t *testing.T) {
	top := newCluster(t)
	n1, n2 := top.nodes[0], top.nodes[1]
	// Everything that creates namespaces is done here, on the test's goroutine.
	client := n2.AddPod("ctclient")
	ext := top.bed.AddNode("ext") // outside client: no nftproxy
	cipA, cipB := top.backend(0, "cip-a"), top.backend(1, "cip-b")
	npA, npB := top.backend(1, "np-a"), top.backend(0, "np-b")
	zeroA, zeroC := top.backend(0, "zero-a"), top.backend(1, "zero-c")
	delA := top.backend(0, "del-a")
	sctpA, sctpB := top.backend(0, "sctp-a"), top.backend(1, "sctp-b")

	t.Run("UDP ClusterIP backend replaced", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("ct-cip", 53, false, v1.ProtocolUDP)
		c.ctReplaceBackend(ctReplaceCase{
			label: "clusterip-replace", proto: "udp", svc: "ct-cip", from: client.Netns,
			addr: vip(ips, 53), sport: 41001, a: cipA, b: cipB,
			ctNode: n2, ctArgs: []string{"-p", "udp", "-d", ips[0].String(), "--orig-port-src", "41001"},
		})
	})

	t.Run("UDP NodePort from outside, backend replaced", func(t *testing.T) {
		c := top.sub(t)
		_, nodePort := c.ctNodePortService("ct-np", 53, v1.ProtocolUDP)
		np := fmt.Sprint(nodePort)
		c.ctReplaceBackend(ctReplaceCase{
			label: "nodeport-replace", proto: "udp", svc: "ct-np", from: ext.Netns,
			addr: netip.AddrPortFrom(n1.IPv4, uint16(nodePort)), sport: 41002, a: npA, b: npB,
			ctNode: n1, ctArgs: []string{"-p", "udp", "-d", n1.IPv4.String(), "--orig-port-dst", np, "--orig-port-src", "41002"},
		})
	})

	t.Run("UDP Service scaled to zero and back to a new pod", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("ct-zero", 53, false, v1.ProtocolUDP)
		addr := vip(ips, 53)
		c.endpoints("ct-zero", backendPort, zeroA)
		c.eventually(client.Netns, "udp", addr, 3, "zero-a", onlyFrom("zero-a"))
		s := c.ctStartStream(client.Netns, "udp", addr, 41003)
		if _, ok := s.first("zero-a", 5*time.Second); !ok {
			t.Fatalf("%s: no answer from zero-a:\n%s", s.desc, s.proc.Log())
		}
		time.Sleep(200 * time.Millisecond)

		toZero := time.Now()
		c.endpoints("ct-zero", backendPort) // no endpoints
		time.Sleep(1500 * time.Millisecond) // long enough to see a stale flow keep answering
		flows, raw := c.ctList(n2, "-p", "udp", "-d", ips[0].String(), "--orig-port-src", "41003")
		for _, f := range flows {
			if f.replySrc == zeroA.IPv4.String() {
				t.Errorf("1.5 s after scaling to zero, a flow to %s still points at the old backend on %s:\n%s", addr, n2.Name, raw)
			}
		}

		back := time.Now()
		c.endpoints("ct-zero", backendPort, zeroC)
		firstC, ok := s.first("zero-c", 5*time.Second)
		sum := s.stop()
		events := s.events()
		lastA := sum.listTime("lasts", "zero-a")
		t.Logf("%s: %s", s.desc, sum.raw)
		ctRecovery(t, "zero-stop", lastA.Sub(toZero))
		if lastA.Sub(toZero) > ctMaxRecovery {
			t.Errorf("old backend zero-a kept answering %v after the Service was scaled to zero (want < %v); stream:\n%s",
				lastA.Sub(toZero).Round(time.Millisecond), ctMaxRecovery, ctStreamLines(events))
		}
		if !ok {
			flows, raw := c.ctList(n2, "-p", "udp", "-d", ips[0].String())
			t.Fatalf("no answer from the new pod zero-c within 5 s of scaling back up (%d flows on %s):\n%s\nstream:\n%s",
				len(flows), n2.Name, raw, ctStreamLines(events))
		}
		ctRecovery(t, "zero-to-new", firstC.Sub(back))
		if firstC.Sub(back) > ctMaxRecovery {
			t.Errorf("first answer from zero-c %v after the EndpointSlice update, want < %v",
				firstC.Sub(back).Round(time.Millisecond), ctMaxRecovery)
		}
		if sw := ctSwitchesTo(events, "zero-a", firstC); len(sw) > 0 {
			t.Errorf("zero-a answered again after zero-c: %s", sw[0].raw)
		}
	})

	t.Run("UDP Service deleted, no flow to its ClusterIP remains", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("ct-del", 53, false, v1.ProtocolUDP)
		addr := vip(ips, 53)
		c.endpoints("ct-del", backendPort, delA)
		c.eventually(client.Netns, "udp", addr, 3, "del-a", onlyFrom("del-a"))
		s := c.ctStartStream(client.Netns, "udp", addr, 41004)
		if _, ok := s.first("del-a", 5*time.Second); !ok {
			t.Fatalf("%s: no answer from del-a:\n%s", s.desc, s.proc.Log())
		}
		time.Sleep(200 * time.Millisecond)
		if flows, raw := c.ctList(n2, "-d", ips[0].String()); len(flows) == 0 {
			t.Fatalf("no conntrack flow to %s on %s while the stream runs (looking in the wrong place?):\n%s", ips[0], n2.Name, raw)
		}

		deleted := time.Now()
		c.ctDeleteService("ct-del")
		var raw string
		var flows []ctFlow
		for deadline := deleted.Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			// All protocols: no flow of any kind may keep the old ClusterIP alive.
			if flows, raw = c.ctList(n2, "-d", ips[0].String()); len(flows) == 0 {
				ctRecovery(t, "service-delete-flush", time.Since(deleted))
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("2 s after deleting Service ct-del, %d conntrack flows to its ClusterIP %s remain on %s (the client keeps sending):\n%s",
					len(flows), ips[0], n2.Name, raw)
				break
			}
		}
		sum := s.stop()
		t.Logf("%s: %s", s.desc, sum.raw)
	})

	t.Run("SCTP ClusterIP backend replaced", func(t *testing.T) {
		c := top.sub(t)
		ips := c.service("ct-sctp", 9, false, v1.ProtocolSCTP)
		c.ctReplaceBackend(ctReplaceCase{
			label: "sctp-clusterip-replace", proto: "sctp", svc: "ct-sctp", from: client.Netns,
			addr: vip(ips, 9), sport: 41005, a: sctpA, b: sctpB,
			ctNode: n2, ctArgs: []string{"-p", "sctp", "-d", ips[0].String(), "--orig-port-src", "41005"},
		})
	})
}

// ctReplaceCase is one "single backend replaced under a running client" scenario.
type ctReplaceCase struct {
	label  string // for the RECOVERY line
	proto  string // udp or sctp
	svc    string
	from   testbed.Netns // the client
	addr   netip.AddrPort
	sport  int
	a, b   *testbed.Pod  // old and new backend; both keep running
	ctNode *testbed.Node // node whose conntrack table holds the NATed flow
	ctArgs []string      // conntrack -L filter selecting the client's flow on ctNode
}

// ctReplaceBackend runs a stream against the Service with backend a, switches the
// EndpointSlice to b and requires the first answer from b within ctMaxRecovery, the flow in
// ctNode's conntrack table to point at b, and a to still answer when reached directly.
func (c *cluster) ctReplaceBackend(rc ctReplaceCase) {
	t := c.t
	t.Helper()
	c.endpoints(rc.svc, backendPort, rc.a)
	c.eventually(rc.from, rc.proto, rc.addr, 3, rc.a.Name, onlyFrom(rc.a.Name))
	s := c.ctStartStream(rc.from, rc.proto, rc.addr, rc.sport)
	if _, ok := s.first(rc.a.Name, 5*time.Second); !ok {
		t.Fatalf("%s: no answer from %s:\n%s", s.desc, rc.a.Name, s.proc.Log())
	}
	time.Sleep(200 * time.Millisecond)
	// The scenario is only meaningful if the client's flow is in conntrack, DNATed to a.
	flows, raw := c.ctList(rc.ctNode, rc.ctArgs...)
	if len(flows) != 1 || flows[0].replySrc != rc.a.IPv4.String() {
		_, all := c.ctList(rc.ctNode)
		t.Fatalf("want one flow pointing at %s (%s) on %s before the switch, got:\n%s\nwhole table:\n%s", rc.a.Name, rc.a.IPv4, rc.ctNode.Name, raw, all)
	}

	switched := time.Now()
	c.endpoints(rc.svc, backendPort, rc.b)
	firstB, ok := s.first(rc.b.Name, 5*time.Second)
	if !ok {
		flows, raw := c.ctList(rc.ctNode, rc.ctArgs...)
		s.stop()
		t.Fatalf("%s: no answer from the new backend %s within 5 s of the EndpointSlice update; %d flows on %s:\n%s\nstream:\n%s",
			s.desc, rc.b.Name, len(flows), rc.ctNode.Name, raw, ctStreamLines(s.events()))
	}
	took := firstB.Sub(switched)
	ctRecovery(t, rc.label, took)
	if took > ctMaxRecovery {
		t.Errorf("first answer from %s %v after the EndpointSlice update, want < %v", rc.b.Name, took.Round(time.Millisecond), ctMaxRecovery)
	}

	time.Sleep(300 * time.Millisecond)
	// The kernel's view: the client's flow now points at b, and no flow at a remains.
	flows, raw = c.ctList(rc.ctNode, rc.ctArgs...)
	if len(flows) != 1 || flows[0].replySrc != rc.b.IPv4.String() {
		t.Errorf("after the switch want one flow pointing at %s (%s) on %s, got:\n%s", rc.b.Name, rc.b.IPv4, rc.ctNode.Name, raw)
	}
	// a is alive: a stale flow would still have reached it.
	direct := netip.AddrPortFrom(rc.a.IPv4, backendPort)
	if lines := c.dial(rc.from, rc.proto, direct, 1); len(lines) != 1 || !strings.HasPrefix(lines[0], rc.a.Name+" ") {
		t.Errorf("old backend %s at %s does not answer directly: %q", rc.a.Name, direct, lines)
	}

	sum := s.stop()
	events := s.events()
	t.Logf("%s: %s", s.desc, sum.raw)
	if sw := ctSwitchesTo(events, rc.a.Name, firstB); len(sw) > 0 {
		t.Errorf("%s answered again after %s: %s", rc.a.Name, rc.b.Name, sw[0].raw)
	}
	if sum.kv["last"] != rc.b.Name {
		t.Errorf("last answer from %q, want %s; stream:\n%s", sum.kv["last"], rc.b.Name, ctStreamLines(events))
	}
}

// ctStreamLines renders a stream's events for a failure message.
func ctStreamLines(events []ctEvent) string {
	var b strings.Builder
	for _, e := range events {
		b.WriteString(e.raw)
		b.WriteByte('\n')
	}
	return b.String()
}
