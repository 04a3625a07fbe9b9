package ruleset

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// TestKernelCountsConnections programs a table with
// --service-traffic-metrics=endpoints into a fresh namespace whose
// endpoints listen on its loopback, opens TCP connections through a
// ClusterIP and a NodePort, each sending data both ways, and reads the
// counters back (nftnl.ReadCounters): each frontend's element of the
// dispatch maps counted its connections and nothing more (one packet
// each: the nat hooks see only a connection's first packet), the
// endpoints' elements their sum, and the elements of service-traffic and
// nodeport-traffic the packets and bytes conntrack's accounting counted
// for the connections, both ways. NodePorts open on the node's address,
// or on every local one (the rules that count replies then ask the
// routing table). The listing with its element counters loads again in
// place of the table (`nft -c -f`).
func TestKernelCountsConnections(t *testing.T) {
	node := ip("10.10.0.1")
	for name, npa := range map[string]NodePortAddresses{
		"primary":   {Addresses: []netip.Addr{node}},
		"all local": {CIDRs: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
	} {
		t.Run(name, func(t *testing.T) { kernelCountsConnections(t, node, npa) })
	}
}

func kernelCountsConnections(t *testing.T, node netip.Addr, npa NodePortAddresses) {
	ns := netns.New(t, "nftproxy-cnt", "nft", "ip", "conntrack", "sysctl")
	eps := []netip.AddrPort{ap("10.244.1.11:8080"), ap("10.244.1.12:8080")}
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", "10.10.0.1/32", "dev", "lo"},
		{"ip", "addr", "add", "10.244.1.11/32", "dev", "lo"},
		{"ip", "addr", "add", "10.244.1.12/32", "dev", "lo"},
		// A route to the ClusterIP: packets to it are DNATed in output,
		// after the routing decision.
		{"ip", "link", "add", "svc0", "type", "veth", "peer", "name", "svc1"},
		{"ip", "link", "set", "svc0", "up"},
		{"ip", "link", "set", "svc1", "up"},
		{"ip", "route", "add", "10.96.0.0/12", "dev", "svc0"},
		{"sysctl", "-qw", "net.netfilter.nf_conntrack_acct=1"},
	} {
		if out, err := ns.Run("", cmd...); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	for _, ep := range eps {
		echoServer(t, ns, ep)
	}
	cfg := countersConfig()
	cfg.NodePorts = npa
	web := spName("default", "web", "http", nft.ProtoTCP)
	ports := []model.ServicePortState{{Name: web, ClusterIP: ip("10.96.0.10"), Port: 80, NodePort: 30080,
		Endpoints: eps, LocalEndpoints: eps}}
	rs := Build(cfg, nft.IPv4, ports)
	nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	if err := nl.Apply(context.Background(), nft.Diff(nil, rs)); err != nil {
		t.Fatal(err)
	}

	const viaClusterIP, viaNodePort = 7, 5
	for i := range viaClusterIP + viaNodePort {
		to := netip.AddrPortFrom(ip("10.96.0.10"), 80)
		if i >= viaClusterIP {
			to = netip.AddrPortFrom(node, 30080)
		}
		echo(t, ns, to, fmt.Sprintf("hello %d", i))
	}

	// The counters and conntrack are read one after the other: first let
	// every connection's last packets (FINs and ACKs, sent after the echo
	// returned) through.
	waitFlowsClosed(t, ns)
	got := map[string]nftnl.Counter{}
	endpoints := nftnl.Counter{}
	if err := nl.ReadCounters(context.Background(), nft.IPv4, func(s *nft.Set, e nft.Element, c nftnl.Counter) {
		if s.EndpointsProto != 0 || s.PickProto != 0 { // the NodePort's slot map and the ClusterIP's pick map
			if e.Comment != Comment(web) {
				t.Errorf("endpoint element %s has comment %q, want %q", s.ElementText(e), e.Comment, Comment(web))
			}
			endpoints.Packets += c.Packets
			return
		}
		got[s.Name+" "+s.KeyString(e.Key)] = c
	}); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]uint64{
		"service-ips 10.96.0.10 . tcp . 80": viaClusterIP,
		"service-nodeports tcp . 30080":     viaNodePort,
	} {
		if got[key].Packets != want || got[key].Bytes == 0 {
			t.Errorf("%s: counter %+v, want %d packets", key, got[key], want)
		}
	}
	for key, dst := range map[string]string{
		"service-traffic 10.96.0.10 . tcp . 80": "dst=10.96.0.10 sport=",
		"nodeport-traffic tcp . 30080":          "dst=10.10.0.1 sport=",
	} {
		if want := conntrackAccounting(t, ns, dst); got[key] != want {
			t.Errorf("%s: counter %+v, want conntrack's %+v", key, got[key], want)
		}
	}
	if endpoints.Packets != viaClusterIP+viaNodePort {
		t.Errorf("endpoints counted %d connections, want %d", endpoints.Packets, viaClusterIP+viaNodePort)
	}
	listing, err := ns.Run("", "nft", "list", "table", "ip", nft.TableName)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := nft.Canonical(listing), nftListing(t, ns, rs); got != want {
		t.Errorf("kernel lists:\n%s\nwant:\n%s", got, want)
	}
	// In place of the table: nft redeclares pick maps with another key
	// type than nftproxy's (nftnl's setKeyMagic), which the kernel
	// refuses for an existing set.
	reload := fmt.Sprintf("delete table ip %s\n%s", nft.TableName, listing)
	if why := systemNft(t, ns).CannotReadReason(reload); why != "" {
		t.Skipf("the counters are the kernel's and conntrack's, the listing as Dump says; not reloaded: %s", why)
	}
	if out, err := ns.Run(reload, "nft", "-c", "-f", "-"); err != nil {
		t.Errorf("nft -c -f of the listing: %v: %s", err, out)
	}
}

// waitFlowsClosed waits until conntrack has seen the last packet of every
// TCP connection in ns: each flow in TIME_WAIT (or CLOSE).
func waitFlowsClosed(t *testing.T, ns *netns.NS) {
	t.Helper()
	var out string
	open := 0
	if testutil.Poll(func() bool {
		var err error
		if out, err = ns.Run("", "conntrack", "-L", "-p", "tcp"); err != nil {
			t.Fatalf("conntrack -L: %v: %s", err, out)
		}
		open = 0
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "tcp ") && !strings.Contains(line, " TIME_WAIT ") && !strings.Contains(line, " CLOSE ") {
				open++
			}
		}
		return open == 0
	}) {
		return
	}
	t.Fatalf("%d TCP flows not closed after %v:\n%s", open, testutil.Timeout, out)
}

// conntrackAccounting sums the packets and bytes, both ways, of the
// namespace's TCP flows whose original tuple has dst (e.g.
// "dst=10.96.0.10 sport=").
func conntrackAccounting(t *testing.T, ns *netns.NS, dst string) nftnl.Counter {
	t.Helper()
	out, err := ns.Run("", "conntrack", "-L", "-p", "tcp")
	if err != nil {
		t.Fatalf("conntrack -L: %v: %s", err, out)
	}
	var c nftnl.Counter
	for _, line := range strings.Split(out, "\n") {
		if i := strings.Index(line, "src="); i < 0 || !strings.HasPrefix(line[strings.Index(line, "dst="):], dst) {
			continue
		}
		for _, tok := range strings.Fields(line) {
			k, v, _ := strings.Cut(tok, "=")
			n, _ := strconv.ParseUint(v, 10, 64)
			switch k {
			case "packets":
				c.Packets += n
			case "bytes":
				c.Bytes += n
			}
		}
	}
	if c.Packets == 0 {
		t.Fatalf("conntrack has no packets of flows to %s:\n%s", dst, out)
	}
	return c
}

// echoServer answers each connection to addr with what it read.
func echoServer(t *testing.T, ns *netns.NS, addr netip.AddrPort) {
	var l net.Listener
	var err error
	ns.Do(t, func() { l, err = net.Listen("tcp", addr.String()) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				c.Write(buf[:n])
			}()
		}
	}()
}

// echo connects to addr, sends msg and checks it comes back.
func echo(t *testing.T, ns *netns.NS, addr netip.AddrPort, msg string) {
	t.Helper()
	var c net.Conn
	var err error
	ns.Do(t, func() { c, err = net.Dial("tcp", addr.String()) })
	if err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != msg {
		t.Fatalf("echo through %s: %q, %v", addr, buf[:n], err)
	}
}
