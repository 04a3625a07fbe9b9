package scenarios

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// Every connection TestSemantics and TestExternal make is also asked of
// `nftproxy explain` on the node that NATs it, which must predict what the
// connection did: which backends answered, refused or timed out, and the
// source the backend saw (masqueraded or not).

// explainOutcome is the part of explain's JSON report the checks read.
type explainOutcome struct {
	Verdict    string  `json:"verdict"`
	To         string  `json:"to"`
	Share      float64 `json:"share"`
	Masquerade bool    `json:"masquerade"`
	Reason     string  `json:"reason"`
}

// firstHop returns the node whose tables the packets from `from` to dst
// cross first, and the source to explain them with ("node" when from is
// the node itself): a pod's node, or for a namespace outside the nodes
// (a node without nftproxy is such a host) the node it routes dst through
// (or that owns dst).
func (c *cluster) firstHop(from testbed.Netns, dst netip.Addr) (*testbed.Node, string) {
	c.t.Helper()
	var node *testbed.Node
	for _, n := range c.bed.Nodes() {
		if n.NS == from.NS && c.args[n.Name] != nil {
			return n, "node"
		}
		for _, p := range n.Pods() {
			if p.NS == from.NS {
				node = n
			}
		}
	}
	out, err := from.Exec(context.Background(), "ip", "-j", "route", "get", dst.String())
	var routes []struct{ Gateway, Prefsrc string }
	if err == nil {
		err = json.Unmarshal([]byte(out), &routes)
	}
	if err != nil || len(routes) != 1 {
		c.t.Fatalf("ip route get %s in %s: %v %s", dst, from.NS, err, out)
	}
	if node == nil {
		hop := dst
		if gw, err := netip.ParseAddr(routes[0].Gateway); err == nil {
			hop = gw
		}
		node = c.nodeOwning(hop)
	}
	return node, routes[0].Prefsrc
}

// nodeOwning is the node with fabric address a, or nil.
func (c *cluster) nodeOwning(a netip.Addr) *testbed.Node {
	for _, n := range c.bed.Nodes() {
		if n.IPv4 == a || n.IPv6 == a {
			return n
		}
	}
	return nil
}

// explainOn runs `nftproxy explain -o json` in node n.
func (c *cluster) explainOn(n *testbed.Node, src, proto string, addr netip.AddrPort) ([]explainOutcome, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bin := c.args[n.Name][0]
	out, err := n.Exec(ctx, bin, "explain", "-o", "json", "--from", src, "-p", proto, addr.String())
	var rep struct{ Outcomes []explainOutcome }
	if err == nil {
		err = json.Unmarshal([]byte(out), &rep)
	}
	if err != nil {
		c.t.Fatalf("%s: nftproxy explain --from %s -p %s %s: %v\n%s", n.Name, src, proto, addr, err, out)
	}
	text, _ := n.Exec(ctx, bin, "explain", "--from", src, "-p", proto, addr.String())
	return rep.Outcomes, text
}

// explained checks that explain predicts the lines a dial from `from`
// got. A packet the first node does not NAT and that is addressed to
// another node (a NodePort) is explained again on that node.
func (c *cluster) explained(from testbed.Netns, proto string, addr netip.AddrPort, lines []string) {
	c.t.Helper()
	node, src := c.firstHop(from, addr.Addr())
	if node == nil || c.args[node.Name] == nil {
		return // routed nowhere nftproxy runs
	}
	outcomes, text := c.explainOn(node, src, proto, addr)
	if next := c.nodeOwning(addr.Addr()); next != nil && next != node && c.args[next.Name] != nil &&
		len(outcomes) == 1 && outcomes[0].Verdict == "accept" && outcomes[0].To == "" {
		outcomes, text = c.explainOn(next, srcOf(src, node, addr.Addr()), proto, addr)
		node = next
	}
	c.t.Logf("%s %s from %s: nftproxy explain on %s: %s", proto, addr, from.NS, node.Name, outcomeSummary(outcomes))
	for _, l := range lines {
		if why := c.unexplained(l, outcomes, src, node, addr); why != "" {
			c.t.Errorf("%s %s from %s: got %q, but nftproxy explain on %s %s:\n%s", proto, addr, from.NS, l, node.Name, why, text)
			return
		}
	}
}

// srcOf is the source a packet from src (or from node) has when it
// reaches another node unNATed.
func srcOf(src string, node *testbed.Node, dst netip.Addr) string {
	if src != "node" {
		return src
	}
	if dst.Is4() {
		return node.IPv4.String()
	}
	return node.IPv6.String()
}

// unexplained returns why a dial's line contradicts explain's outcomes, or "".
func (c *cluster) unexplained(line string, outcomes []explainOutcome, src string, node *testbed.Node, addr netip.AddrPort) string {
	has := func(ok func(o explainOutcome) bool) bool { return slices.ContainsFunc(outcomes, ok) }
	unNATed := func(o explainOutcome) bool { return o.Verdict == "accept" && o.To == "" }
	switch line {
	case "refused", "unreachable":
		if !has(func(o explainOutcome) bool { return o.Verdict == "reject" || unNATed(o) }) {
			return "predicts no rejection"
		}
		return ""
	case "timeout":
		if !has(func(o explainOutcome) bool { return o.Verdict != "accept" || unNATed(o) }) {
			return "predicts no drop or rejection"
		}
		return ""
	}
	a, ok := semParse(line)
	if !ok {
		return ""
	}
	pod := c.server(a.name)
	if pod == nil {
		// A server on a node (not a backend): the packet is not NATed.
		if !has(unNATed) {
			return "predicts DNAT"
		}
		return ""
	}
	podIP := pod.IPv4
	if addr.Addr().Is6() {
		podIP = pod.IPv6
	}
	i := slices.IndexFunc(outcomes, func(o explainOutcome) bool {
		to, err := netip.ParseAddrPort(o.To)
		return err == nil && o.Verdict == "accept" && to.Addr() == podIP
	})
	if i < 0 {
		return "does not predict backend " + a.name + " (" + podIP.String() + ")"
	}
	client := src
	if src == "node" {
		client = srcOf(src, node, addr.Addr())
	}
	seenAsClient := a.peer.Addr().String() == client
	if outcomes[i].Masquerade == seenAsClient && src != "node" {
		return "predicts masquerade " + map[bool]string{true: "on", false: "off"}[outcomes[i].Masquerade] +
			" for " + a.name + ", which saw " + a.peer.Addr().String()
	}
	return ""
}

// server is the pod that runs the probe server of this name, or nil.
func (c *cluster) server(name string) *testbed.Pod {
	if p, ok := c.servers[name]; ok {
		return p
	}
	for _, n := range c.bed.Nodes() {
		for _, p := range n.Pods() {
			if p.Name == name || strings.EqualFold(p.Name, name) {
				return p
			}
		}
	}
	return nil
}

func outcomeSummary(outcomes []explainOutcome) string {
	var parts []string
	for _, o := range outcomes {
		s := o.Verdict
		if o.To != "" {
			s += " to " + o.To
		}
		if o.Masquerade {
			s += " masqueraded"
		}
		if o.Reason != "" {
			s += " (" + o.Reason + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}
