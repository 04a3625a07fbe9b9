package localnodeport

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

var (
	ep1 = netip.MustParseAddrPort("10.244.1.11:8080")
	ep2 = netip.MustParseAddrPort("10.244.2.12:8080")
	ep3 = netip.MustParseAddrPort("10.244.3.13:8080")
)

func lo4(port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
}

// TestSync: each Sync leaves exactly the ports with endpoints listened
// on, on the family's loopback address; ports without endpoints and ports
// gone are closed; the listeners gauge follows.
func TestSync(t *testing.T) {
	web := Port{Service: "default/web:http", Endpoints: []netip.AddrPort{ep1, ep2}}
	none := Port{Service: "default/none:http"}
	steps := []struct {
		name  string
		ports map[uint16]Port
		want  []uint16
	}{
		{"nothing", nil, []uint16{}},
		{"two ports, one without endpoints", map[uint16]Port{30080: web, 30081: none}, []uint16{30080}},
		{"a port gains endpoints", map[uint16]Port{30080: web, 30081: web}, []uint16{30080, 30081}},
		{"a port loses its endpoints", map[uint16]Port{30080: none, 30081: web}, []uint16{30081}},
		{"a port goes", map[uint16]Port{30082: web}, []uint16{30082}},
		{"every port goes", map[uint16]Port{}, []uint16{}},
	}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		fn := newFakeNetwork()
		p := New(Config{Family: f, Network: fn})
		for _, st := range steps {
			if err := p.Sync(st.ports); err != nil {
				t.Fatalf("%s %s: %v", f, st.name, err)
			}
			if got := p.Listening(); !slices.Equal(got, st.want) {
				t.Errorf("%s %s: listening on %v, want %v", f, st.name, got, st.want)
			}
			for port := uint16(30079); port <= 30083; port++ {
				addr := netip.AddrPortFrom(p.addr, port)
				if open := fn.listening(addr) != nil; open != slices.Contains(st.want, port) {
					t.Errorf("%s %s: listener on %s open %v", f, st.name, addr, open)
				}
			}
			if got := testutil.ToFloat64(metrics.LocalhostNodePortListeners.WithLabelValues(f.IPFamily())); got != float64(len(st.want)) {
				t.Errorf("%s %s: listeners gauge %v, want %d", f, st.name, got, len(st.want))
			}
		}
		p.Close()
	}
	if New(Config{Family: nft.IPv6}).addr != netip.IPv6Loopback() {
		t.Error("IPv6 proxy does not listen on ::1")
	}
}

// TestBindFailureRetried: a port another process holds is logged,
// counted and tried again at the next Sync, which succeeds once the port
// is free; the other ports are served meanwhile.
func TestBindFailureRetried(t *testing.T) {
	fn := newFakeNetwork()
	fn.refuse[lo4(30080)] = true
	p := New(Config{Family: nft.IPv4, Network: fn})
	defer p.Close()
	failures := metrics.LocalhostNodePortListenerCreationFailuresTotal.WithLabelValues(metrics.IPv4)
	before := testutil.ToFloat64(failures)
	ports := map[uint16]Port{30080: {Endpoints: []netip.AddrPort{ep1}}, 30081: {Endpoints: []netip.AddrPort{ep1}}}

	err := p.Sync(ports)
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), "localhost NodePort 30080: listen tcp 127.0.0.1:30080") {
		t.Errorf("Sync: %v, want the bind failure of 127.0.0.1:30080", err)
	}
	if !p.Pending() || !slices.Equal(p.Listening(), []uint16{30081}) {
		t.Errorf("pending %v, listening %v: want a retry pending and 30081 served", p.Pending(), p.Listening())
	}
	if got := testutil.ToFloat64(failures) - before; got != 1 {
		t.Errorf("failures counted %v, want 1", got)
	}

	if err := p.Sync(ports); err == nil || testutil.ToFloat64(failures)-before != 2 {
		t.Errorf("second Sync with the port still taken: %v, %v failures", err, testutil.ToFloat64(failures)-before)
	}
	fn.refuse[lo4(30080)] = false
	if err := p.Sync(ports); err != nil {
		t.Fatal(err)
	}
	if p.Pending() || !slices.Equal(p.Listening(), []uint16{30080, 30081}) {
		t.Errorf("after the port was freed: pending %v, listening %v", p.Pending(), p.Listening())
	}
	delete(ports, 30080)
	fn.refuse[lo4(30080)] = true
	if err := p.Sync(ports); err != nil || p.Pending() {
		t.Errorf("a port gone is not retried: %v, pending %v", err, p.Pending())
	}
}

// TestPick: without affinity every connection draws its endpoint;
// with ClientIP affinity the first draw is pinned, each connection within
// the timeout of the last renews it, and the pin goes when it expires,
// when its endpoint goes, and when the timeout changes.
func TestPick(t *testing.T) {
	type step struct {
		advance   time.Duration
		update    *Port // Sync with this first
		draw      int   // what IntN returns
		want      netip.AddrPort
		wantDrawn bool // IntN was called
	}
	aff := func(eps ...netip.AddrPort) *Port {
		return &Port{Endpoints: eps, AffinityTimeout: 10 * time.Second}
	}
	tests := []struct {
		name  string
		port  Port
		steps []step
	}{
		{"no affinity: a draw each time", Port{Endpoints: []netip.AddrPort{ep1, ep2, ep3}}, []step{
			{draw: 2, want: ep3, wantDrawn: true},
			{draw: 0, want: ep1, wantDrawn: true},
			{draw: 1, want: ep2, wantDrawn: true},
		}},
		{"affinity: pinned, renewed, expired", *aff(ep1, ep2, ep3), []step{
			{draw: 1, want: ep2, wantDrawn: true},
			{advance: 5 * time.Second, draw: 0, want: ep2},
			{advance: 10 * time.Second, draw: 0, want: ep2}, // 10 s after the last: still
			{advance: 10*time.Second + time.Millisecond, draw: 2, want: ep3, wantDrawn: true},
			{draw: 0, want: ep3},
		}},
		{"affinity: the pinned endpoint goes", *aff(ep1, ep2), []step{
			{draw: 1, want: ep2, wantDrawn: true},
			{update: aff(ep1, ep3), draw: 1, want: ep3, wantDrawn: true},
			{update: aff(ep3, ep1), draw: 1, want: ep3},
		}},
		{"affinity: another timeout forgets the pin", *aff(ep1, ep2), []step{
			{draw: 0, want: ep1, wantDrawn: true},
			{update: &Port{Endpoints: []netip.AddrPort{ep1, ep2}, AffinityTimeout: time.Minute}, draw: 1, want: ep2, wantDrawn: true},
			{draw: 0, want: ep2},
		}},
		{"affinity removed", *aff(ep1, ep2), []step{
			{draw: 0, want: ep1, wantDrawn: true},
			{update: &Port{Endpoints: []netip.AddrPort{ep1, ep2}}, draw: 1, want: ep2, wantDrawn: true},
			{draw: 1, want: ep2, wantDrawn: true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := testingclock.NewFakePassiveClock(time.Unix(1e9, 0))
			var draw int
			drawn := false
			p := New(Config{Family: nft.IPv4, Network: newFakeNetwork(), Clock: clk,
				IntN: func(n int) int { drawn = true; return min(draw, n-1) }})
			defer p.Close()
			if err := p.Sync(map[uint16]Port{30080: tc.port}); err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				clk.SetTime(clk.Now().Add(st.advance))
				if st.update != nil {
					if err := p.Sync(map[uint16]Port{30080: *st.update}); err != nil {
						t.Fatal(err)
					}
				}
				draw, drawn = st.draw, false
				got, ok := p.listeners[30080].pick()
				if !ok || got != st.want || drawn != st.wantDrawn {
					t.Errorf("step %d: picked %v (drawn %v), want %v (drawn %v)", i, got, drawn, st.want, st.wantDrawn)
				}
			}
		})
	}
}

// TestConnection: a connection is copied to the endpoint picked and back,
// both ways half-closed: the client's end of writing reaches the
// endpoint, which answers after it, and the client reads the answer to
// its end. The dial has the configured timeout.
func TestConnection(t *testing.T) {
	fn := newFakeNetwork()
	asked := make(chan string, 1)
	fn.serve(ep2, func(c net.Conn) {
		defer c.Close()
		q, _ := io.ReadAll(c) // until the client stops writing
		asked <- string(q)
		c.Write([]byte("answer to " + string(q)))
	})
	p := New(Config{Family: nft.IPv4, Network: fn, IntN: func(int) int { return 1 }, DialTimeout: 3 * time.Second})
	defer p.Close()
	if err := p.Sync(map[uint16]Port{30080: {Endpoints: []netip.AddrPort{ep1, ep2}}}); err != nil {
		t.Fatal(err)
	}
	c, err := fn.connect(lo4(30080))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("question")); err != nil {
		t.Fatal(err)
	}
	c.(*fakeConn).CloseWrite()
	answer, err := io.ReadAll(c)
	if err != nil || string(answer) != "answer to question" {
		t.Errorf("client read %q, %v", answer, err)
	}
	if q := <-asked; q != "question" {
		t.Errorf("endpoint read %q", q)
	}
	if got := fn.dials(); !slices.Equal(got, []netip.AddrPort{ep2}) {
		t.Errorf("dialed %v, want %v", got, ep2)
	}
	if d, ok := fn.dialCtx[0].Deadline(); !ok || time.Until(d) > 3*time.Second || time.Until(d) < 2*time.Second {
		t.Errorf("dial deadline %v (set %v), want about 3 s from now", d, ok)
	}
}

// TestEndpointRefuses: when the endpoint cannot be reached the client's
// connection is closed, and the next connection draws again.
func TestEndpointRefuses(t *testing.T) {
	fn := newFakeNetwork()
	fn.serve(ep2, echoThen("hello "))
	draws := []int{0, 1}
	p := New(Config{Family: nft.IPv4, Network: fn, IntN: func(int) int { d := draws[0]; draws = draws[1:]; return d }})
	defer p.Close()
	if err := p.Sync(map[uint16]Port{30080: {Endpoints: []netip.AddrPort{ep1, ep2}}}); err != nil {
		t.Fatal(err)
	}
	c, err := fn.connect(lo4(30080))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
		t.Errorf("client of an unreachable endpoint read %q, %v; want the connection closed", b, err)
	}
	c.Close()
	c, err = fn.connect(lo4(30080))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello " {
		t.Errorf("second connection read %q, %v", buf, err)
	}
}

// TestListenerClosedEndsConnections: a NodePort that loses its endpoints
// closes its listener and the connections through it, as upstream's; a
// dial under way is abandoned.
func TestListenerClosedEndsConnections(t *testing.T) {
	fn := newFakeNetwork()
	endpointDone := make(chan error, 1)
	fn.serve(ep1, func(c net.Conn) {
		_, err := io.ReadAll(c)
		endpointDone <- err
	})
	p := New(Config{Family: nft.IPv4, Network: fn})
	defer p.Close()
	ports := map[uint16]Port{30080: {Endpoints: []netip.AddrPort{ep1}}, 30081: {Endpoints: []netip.AddrPort{ep2}}}
	if err := p.Sync(ports); err != nil {
		t.Fatal(err)
	}
	held, err := fn.connect(lo4(30080))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := held.Write([]byte("x")); err != nil { // the endpoint is connected once this is read
		t.Fatal(err)
	}
	fn.mu.Lock()
	fn.hang = true
	fn.mu.Unlock()
	dialing, err := fn.connect(lo4(30081))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(map[uint16]Port{30080: {}}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"held": held, "dialing": dialing} {
		if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
			t.Errorf("%s connection read %q, %v after its listener closed; want it closed", name, b, err)
		}
	}
	if err := <-endpointDone; err != nil {
		t.Errorf("endpoint's side: %v, want it closed", err)
	}
	if _, err := fn.connect(lo4(30080)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connect after close: %v", err)
	}
}

// TestClose: Close ends every listener and connection and waits for
// them; Sync then fails.
func TestClose(t *testing.T) {
	fn := newFakeNetwork()
	fn.serve(ep1, echoThen(""))
	p := New(Config{Family: nft.IPv4, Network: fn})
	if err := p.Sync(map[uint16]Port{30080: {Endpoints: []netip.AddrPort{ep1}}}); err != nil {
		t.Fatal(err)
	}
	c, err := fn.connect(lo4(30080))
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	if b, err := io.ReadAll(c); len(b) != 0 || err != nil {
		t.Errorf("connection after Close read %q, %v", b, err)
	}
	if fn.listening(lo4(30080)) != nil || len(p.Listening()) != 0 {
		t.Error("listener open after Close")
	}
	if err := p.Sync(map[uint16]Port{30080: {Endpoints: []netip.AddrPort{ep1}}}); err == nil {
		t.Error("Sync after Close succeeded")
	}
}
