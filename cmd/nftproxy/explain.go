package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/nft/trace"
)

// newExplainLoader opens the read-only netlink socket explain reads the
// kernel's table with, its rules decoded; tests open one on a namespace of
// their own.
var newExplainLoader = func() (nft.Loader, io.Closer, error) {
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{ReadOnly: true, Rules: true})
	return n, n, err
}

// explainNode is what explain asks of the node it runs on; tests give
// their own.
var explainNode = struct {
	localAddrs     func() ([]netip.Addr, error)
	routeInterface func(netip.Addr) (string, error)
}{localAddrs, routeInterface}

// explainQuery is the packet to explain, from the command line.
type explainQuery struct {
	from, iif, proto, output string
	to                       netip.AddrPort
}

// parseExplain reads `nftproxy explain [flags] ADDRESS:PORT`.
func parseExplain(args []string, stderr io.Writer) (explainQuery, error) {
	var q explainQuery
	fs := pflag.NewFlagSet("nftproxy explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: nftproxy explain [--from ADDRESS|node] [--iif NAME] [--protocol tcp|udp|sctp] [-o text|json] ADDRESS:PORT")
		fmt.Fprintln(stderr, "Traces the first packet of a connection through the nftproxy tables of this network namespace.")
		fs.PrintDefaults()
	}
	fs.StringVar(&q.from, "from", "node", "Source `ADDRESS` of the packet (a pod, or an address outside the cluster), or node for a process on the node itself.")
	fs.StringVar(&q.iif, "iif", "", "`NAME` of the interface the packet arrives on (default: the interface the node routes the source through).")
	fs.StringVarP(&q.proto, "protocol", "p", "tcp", "Transport `PROTOCOL`: tcp, udp or sctp.")
	fs.StringVarP(&q.output, "output", "o", "text", "`FORMAT` of the report: text or json.")
	if err := fs.Parse(args); err != nil {
		return q, err
	}
	if fs.NArg() != 1 {
		return q, fmt.Errorf("want one destination ADDRESS:PORT, got %d arguments", fs.NArg())
	}
	to, err := netip.ParseAddrPort(fs.Arg(0))
	if err != nil {
		return q, fmt.Errorf("destination: %w", err)
	}
	q.to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	if _, ok := protoNumbers[q.proto]; !ok {
		return q, fmt.Errorf("--protocol %q: not tcp, udp or sctp", q.proto)
	}
	if q.output != "text" && q.output != "json" {
		return q, fmt.Errorf("--output %q: not text or json", q.output)
	}
	return q, nil
}

var protoNumbers = map[string]uint8{"tcp": nft.ProtoTCP, "udp": nft.ProtoUDP, "sctp": nft.ProtoSCTP}

// executeExplain runs `nftproxy explain` and returns its exit status: 0
// when it explained the packet, 2 on error.
func executeExplain(ctx context.Context, args []string, env environment) int {
	q, err := parseExplain(args, env.stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	var ex *explanation
	if err == nil {
		ex, err = explain(ctx, q)
	}
	if err == nil {
		err = ex.write(env.stdout, q.output)
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "nftproxy explain: %v\n", err)
		return 2
	}
	return 0
}

// explanation is explain's report.
type explanation struct {
	Packet   trace.Packet    `json:"packet"`
	Outcomes []explainResult `json:"outcomes"`
}

// explainResult is one way the packet can go.
type explainResult struct {
	Verdict    string     `json:"verdict"` // accept, drop or reject
	To         string     `json:"to,omitempty"`
	Share      float64    `json:"share"`
	Masquerade bool       `json:"masquerade"`
	Service    string     `json:"service,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	Path       trace.Path `json:"path"`
	Warnings   []string   `json:"warnings,omitempty"`
}

// explain reads the table of the destination's family from the kernel and
// traces the packet through it.
func explain(ctx context.Context, q explainQuery) (*explanation, error) {
	local, err := explainNode.localAddrs()
	if err != nil {
		return nil, err
	}
	pkt := trace.Packet{Dst: q.to.Addr(), DPort: q.to.Port(), Proto: protoNumbers[q.proto], Iif: q.iif}
	if q.from == "node" {
		pkt.FromNode = true
		pkt.Src = explainSource(q.to.Addr(), local)
	} else if pkt.Src, err = netip.ParseAddr(q.from); err != nil {
		return nil, fmt.Errorf("--from: %w", err)
	}
	pkt.Src = pkt.Src.Unmap()
	if pkt.Src.Is4() != pkt.Dst.Is4() {
		return nil, fmt.Errorf("source %v and destination %v are of different IP families", pkt.Src, pkt.Dst)
	}
	if !pkt.FromNode && slices.Contains(local, pkt.Src) && q.iif == "" {
		pkt.FromNode = true // a process on the node (or a host-network pod)
	}
	if !pkt.FromNode && pkt.Iif == "" {
		if pkt.Iif, err = explainNode.routeInterface(pkt.Src); err != nil {
			return nil, fmt.Errorf("%w (give the input interface with --iif)", err)
		}
	}
	f := nft.IPv4
	if pkt.Dst.Is6() {
		f = nft.IPv6
	}
	loader, closer, err := newExplainLoader()
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	rs, err := loader.Load(ctx, f)
	if err != nil {
		return nil, err
	}
	if rs == nil {
		return nil, fmt.Errorf("no table %s %s in this network namespace: is nftproxy running here?", f, nft.TableName)
	}
	ex := &explanation{Packet: pkt}
	for _, r := range trace.New(map[nft.Family]*nft.Ruleset{f: rs}, local...).Outcomes(pkt) {
		ex.Outcomes = append(ex.Outcomes, newExplainResult(r))
	}
	return ex, nil
}

// explainSource is the address the node sends from: one of its own of the
// destination's family (a loopback one only if it has no other).
func explainSource(dst netip.Addr, local []netip.Addr) netip.Addr {
	var loop netip.Addr
	for _, a := range local {
		if a.Is4() != dst.Is4() || a.IsLinkLocalUnicast() {
			continue
		}
		if !a.IsLoopback() {
			return a
		}
		loop = a
	}
	return loop
}

func newExplainResult(r trace.Result) explainResult {
	out := explainResult{Verdict: string(r.Verdict), Share: r.Share, Masquerade: r.Masquerade,
		Service: r.Service, Reason: r.Reason, Path: r.Path, Warnings: r.Warnings}
	if r.To.IsValid() {
		out.To = r.To.String()
	}
	if out.Path == nil {
		out.Path = trace.Path{}
	}
	return out
}

func (ex *explanation) write(w io.Writer, format string) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(ex)
	}
	_, err := io.WriteString(w, ex.text())
	return err
}

// text is the report for a person: the packet, its outcomes with their
// odds, then the path of the first outcome, chain by chain.
func (ex *explanation) text() string {
	var b strings.Builder
	p := ex.Packet
	from := p.Src.String()
	if p.FromNode {
		from += " (this node)"
	} else {
		from += " arriving on " + p.Iif
	}
	fmt.Fprintf(&b, "%s %s -> %s\n", nft.ProtoName(p.Proto), from, netip.AddrPortFrom(p.Dst, p.DPort))
	if len(ex.Outcomes) > 0 && ex.Outcomes[0].Service != "" {
		fmt.Fprintf(&b, "service %s\n", ex.Outcomes[0].Service)
	}
	var warnings []string
	for _, o := range ex.Outcomes {
		fmt.Fprintf(&b, "%6.2f%%  %s\n", 100*o.Share, o.summary())
		for _, w := range o.Warnings {
			if !slices.Contains(warnings, w) {
				warnings = append(warnings, w)
			}
		}
	}
	if len(ex.Outcomes) > 0 {
		fmt.Fprintf(&b, "path%s:\n", ex.Outcomes[0].pathNote(len(ex.Outcomes)))
		for _, line := range strings.Split(strings.TrimSuffix(ex.Outcomes[0].Path.String(), "\n"), "\n") {
			if line != "" {
				b.WriteString("  " + line + "\n")
			}
		}
	}
	for _, w := range warnings {
		fmt.Fprintf(&b, "warning: %s\n", w)
	}
	return b.String()
}

func (o explainResult) summary() string {
	switch {
	case o.Verdict == string(nft.VerdictDrop) || o.Verdict == string(trace.VerdictReject):
		s := map[string]string{string(nft.VerdictDrop): "dropped", string(trace.VerdictReject): "rejected"}[o.Verdict]
		if o.Reason != "" {
			s += ": " + o.Reason
		}
		return s
	case o.To == "":
		return "not NATed by nftproxy: the packet goes on to its destination unchanged"
	}
	s := "DNAT to " + o.To
	if o.Masquerade {
		s += ", masqueraded"
	} else {
		s += ", source kept"
	}
	return s
}

func (o explainResult) pathNote(n int) string {
	if n > 1 {
		return " (of the first outcome)"
	}
	return ""
}
