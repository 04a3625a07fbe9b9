package ruleset

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
)

// BenchmarkKernelTrafficDataPath is what --service-traffic-metrics costs
// a packet: UDP datagrams of 64 bytes through a ClusterIP to an endpoint
// on the namespace's loopback (requests), and from the endpoint back to
// the client (replies), in a table of 10,000 Services × 5 endpoints and
// the probe's, without and with counters. On loopback the sender's
// system call carries the packet through every hook and into the
// receiving socket (which drops it once full, after the hooks), so the
// time per send is the kernel's per-packet cost. Each flag has a
// namespace of its own; they are measured in turns, and each reports the
// median of its turns (the machine is shared). Run with
//
//	go test ./proxier/ruleset -run '^$' -bench KernelTrafficDataPath -benchtime 1x
func BenchmarkKernelTrafficDataPath(b *testing.B) {
	const turns, sends = 9, 50000
	var ports []model.ServicePortState
	for _, p := range benchPorts(benchstate.Size{Services: 10000, Endpoints: 5}) {
		ports = append(ports, p...)
	}
	probe := netip.AddrPortFrom(ip("10.96.255.1"), 80)
	ports = append(ports, model.ServicePortState{Name: spName("bench", "probe", "udp", nft.ProtoUDP),
		ClusterIP: probe.Addr(), Port: probe.Port(), Endpoints: []netip.AddrPort{ap("10.244.1.11:8080")}})
	flags := []Counters{CountNone, CountServices}
	probes := make([]udpPair, len(flags))
	for i, counters := range flags {
		probes[i] = udpProbe(b, counters, ports, probe)
	}
	type sample struct{ request, reply, other []time.Duration }
	samples := make([]sample, len(flags))
	buf := make([]byte, 64)
	perSend := func(send func() error) time.Duration {
		start := time.Now()
		for range sends {
			if err := send(); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start) / sends
	}
	for range b.N {
		for range turns {
			for i, p := range probes {
				samples[i].request = append(samples[i].request, perSend(func() error { _, err := unix.Write(p.client, buf); return err }))
				samples[i].reply = append(samples[i].reply, perSend(func() error { return unix.Sendto(p.server, buf, 0, p.clientAddr) }))
				samples[i].other = append(samples[i].other, perSend(func() error { _, err := unix.Write(p.direct, buf); return err }))
			}
		}
	}
	median := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2].Nanoseconds())
	}
	var req, rep, other [2]float64
	for i, counters := range flags {
		req[i], rep[i], other[i] = median(samples[i].request), median(samples[i].reply), median(samples[i].other)
		b.ReportMetric(req[i], counters.String()+"-request-ns")
		b.ReportMetric(rep[i], counters.String()+"-reply-ns")
		b.ReportMetric(other[i], counters.String()+"-other-ns")
	}
	b.ReportMetric(req[1]-req[0], "extra-request-ns")
	b.ReportMetric(rep[1]-rep[0], "extra-reply-ns")
	b.ReportMetric(other[1]-other[0], "extra-other-ns")
}

// udpPair is a client's socket connected to a ClusterIP, the socket of
// the endpoint it reaches, and the client's address as the endpoint sees
// it; and a socket connected to the endpoint directly (traffic that is
// not a Service's).
type udpPair struct {
	client, server, direct int
	clientAddr             unix.Sockaddr
}

// udpProbe makes a namespace with the table of ports (traffic counted as
// counters says) and a client and an endpoint of the probe's ClusterIP in
// it, which have exchanged a datagram each way.
func udpProbe(b *testing.B, counters Counters, ports []model.ServicePortState, probe netip.AddrPort) udpPair {
	ns := netns.New(b, "nftproxy-dp", "nft", "ip")
	for _, cmd := range [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "addr", "add", "10.244.1.11/32", "dev", "lo"},
		{"ip", "link", "add", "svc0", "type", "veth", "peer", "name", "svc1"},
		{"ip", "link", "set", "svc0", "up"},
		{"ip", "link", "set", "svc1", "up"},
		{"ip", "route", "add", "10.96.0.0/12", "dev", "svc0"},
	} {
		if out, err := ns.Run("", cmd...); err != nil {
			b.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	cfg := testConfig
	cfg.Counters = counters
	nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
	if err != nil {
		b.Fatal(err)
	}
	defer nl.Close()
	if err := nl.Apply(context.Background(), nft.Diff(nil, Build(cfg, nft.IPv4, ports))); err != nil {
		b.Fatal(err)
	}
	var p udpPair
	ns.Do(b, func() {
		p.server = udpSocket(b, ap("10.244.1.11:8080"), netip.AddrPort{})
		p.client = udpSocket(b, netip.AddrPort{}, probe)
		p.direct = udpSocket(b, netip.AddrPort{}, ap("10.244.1.11:8080"))
	})
	b.Cleanup(func() { unix.Close(p.client); unix.Close(p.server); unix.Close(p.direct) })
	// One datagram each way makes the connection and tells the endpoint
	// the client's address.
	buf := make([]byte, 64)
	if _, err := unix.Write(p.client, buf); err != nil {
		b.Fatal(err)
	}
	if _, p.clientAddr, err = unix.Recvfrom(p.server, buf, 0); err != nil {
		b.Fatal(err)
	}
	if err := unix.Sendto(p.server, buf, 0, p.clientAddr); err != nil {
		b.Fatal(err)
	}
	if n, from, err := unix.Recvfrom(p.client, buf, 0); err != nil || n != len(buf) {
		b.Fatalf("reply from %v: %d bytes, %v", from, n, err)
	}
	return p
}

// udpSocket is a blocking UDP socket bound to local, or connected to
// remote.
func udpSocket(b *testing.B, local, remote netip.AddrPort) int {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		b.Fatal(err)
	}
	sa := func(a netip.AddrPort) *unix.SockaddrInet4 {
		return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	if local.IsValid() {
		err = unix.Bind(fd, sa(local))
	} else {
		err = unix.Connect(fd, sa(remote))
	}
	if err != nil {
		b.Fatal(err)
	}
	return fd
}
