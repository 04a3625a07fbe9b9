package model_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/fuzzstate"
)

// FuzzServicePorts derives the service ports of fuzzed Services and
// EndpointSlices for both families: it must not panic, and the ports must
// be what a reference derivation, written plainly below, says.
func FuzzServicePorts(f *testing.F) {
	for _, s := range fuzzstate.Seeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		st := fuzzstate.Decode(data)
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			for _, svc := range st.Services {
				slices := st.SlicesOf(fam, svc.Name)
				checkServicePorts(t, fam, st.Node, svc, slices, model.ServicePorts(fam, st.Node, svc, slices))
			}
		}
	})
}

func checkServicePorts(t *testing.T, f nft.Family, node model.Node, svc *model.Service, ess []*model.EndpointSlice,
	got []model.ServicePortState) {
	t.Helper()
	var vip netip.Addr
	for _, ip := range svc.ClusterIPs {
		if f.Contains(ip) {
			vip = ip
		}
	}
	if !vip.IsValid() {
		if len(got) != 0 {
			t.Fatalf("%s: %d %s ports without a ClusterIP of the family", svc.Name, len(got), f)
		}
		return
	}
	if len(got) != len(svc.Ports) {
		t.Fatalf("%s: %d ports, want %d", svc.Name, len(got), len(svc.Ports))
	}
	for i, sp := range got {
		p := svc.Ports[i]
		want := model.ServicePortName{ServiceName: svc.Name, Port: p.Name, Protocol: p.Protocol}
		if sp.Name != want || sp.ClusterIP != vip || sp.Port != p.Port || sp.NodePort != p.NodePort {
			t.Fatalf("%s: port %+v from %+v", svc.Name, sp, p)
		}
		for _, a := range append(append([]netip.Addr(nil), sp.ExternalIPs...), sp.LoadBalancerIPs...) {
			if !f.Contains(a) {
				t.Fatalf("%s: %s port with external address %v", svc.Name, f, a)
			}
		}
		if len(sp.SourceRanges) > 0 && len(sp.LoadBalancerIPs) == 0 || sp.ExternalLocal && !sp.HasExternal() {
			t.Fatalf("%s: source ranges %v without load balancer IPs, or external policy without external frontends", svc.Name, sp.SourceRanges)
		}
		cands := candidates(ess, p)
		cluster := readyElseTerminating(cands, func(model.Endpoint) bool { return true })
		if !hinted(cands) && !slices.Equal(sp.Endpoints, cluster) {
			t.Fatalf("%s: endpoints %v, want %v", sp.Name, sp.Endpoints, cluster)
		}
		for _, ep := range sp.Endpoints {
			if !slices.Contains(cluster, ep) {
				t.Fatalf("%s: endpoint %v not among %v", sp.Name, ep, cluster)
			}
		}
		if (len(sp.Endpoints) == 0) != (len(cluster) == 0) {
			t.Fatalf("%s: endpoints %v of %v", sp.Name, sp.Endpoints, cluster)
		}
		local := readyElseTerminating(cands, func(e model.Endpoint) bool { return e.OnNode(node.Name) })
		if !slices.Equal(sp.LocalEndpoints, local) {
			t.Fatalf("%s: local endpoints %v, want %v", sp.Name, sp.LocalEndpoints, local)
		}
		ready := 0
		for _, c := range cands {
			if c.e.Ready && c.e.OnNode(node.Name) {
				ready++
			}
		}
		if sp.LocalReady != ready {
			t.Fatalf("%s: %d local ready endpoints, want %d", sp.Name, sp.LocalReady, ready)
		}
	}
}

type cand struct {
	ap netip.AddrPort
	e  model.Endpoint
}

// candidates are the endpoints that may serve p, each once (the first
// listing wins): of a slice with a port of p's name and protocol, ready or
// serving and terminating.
func candidates(ess []*model.EndpointSlice, p model.ServicePort) []cand {
	var out []cand
	seen := map[netip.AddrPort]bool{}
	for _, es := range ess {
		port := uint16(0)
		for _, ep := range es.Ports {
			if ep.Name == p.Name && ep.Protocol == p.Protocol && port == 0 {
				port = ep.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range es.Endpoints {
			ap := netip.AddrPortFrom(e.IP.Addr(), port)
			if !e.Ready && !(e.Serving && e.Terminating) || seen[ap] {
				continue
			}
			seen[ap] = true
			out = append(out, cand{ap, e})
		}
	}
	return out
}

// readyElseTerminating returns, sorted, the ready candidates that keep
// takes, or if there are none, the serving terminating ones.
func readyElseTerminating(cs []cand, keep func(model.Endpoint) bool) []netip.AddrPort {
	var ready, term []netip.AddrPort
	for _, c := range cs {
		switch {
		case !keep(c.e):
		case c.e.Ready:
			ready = append(ready, c.ap)
		case c.e.Serving && c.e.Terminating:
			term = append(term, c.ap)
		}
	}
	out := ready
	if len(out) == 0 {
		out = term
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return out
}

func hinted(cs []cand) bool {
	for _, c := range cs {
		if len(c.e.ZoneHints()) > 0 || len(c.e.NodeHints()) > 0 {
			return true
		}
	}
	return false
}
