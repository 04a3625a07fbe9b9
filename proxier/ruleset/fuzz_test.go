package ruleset

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/trace"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/fuzzstate"
)

var families = []nft.Family{nft.IPv4, nft.IPv6}

// fuzzConfig is the configuration of the fuzz targets' node (see
// fuzzstate: pods in 10.244.0.0/16, Services in 10.96.0.0/12), with
// localhost NodePorts refused, so that fuzzed names reach that map too.
func fuzzConfig(f nft.Family) Config {
	cfg := Config{MasqueradeMark: 0x4000, LocalhostNodePorts: rejectAll}
	pods, services := "10.244.0.0/16", "10.96.0.0/12"
	if f == nft.IPv6 {
		pods, services = "fd00:244::/48", "fd00:96::/112"
	}
	cfg.LocalTraffic.CIDRs = []netip.Prefix{netip.MustParsePrefix(pods)}
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix(services)}
	for _, a := range fuzzstate.NodeAddrs {
		if f.Contains(a) {
			cfg.NodePorts.Addresses = []netip.Addr{a}
		}
	}
	return cfg
}

// fuzzPorts are the service ports of a decoded state in family f, Service
// by Service.
func fuzzPorts(st fuzzstate.State, f nft.Family) []model.ServicePortState {
	var ports []model.ServicePortState
	for _, svc := range st.Services {
		ports = append(ports, model.ServicePorts(f, st.Node, svc, st.SlicesOf(f, svc.Name))...)
	}
	return ports
}

// FuzzBuild runs the whole pure path on fuzzed Services and EndpointSlices:
// model → ruleset → the Fake, which must take the ruleset whole; its
// listing must be text nft reads (checkListing); and a packet to each
// frontend of each service port must reach that port's endpoints, or be
// rejected or dropped as the port says. A frontend that several ports
// share (two Services with one external IP and port, which the API allows)
// must not fail the ruleset; where its packets go is not checked. The same
// table built Service by Service, as the proxier does, must match it at
// every step (checkIncremental).
func FuzzBuild(f *testing.F) {
	for _, s := range fuzzstate.Seeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := fuzzstate.Decode(data)
		fk := nftfake.New()
		for _, fam := range families {
			ports := fuzzPorts(st, fam)
			rs := Build(fuzzConfig(fam), fam, ports)
			if err := fk.Apply(context.Background(), nft.Diff(nil, rs)); err != nil {
				t.Fatalf("%s: %v", fam, err)
			}
			if err := checkListing(rs.Dump()); err != nil {
				t.Fatalf("%s: %v", fam, err)
			}
			traceFrontends(t, fk, fam, ports)
			checkIncremental(t, st, fam, nil)
		}
	})
}

// kernelTable is a table in a kernel that checkIncremental applies each
// transaction to as well, and whose listing it compares with the Fake's.
type kernelTable interface {
	nft.Interface
	Listing(t *testing.T, f nft.Family) string
	// AsListed is a Dump as the listing's nft lists it, in Canonical
	// form (nfttest.NftLanguage.Listing).
	AsListed(t *testing.T, dump string) string
}

// checkIncremental builds the table the proxier's way: one fragment per
// Service through an nft.Editor, a transaction per Service added, then per
// Service removed (Services sharing a frontend among them). Every
// transaction must apply, and the table must always be what Build makes of
// the Services left; with a kernel, every transaction must apply there
// too, and leave the table the Fake has.
func checkIncremental(t *testing.T, st fuzzstate.State, f nft.Family, kernel kernelTable) {
	t.Helper()
	cfg := fuzzConfig(f)
	fk, ed, slots := nftfake.New(), nft.NewEditor(f), NewSlots()
	for _, s := range Sets(f, cfg) {
		ed.AddSet(s)
	}
	ed.Replace(nil, Base(cfg, f))
	ports := make([][]model.ServicePortState, len(st.Services))
	frags := make([]*nft.Fragment, len(st.Services))
	live := make([]bool, len(st.Services))
	var picks *nft.Fragment
	step := func(what string) {
		t.Helper()
		picks = slots.UpdatePicks(f, ed, picks)
		tx := ed.Transaction()
		if err := fk.Apply(context.Background(), tx); err != nil {
			t.Fatalf("%s, %s: %v", f, what, err)
		}
		if kernel != nil {
			if err := kernel.Apply(context.Background(), tx); err != nil {
				t.Fatalf("%s, %s: the kernel: %v", f, what, err)
			}
			if got, want := nft.Canonical(kernel.Listing(t, f)), kernel.AsListed(t, fk.Ruleset(f).Dump()); got != want {
				t.Fatalf("%s, %s: the kernel's table is\n%s\nthe Fake's\n%s", f, what, got, want)
			}
		}
		ed.Commit()
		slots.Commit()
		var want []model.ServicePortState
		for i := range ports {
			if live[i] {
				want = append(want, ports[i]...)
			}
		}
		got, built := CanonicalSlots(fk.Ruleset(f)).Dump(), CanonicalSlots(Build(cfg, f, want)).Dump()
		if got != built {
			t.Fatalf("%s, %s: the table is\n%s\nBuild makes\n%s", f, what, got, built)
		}
	}
	for i, svc := range st.Services {
		ports[i] = model.ServicePorts(f, st.Node, svc, st.SlicesOf(f, svc.Name))
		if len(ports[i]) == 0 {
			continue
		}
		frags[i], live[i] = ServiceFragment(cfg, ports[i], slots), true
		for _, m := range slots.NewMaps(f) {
			ed.AddSet(m)
		}
		ed.Replace(nil, frags[i])
		step("adding " + svc.Name.String())
	}
	// The last Service added first, then the first, and so on: both the
	// latest holder of a shared element and an earlier one go while
	// another holds it.
	for lo, hi := 0, len(frags)-1; lo <= hi; lo, hi = lo+1, hi-1 {
		for _, i := range []int{hi, lo} {
			if !live[i] {
				continue
			}
			slots.ReleaseGone(frags[i], nil)
			ed.Replace(frags[i], nil)
			live[i] = false
			step("removing " + st.Services[i].Name.String())
		}
	}
}

// Where fuzzed packets come from: a pod of this node (for ClusterIPs),
// and for external frontends, clients outside the cluster, one inside
// some of fuzzstate's source ranges, one outside all but 0.0.0.0/0.
var (
	podClient = map[nft.Family]netip.Addr{nft.IPv4: netip.MustParseAddr("10.244.200.9"),
		nft.IPv6: netip.MustParseAddr("fd00:244::c8:9")}
	outsideClients = map[nft.Family][]netip.Addr{
		nft.IPv4: {netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("198.51.100.99")},
		nft.IPv6: {netip.MustParseAddr("2001:db8:ff::7"), netip.MustParseAddr("fd99::7")}}
)

// frontend is where a packet is sent to reach a service port.
type frontend struct {
	dst      netip.Addr
	port     uint16
	external bool
	lb       bool // a load balancer IP: source ranges apply
}

func frontends(sp *model.ServicePortState, node netip.Addr) []frontend {
	out := []frontend{{dst: sp.ClusterIP, port: sp.Port}}
	for _, a := range sp.ExternalIPs {
		out = append(out, frontend{dst: a, port: sp.Port, external: true})
	}
	for _, a := range sp.LoadBalancerIPs {
		out = append(out, frontend{dst: a, port: sp.Port, external: true, lb: true})
	}
	if sp.NodePort != 0 {
		out = append(out, frontend{dst: node, port: sp.NodePort, external: true})
	}
	return out
}

// traceFrontends traces a packet to every frontend of every port that no
// other port shares.
func traceFrontends(t *testing.T, fk *nftfake.Fake, f nft.Family, ports []model.ServicePortState) {
	t.Helper()
	node := fuzzConfig(f).NodePorts.Addresses[0]
	type key struct {
		proto uint8
		dst   netip.Addr
		port  uint16
	}
	owners := map[key]int{}
	for i := range ports {
		for _, fe := range frontends(&ports[i], node) {
			owners[key{ports[i].Name.Protocol, fe.dst, fe.port}]++
		}
	}
	tr := trace.New(fk.Rulesets(), fuzzstate.NodeAddrs...)
	for i := range ports {
		sp := &ports[i]
		for _, fe := range frontends(sp, node) {
			if owners[key{sp.Name.Protocol, fe.dst, fe.port}] > 1 {
				continue
			}
			srcs := []netip.Addr{podClient[f]}
			if fe.external {
				srcs = outsideClients[f]
			}
			for _, src := range srcs {
				traceFrontend(t, tr, sp, fe, src)
			}
		}
	}
}

// traceFrontend traces a packet from src to fe, every way through a
// random cascade, and checks where it goes.
func traceFrontend(t *testing.T, tr *trace.Tracer, sp *model.ServicePortState, fe frontend, src netip.Addr) {
	t.Helper()
	verdict, want := expect(sp, fe, src)
	pkt := trace.Packet{Src: src, Dst: fe.dst, Proto: sp.Name.Protocol, DPort: fe.port, Iif: "eth0"}
	picks := 1 // a DNAT through an endpoints map lists every endpoint
	if sp.AffinityTimeout > 0 {
		picks = len(sp.Endpoints) + len(sp.LocalEndpoints) // at least as many as a cascade has
	}
	var got []netip.AddrPort
	var res trace.Result
	for tr.Pick = 0; tr.Pick < max(1, picks); tr.Pick++ {
		res = tr.Trace(pkt)
		if res.Verdict != verdict {
			t.Fatalf("%s via %v:%d from %v: %s, want %s\n%s", sp.Name, fe.dst, fe.port, src, res.Verdict, verdict,
				res.Path.String())
		}
		got = append(got, res.DNAT...)
	}
	slices.SortFunc(got, netip.AddrPort.Compare)
	if got = slices.Compact(got); !slices.Equal(got, want) {
		t.Fatalf("%s via %v:%d from %v: DNAT to %v, want %v\n%s", sp.Name, fe.dst, fe.port, src, got, want,
			res.Path.String())
	}
}

// expect is what the port does with a packet from src to fe: the verdict
// and the endpoints it may be sent to (sorted).
func expect(sp *model.ServicePortState, fe frontend, src netip.Addr) (nft.VerdictKind, []netip.AddrPort) {
	if fe.lb && len(sp.SourceRanges) > 0 && !slices.ContainsFunc(sp.SourceRanges, func(p netip.Prefix) bool { return p.Contains(src) }) {
		return nft.VerdictDrop, nil
	}
	if len(sp.Endpoints) == 0 {
		return trace.VerdictReject, nil
	}
	local := fe.external && sp.ExternalLocal || !fe.external && sp.InternalLocal
	if !local {
		return nft.VerdictAccept, sp.Endpoints
	}
	if len(sp.LocalEndpoints) == 0 {
		return nft.VerdictDrop, nil
	}
	return nft.VerdictAccept, sp.LocalEndpoints
}

// What checkListing reads in a listing.
var (
	objectLine = regexp.MustCompile(`^\t(?:chain|set|map) (\S*) \{$`)
	reference  = regexp.MustCompile(`(?:goto |jump |@)([^\s,}]*)`)
	comment    = regexp.MustCompile(`comment "([^"]*)"`)
)

// checkListing checks that a table's listing is text nft reads as the
// same table: object names and references are identifiers (validIdent),
// comments hold only what nft reads back (listedComment), and once the
// comments are taken out, no quote is left and the braces balance.
func checkListing(listing string) error {
	depth := 0
	for _, line := range strings.Split(listing, "\n") {
		if m := objectLine.FindStringSubmatch(line); m != nil && !validIdent(m[1]) {
			return fmt.Errorf("object name %q in %q", m[1], line)
		}
		for _, m := range reference.FindAllStringSubmatch(line, -1) {
			if !validIdent(m[1]) {
				return fmt.Errorf("reference to %q in %q", m[1], line)
			}
		}
		for _, m := range comment.FindAllStringSubmatch(line, -1) {
			if !listedComment(m[1]) {
				return fmt.Errorf("comment %q in %q", m[1], line)
			}
		}
		rest := comment.ReplaceAllString(line, "")
		if strings.ContainsAny(rest, "\"\\\x00") {
			return fmt.Errorf("a quote, backslash or NUL outside a comment in %q", line)
		}
		depth += strings.Count(rest, "{") - strings.Count(rest, "}")
		if depth < 0 {
			return fmt.Errorf("unbalanced braces at %q", line)
		}
	}
	if depth != 0 {
		return fmt.Errorf("%d braces left open", depth)
	}
	return nil
}

// listedComment reports whether nft reads back a comment it listed as s:
// at most maxCommentLen printable ASCII characters, no quote or
// backslash. (What nftproxy derives from names is narrower: validComment.)
func listedComment(s string) bool {
	if len(s) > maxCommentLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
