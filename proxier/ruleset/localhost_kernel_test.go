package ruleset

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
)

// TestKernelLocalhostNodePorts programs the localhost golden tables, in
// both families, into a fresh namespace where a local process listens on
// the loopback address at a TCP NodePort and a UDP one, and on a port
// that is no NodePort. With every protocol rejected, connections to the
// NodePorts are refused (TCP with a reset, UDP with an ICMP error) in
// spite of the listeners, and counted per protocol in the elements of
// localhost-nodeport-rejected (nftnl.ReadSetCounters); the other port
// answers. With TCP left to the userspace proxy, the TCP listener gets
// its connection and UDP is still refused. `nft list` prints each table
// as Dump says, and the listing loads again with `nft -f`.
func TestKernelLocalhostNodePorts(t *testing.T) {
	for _, tc := range []struct {
		f       nft.Family
		l       LocalhostNodePorts
		tcpOpen bool
	}{
		{nft.IPv4, rejectAll, false},
		{nft.IPv4, rejectProxied, true},
		{nft.IPv6, rejectAll, false},
		{nft.IPv6, rejectProxied, true},
	} {
		t.Run(fmt.Sprintf("%s reject %v", tc.f, tc.l.Reject), func(t *testing.T) {
			ns := netns.New(t, "nftproxy-lo", "nft")
			if out, err := ns.Run("", "ip", "link", "set", "lo", "up"); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			lo := ip("127.0.0.1")
			if tc.f == nft.IPv6 {
				lo = ip("::1")
			}
			tcpNodePort, udpNodePort, other := netip.AddrPortFrom(lo, 30080), netip.AddrPortFrom(lo, 30053), netip.AddrPortFrom(lo, 8080)
			for _, a := range []netip.AddrPort{tcpNodePort, other} {
				echoServer(t, ns, a)
			}
			udpEcho(t, ns, udpNodePort)

			cfg := localhostConfig(tc.f, tc.l)
			cfg.Counters = CountEndpoints // counted sets that ReadSetCounters must leave alone
			rs := Build(cfg, tc.f, localhostState(tc.f))
			nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
			if err != nil {
				t.Fatal(err)
			}
			defer nl.Close()
			if err := nl.Apply(context.Background(), nft.Diff(nil, rs)); err != nil {
				t.Fatal(err)
			}

			echo(t, ns, other, "not a NodePort")
			err = dialErr(ns, t, "tcp", tcpNodePort)
			switch {
			case tc.tcpOpen && err != nil:
				t.Errorf("TCP NodePort left to the proxy: %v", err)
			case !tc.tcpOpen && !errors.Is(err, syscall.ECONNREFUSED):
				t.Errorf("TCP NodePort: %v, want connection refused", err)
			}
			if err := dialErr(ns, t, "udp", udpNodePort); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("UDP NodePort: %v, want connection refused", err)
			}

			counted := map[uint8]uint64{}
			if err := nl.ReadSetCounters(context.Background(), tc.f, []string{LocalhostRejectedSet}, func(s *nft.Set, e nft.Element, c nftnl.Counter) {
				proto, ok := LocalhostRejected(s.Name, e)
				if !ok {
					t.Errorf("ReadSetCounters read set %s", s.Name)
				}
				counted[proto] = c.Packets
			}); err != nil {
				t.Fatal(err)
			}
			want := map[uint8]uint64{nft.ProtoUDP: 1, nft.ProtoSCTP: 0, nft.ProtoTCP: 1}
			if tc.tcpOpen {
				delete(want, nft.ProtoTCP)
			}
			if fmt.Sprint(counted) != fmt.Sprint(want) {
				t.Errorf("refused connections counted %v, want %v", counted, want)
			}

			listing, err := ns.Run("", "nft", "list", "table", tc.f.String(), nft.TableName)
			if err != nil {
				t.Fatal(err)
			}
			wantListing := nftListing(t, ns, rs)
			if got := nft.Canonical(listing); got != wantListing {
				t.Errorf("kernel lists:\n%s\nwant:\n%s", got, wantListing)
			}
			reload := fmt.Sprintf("delete table %s %s\n%s", tc.f, nft.TableName, listing)
			if why := systemNft(t, ns).CannotReadReason(reload); why != "" {
				t.Skipf("refusals and counts as wanted, the listing as Dump says; not reloaded: %s", why)
			}
			if out, err := ns.Run(reload, "nft", "-f", "-"); err != nil {
				t.Errorf("the listing does not load: %v: %s", err, out)
			}
			if again, err := ns.Run("", "nft", "list", "table", tc.f.String(), nft.TableName); err != nil || nft.Canonical(again) != wantListing {
				t.Errorf("reloaded table lists:\n%s\nwant:\n%s (%v)", nft.Canonical(again), wantListing, err)
			}
		})
	}
}

// dialErr sends one message to addr over network and waits for the
// answer: nil if it came back, else the error (a refusal, TCP's reset or
// the ICMP error a connected UDP socket reports, is ECONNREFUSED).
func dialErr(ns *netns.NS, t *testing.T, network string, addr netip.AddrPort) error {
	var c net.Conn
	var err error
	ns.Do(t, func() { c, err = net.DialTimeout(network, addr.String(), 2*time.Second) })
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 16)
	_, err = c.Read(buf)
	return err
}

// udpEcho answers each datagram to addr with itself.
func udpEcho(t *testing.T, ns *netns.NS, addr netip.AddrPort) {
	var pc net.PacketConn
	var err error
	ns.Do(t, func() { pc, err = net.ListenPacket("udp", addr.String()) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(buf[:n], from)
		}
	}()
}
