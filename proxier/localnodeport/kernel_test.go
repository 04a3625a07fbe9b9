package localnodeport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
)

// nsNetwork is the host's network inside a test namespace: each socket is
// opened on a thread that enters it.
type nsNetwork struct {
	t  *testing.T
	ns *netns.NS
	h  hostNetwork
	// failed keeps every failed Dial, the proxy's to an endpoint
	// included: the proxy only logs them, and a test that sees a
	// connection reset says why with them.
	failed *failedDials
}

type failedDials struct {
	mu   sync.Mutex
	errs []error
}

func (f *failedDials) add(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, err)
}

func (f *failedDials) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprint(f.errs)
}

func (n nsNetwork) Listen(addr netip.AddrPort) (l net.Listener, err error) {
	n.ns.Do(n.t, func() { l, err = n.h.Listen(addr) })
	return l, err
}

func (n nsNetwork) Dial(ctx context.Context, addr netip.AddrPort) (c net.Conn, err error) {
	n.ns.Do(n.t, func() { c, err = n.h.Dial(ctx, addr) })
	if err != nil {
		n.failed.add(err)
	}
	return c, err
}

// TestKernelProxy runs the proxy on real sockets in a fresh namespace, in
// both families: a connection to the loopback NodePort reaches the
// endpoint and gets its answer after a half-close; only the exact
// loopback address listens; a port another process holds fails to bind
// (EADDRINUSE) and binds at the Sync after it is freed; a port closed
// refuses connections.
func TestKernelProxy(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := netns.New(t, "nftproxy-lnp")
			ep, lo, other := netip.MustParseAddrPort("10.244.1.11:8080"), netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
			if f == nft.IPv6 {
				ep, lo, other = netip.MustParseAddrPort("[fd00:244::11]:8080"), netip.IPv6Loopback(), netip.Addr{}
			}
			// nodad: an IPv6 address is tentative, and cannot be bound,
			// until duplicate address detection is done.
			for _, cmd := range [][]string{{"ip", "link", "set", "lo", "up"}, {"ip", "addr", "add", ep.Addr().String(), "dev", "lo", "nodad"}} {
				if out, err := ns.Run("", cmd...); err != nil {
					t.Fatalf("%v: %v: %s", cmd, err, out)
				}
			}
			ns.WaitLocalRoutes(t, ep.Addr())
			hn := nsNetwork{t: t, ns: ns, h: hostNetwork{family: f}, failed: &failedDials{}}
			backend, err := hn.Listen(ep)
			if err != nil {
				t.Fatal(err)
			}
			defer backend.Close()
			go func() {
				for {
					c, err := backend.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						q, _ := io.ReadAll(c)
						c.Write(append([]byte("answer to "), q...))
					}()
				}
			}()
			blocker, err := hn.Listen(netip.AddrPortFrom(lo, 30081))
			if err != nil {
				t.Fatal(err)
			}

			p := New(Config{Family: f, Network: hn})
			defer p.Close()
			ports := map[uint16]Port{30080: {Endpoints: []netip.AddrPort{ep}}, 30081: {Endpoints: []netip.AddrPort{ep}}}
			if err := p.Sync(ports); !errors.Is(err, syscall.EADDRINUSE) {
				t.Errorf("Sync with 30081 taken: %v, want EADDRINUSE", err)
			}
			if got, err := ask(t, hn, netip.AddrPortFrom(lo, 30080), "question"); err != nil || got != "answer to question" {
				t.Errorf("through the proxy: %q, %v (failed dials: %v)", got, err, hn.failed)
			}
			if other.IsValid() {
				if _, err := ask(t, hn, netip.AddrPortFrom(other, 30080), "q"); !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("127.0.0.2: %v, want connection refused", err)
				}
			}
			blocker.Close()
			if err := p.Sync(ports); err != nil || p.Pending() {
				t.Fatalf("Sync after the port was freed: %v (pending %v)", err, p.Pending())
			}
			if got, err := ask(t, hn, netip.AddrPortFrom(lo, 30081), "again"); err != nil || got != "answer to again" {
				t.Errorf("through the port bound late: %q, %v (failed dials: %v)", got, err, hn.failed)
			}
			delete(ports, 30080)
			if err := p.Sync(ports); err != nil {
				t.Fatal(err)
			}
			if _, err := ask(t, hn, netip.AddrPortFrom(lo, 30080), "q"); !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("closed port: %v, want connection refused", err)
			}
		})
	}
}

// ask sends q to addr, half-closes and returns the answer.
func ask(t *testing.T, n nsNetwork, addr netip.AddrPort, q string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := n.Dial(ctx, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(q)); err != nil {
		return "", err
	}
	c.(*net.TCPConn).CloseWrite()
	b, err := io.ReadAll(c)
	return string(b), err
}
