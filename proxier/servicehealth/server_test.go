package servicehealth

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeNet is a Listen hook that opens a real listener on 127.0.0.1 with a
// free port for each requested address, and remembers which.
type fakeNet struct {
	mu      sync.Mutex
	actual  map[string]string // requested "host:port" → real address
	calls   []string          // "network addr" of every Listen call
	failing map[string]bool   // requested addresses that fail to bind
}

func newFakeNet() *fakeNet {
	return &fakeNet{actual: map[string]string{}, failing: map[string]bool{}}
}

func (f *fakeNet) listen(network, addr string) (net.Listener, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, network+" "+addr)
	if f.failing[addr] {
		return nil, &net.OpError{Op: "listen", Net: network, Err: syscall.EADDRINUSE}
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f.actual[addr] = ln.Addr().String()
	return ln, nil
}

func (f *fakeNet) fail(addr string, failing bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing[addr] = failing
}

// addr is the real address last opened for the requested one.
func (f *fakeNet) addr(t *testing.T, requested string) string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.actual[requested]
	if !ok {
		t.Fatalf("%s was never listened on; calls: %q", requested, f.calls)
	}
	return a
}

func (f *fakeNet) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// client does not keep connections, so a closed listener is seen at once.
var client = &http.Client{
	Timeout:   5 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

type answer struct {
	code   int
	body   string
	header http.Header
}

func get(t *testing.T, addr string) answer {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/any/path")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body from %s: %v", addr, err)
	}
	return answer{code: resp.StatusCode, body: string(b), header: resp.Header}
}

// wantBody is upstream's body, byte for byte (tabs, no trailing newline).
func wantBody(ns, name string, endpoints int, healthy bool) string {
	return fmt.Sprintf("{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %t\n}",
		ns, name, endpoints, healthy)
}

func newTestServer(t *testing.T, fn *fakeNet, healthy *atomic.Bool) *Server {
	t.Helper()
	s := New(Config{Listen: fn.listen, ProxyHealthy: healthy.Load})
	t.Cleanup(s.Close)
	return s
}

func healthyProxy() *atomic.Bool {
	var b atomic.Bool
	b.Store(true)
	return &b
}

func TestResponses(t *testing.T) {
	fn := newFakeNet()
	healthy := healthyProxy()
	s := newTestServer(t, fn, healthy)
	web := ServiceName{"ns", "web"}
	if err := s.SyncServices(map[ServiceName]uint16{web: 30000}); err != nil {
		t.Fatal(err)
	}
	addr := fn.addr(t, ":30000")

	steps := []struct {
		name      string
		endpoints map[ServiceName]int // nil: no SyncEndpoints call
		healthy   bool
		code      int
		count     int
	}{
		{name: "port but no count yet", healthy: true, code: 503, count: 0},
		{name: "local endpoints", endpoints: map[ServiceName]int{web: 2}, healthy: true, code: 200, count: 2},
		{name: "proxy unhealthy", healthy: false, code: 503, count: 2},
		{name: "proxy healthy again", healthy: true, code: 200, count: 2},
		{name: "zero endpoints", endpoints: map[ServiceName]int{web: 0}, healthy: true, code: 503, count: 0},
		{name: "one endpoint", endpoints: map[ServiceName]int{web: 1}, healthy: true, code: 200, count: 1},
		{name: "missing from the map", endpoints: map[ServiceName]int{{"ns", "other"}: 4}, healthy: true, code: 503, count: 0},
		{name: "unhealthy without endpoints", healthy: false, code: 503, count: 0},
	}
	for _, st := range steps {
		if st.endpoints != nil {
			if err := s.SyncEndpoints(st.endpoints); err != nil {
				t.Fatal(err)
			}
		}
		healthy.Store(st.healthy)
		got := get(t, addr)
		if got.code != st.code {
			t.Errorf("%s: status %d, want %d", st.name, got.code, st.code)
		}
		if want := wantBody("ns", "web", st.count, st.healthy); got.body != want {
			t.Errorf("%s: body\n%s\nwant\n%s", st.name, got.body, want)
		}
		for header, want := range map[string]string{
			"Content-Type":                     "application/json",
			"X-Content-Type-Options":           "nosniff",
			"X-Load-Balancing-Endpoint-Weight": fmt.Sprint(st.count),
		} {
			if v := got.header.Values(header); len(v) != 1 || v[0] != want {
				t.Errorf("%s: %s = %q, want %q", st.name, header, v, want)
			}
		}
	}
}

// TestBodyIsUpstreams pins the exact bytes upstream's dedented template
// produces, as captured from kube-proxy v1.36.3.
func TestBodyIsUpstreams(t *testing.T) {
	const upstream = "{\n\t\"service\": {\n\t\t\"namespace\": \"kube-system\",\n\t\t\"name\": \"ingress\"\n\t},\n\t\"localEndpoints\": 3,\n\t\"serviceProxyHealthy\": true\n}"
	fn := newFakeNet()
	s := newTestServer(t, fn, healthyProxy())
	name := ServiceName{"kube-system", "ingress"}
	if err := s.SyncServices(map[ServiceName]uint16{name: 32000}); err != nil {
		t.Fatal(err)
	}
	if err := s.SyncEndpoints(map[ServiceName]int{name: 3}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, fn.addr(t, ":32000")); got.body != upstream {
		t.Errorf("body %q, want %q", got.body, upstream)
	}
}

func TestSyncServicesKeepsAddsAndCloses(t *testing.T) {
	fn := newFakeNet()
	s := newTestServer(t, fn, healthyProxy())
	a, b, c := ServiceName{"ns", "a"}, ServiceName{"ns", "b"}, ServiceName{"ns", "c"}

	if err := s.SyncServices(map[ServiceName]uint16{a: 30001, b: 30002}); err != nil {
		t.Fatal(err)
	}
	if err := s.SyncEndpoints(map[ServiceName]int{a: 1, b: 2, c: 3}); err != nil {
		t.Fatal(err)
	}
	addrA, addrB := fn.addr(t, ":30001"), fn.addr(t, ":30002")
	if n := fn.callCount(); n != 2 {
		t.Fatalf("%d Listen calls, want 2", n)
	}

	// b goes away, c arrives, a stays.
	if err := s.SyncServices(map[ServiceName]uint16{a: 30001, c: 30003}); err != nil {
		t.Fatal(err)
	}
	if n := fn.callCount(); n != 3 {
		t.Errorf("%d Listen calls, want 3: a must be kept, not reopened", n)
	}
	if fn.addr(t, ":30001") != addrA {
		t.Errorf("a was reopened")
	}
	if got := get(t, addrA); got.code != 200 || got.body != wantBody("ns", "a", 1, true) {
		t.Errorf("a after resync: %d %s", got.code, got.body)
	}
	if _, err := client.Get("http://" + addrB + "/"); err == nil {
		t.Errorf("b's listener %s still answers after b was removed", addrB)
	}
	// c had no count when it was added (its count was dropped while it had
	// no port), so it starts at 0 until the next SyncEndpoints.
	addrC := fn.addr(t, ":30003")
	if got := get(t, addrC); got.code != 503 || got.body != wantBody("ns", "c", 0, true) {
		t.Errorf("c before SyncEndpoints: %d %s", got.code, got.body)
	}
	if err := s.SyncEndpoints(map[ServiceName]int{a: 1, c: 3}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, addrC); got.code != 200 {
		t.Errorf("c after SyncEndpoints: %d %s", got.code, got.body)
	}

	// Everything goes away.
	if err := s.SyncServices(nil); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{addrA, addrC} {
		if _, err := client.Get("http://" + addr + "/"); err == nil {
			t.Errorf("%s still answers after every Service was removed", addr)
		}
	}
}

func TestPortChangeReopensAndKeepsCount(t *testing.T) {
	fn := newFakeNet()
	s := newTestServer(t, fn, healthyProxy())
	web := ServiceName{"ns", "web"}
	if err := s.SyncServices(map[ServiceName]uint16{web: 30000}); err != nil {
		t.Fatal(err)
	}
	if err := s.SyncEndpoints(map[ServiceName]int{web: 5}); err != nil {
		t.Fatal(err)
	}
	oldAddr := fn.addr(t, ":30000")
	if err := s.SyncServices(map[ServiceName]uint16{web: 30100}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get("http://" + oldAddr + "/"); err == nil {
		t.Errorf("old port still answers after the port changed")
	}
	if got := get(t, fn.addr(t, ":30100")); got.code != 200 || got.body != wantBody("ns", "web", 5, true) {
		t.Errorf("new port: %d %s", got.code, got.body)
	}
}

// TestPortMovesBetweenServices checks that a port released by one Service
// can be bound by another in the same sync.
func TestPortMovesBetweenServices(t *testing.T) {
	var mu sync.Mutex
	bound := map[string]bool{}
	fn := newFakeNet()
	listen := func(network, addr string) (net.Listener, error) {
		mu.Lock()
		defer mu.Unlock()
		if bound[addr] {
			return nil, &net.OpError{Op: "listen", Net: network, Err: syscall.EADDRINUSE}
		}
		ln, err := fn.listen(network, addr)
		if err != nil {
			return nil, err
		}
		bound[addr] = true
		return &trackedListener{Listener: ln, release: func() {
			mu.Lock()
			defer mu.Unlock()
			delete(bound, addr)
		}}, nil
	}
	s := New(Config{Listen: listen})
	t.Cleanup(s.Close)
	old, moved := ServiceName{"ns", "old"}, ServiceName{"ns", "new"}
	if err := s.SyncServices(map[ServiceName]uint16{old: 30000}); err != nil {
		t.Fatal(err)
	}
	for range 20 { // back and forth, each time in one sync
		if err := s.SyncServices(map[ServiceName]uint16{moved: 30000}); err != nil {
			t.Fatalf("port moving between Services: %v", err)
		}
		if err := s.SyncServices(map[ServiceName]uint16{old: 30000}); err != nil {
			t.Fatalf("port moving back: %v", err)
		}
	}
	if got := get(t, fn.addr(t, ":30000")); got.body != wantBody("ns", "old", 0, true) {
		t.Errorf("body %s", got.body)
	}
}

// trackedListener calls release once when closed.
type trackedListener struct {
	net.Listener
	once    sync.Once
	release func()
}

func (l *trackedListener) Close() error {
	l.once.Do(l.release)
	return l.Listener.Close()
}

func TestBindFailureIsIsolatedAndRetried(t *testing.T) {
	fn := newFakeNet()
	s := newTestServer(t, fn, healthyProxy())
	good, bad := ServiceName{"ns", "good"}, ServiceName{"ns", "bad"}
	services := map[ServiceName]uint16{good: 30001, bad: 30002}
	fn.fail(":30002", true)

	err := s.SyncServices(services)
	if err == nil || !strings.Contains(err.Error(), "ns/bad") || !strings.Contains(err.Error(), "30002") ||
		!errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("SyncServices with a used port = %v, want an error naming ns/bad, 30002, EADDRINUSE", err)
	}
	if strings.Contains(err.Error(), "ns/good") {
		t.Errorf("error names the Service that bound: %v", err)
	}
	if err := s.SyncEndpoints(map[ServiceName]int{good: 1, bad: 2}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, fn.addr(t, ":30001")); got.code != 200 {
		t.Errorf("good Service: %d %s", got.code, got.body)
	}

	// Still failing: retried, still isolated.
	calls := fn.callCount()
	if err := s.SyncServices(services); err == nil {
		t.Errorf("second SyncServices with the port still used: nil error")
	}
	if n := fn.callCount() - calls; n != 1 {
		t.Errorf("%d Listen calls on resync, want 1 (only the failed port)", n)
	}

	// The port frees up: the next sync binds it, with the count already known.
	fn.fail(":30002", false)
	if err := s.SyncServices(services); err != nil {
		t.Fatalf("SyncServices after the port was freed: %v", err)
	}
	if got := get(t, fn.addr(t, ":30002")); got.code != 200 || got.body != wantBody("ns", "bad", 2, true) {
		t.Errorf("retried Service: %d %s", got.code, got.body)
	}
}

// TestPartialBindFailureClosesTheRest checks that when one of several
// addresses cannot be bound, the Service's other listeners are closed too
// (so a retry starts clean), as upstream does.
func TestPartialBindFailureClosesTheRest(t *testing.T) {
	fn := newFakeNet()
	interfaceAddrs := func() ([]net.Addr, error) {
		return []net.Addr{ipNet("10.0.0.1/24"), ipNet("10.0.1.1/24")}, nil
	}
	s := newServer(Config{
		Network:           "tcp4",
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")},
		Listen:            fn.listen,
	}, interfaceAddrs)
	t.Cleanup(s.Close)
	web := ServiceName{"ns", "web"}
	fn.fail("10.0.1.1:30000", true)

	if err := s.SyncServices(map[ServiceName]uint16{web: 30000}); err == nil {
		t.Fatal("SyncServices with one address used: nil error")
	}
	first := fn.addr(t, "10.0.0.1:30000")
	if _, err := client.Get("http://" + first + "/"); err == nil {
		t.Errorf("listener on the address that bound is still open after the other failed")
	}

	fn.fail("10.0.1.1:30000", false)
	if err := s.SyncServices(map[ServiceName]uint16{web: 30000}); err != nil {
		t.Fatal(err)
	}
	for _, requested := range []string{"10.0.0.1:30000", "10.0.1.1:30000"} {
		if got := get(t, fn.addr(t, requested)); got.code != 503 {
			t.Errorf("%s: %d", requested, got.code)
		}
	}
}

func TestListenArguments(t *testing.T) {
	interfaceAddrs := func() ([]net.Addr, error) {
		return []net.Addr{ipNet("127.0.0.1/8"), ipNet("10.0.0.7/24"), ipNet("fd00::7/64"), ipNet("fe80::1/64")}, nil
	}
	tests := []struct {
		name     string
		network  string
		prefixes []string
		want     []string
	}{
		{name: "default", want: []string{"tcp :31000"}},
		{name: "ipv4 all", network: "tcp4", want: []string{"tcp4 :31000"}},
		{name: "ipv6 all", network: "tcp6", want: []string{"tcp6 :31000"}},
		{name: "ipv6 with only ipv4 prefixes", network: "tcp6", prefixes: []string{"10.0.0.0/8"}, want: []string{"tcp6 :31000"}},
		{name: "ipv4 prefix", network: "tcp4", prefixes: []string{"10.0.0.0/8", "fd00::/64"}, want: []string{"tcp4 10.0.0.7:31000"}},
		{name: "ipv6 prefix", network: "tcp6", prefixes: []string{"10.0.0.0/8", "fd00::/8"}, want: []string{"tcp6 [fd00::7]:31000"}},
		{name: "both families", prefixes: []string{"10.0.0.7/32", "fd00::/8", "127.0.0.0/8"},
			want: []string{"tcp 10.0.0.7:31000", "tcp 127.0.0.1:31000", "tcp [fd00::7]:31000"}},
		{name: "zero-length prefix", network: "tcp4", prefixes: []string{"10.0.0.0/8", "0.0.0.0/0"}, want: []string{"tcp4 :31000"}},
		{name: "nothing matches", network: "tcp4", prefixes: []string{"192.168.0.0/16"}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var prefixes []netip.Prefix
			for _, p := range tt.prefixes {
				prefixes = append(prefixes, netip.MustParsePrefix(p))
			}
			fn := newFakeNet()
			s := newServer(Config{Network: tt.network, NodePortAddresses: prefixes, Listen: fn.listen}, interfaceAddrs)
			defer s.Close()
			if err := s.SyncServices(map[ServiceName]uint16{{"ns", "web"}: 31000}); err != nil {
				t.Fatal(err)
			}
			fn.mu.Lock()
			defer fn.mu.Unlock()
			if fmt.Sprint(fn.calls) != fmt.Sprint(tt.want) {
				t.Errorf("Listen calls %q, want %q", fn.calls, tt.want)
			}
		})
	}
}

func TestBindHostsListingFailureListensEverywhere(t *testing.T) {
	failing := func() ([]net.Addr, error) { return nil, errors.New("netlink says no") }
	got := bindHosts("tcp4", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, failing)
	if len(got) != 1 || got[0] != "" {
		t.Errorf("bindHosts when listing fails = %q, want [\"\"]", got)
	}
}

func TestBindHostsDeduplicates(t *testing.T) {
	addrs := func() ([]net.Addr, error) {
		return []net.Addr{ipNet("10.0.0.7/24"), &net.IPAddr{IP: net.ParseIP("10.0.0.7")}, ipNet("10.0.0.7/32")}, nil
	}
	prefixes := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/24")}
	if got := bindHosts("tcp", prefixes, addrs); fmt.Sprint(got) != "[10.0.0.7]" {
		t.Errorf("bindHosts = %q, want [10.0.0.7]", got)
	}
}

func TestPortZeroIgnored(t *testing.T) {
	fn := newFakeNet()
	s := newTestServer(t, fn, healthyProxy())
	web := ServiceName{"ns", "web"}
	if err := s.SyncServices(map[ServiceName]uint16{web: 0}); err != nil {
		t.Fatal(err)
	}
	if n := fn.callCount(); n != 0 {
		t.Errorf("%d Listen calls for port 0, want none", n)
	}
	if err := s.SyncServices(map[ServiceName]uint16{web: 30000}); err != nil {
		t.Fatal(err)
	}
	addr := fn.addr(t, ":30000")
	if err := s.SyncServices(map[ServiceName]uint16{web: 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get("http://" + addr + "/"); err == nil {
		t.Errorf("listener still open after the port went to 0")
	}
}

func TestCloseClosesEverything(t *testing.T) {
	fn := newFakeNet()
	s := New(Config{Listen: fn.listen})
	a, b := ServiceName{"ns", "a"}, ServiceName{"ns", "b"}
	if err := s.SyncServices(map[ServiceName]uint16{a: 30001, b: 30002}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, requested := range []string{":30001", ":30002"} {
		if _, err := client.Get("http://" + fn.addr(t, requested) + "/"); err == nil {
			t.Errorf("%s still answers after Close", requested)
		}
	}
	// The Server is usable again.
	if err := s.SyncServices(map[ServiceName]uint16{a: 30001}); err != nil {
		t.Fatal(err)
	}
	if got := get(t, fn.addr(t, ":30001")); got.code != 503 {
		t.Errorf("after reopening: %d", got.code)
	}
	s.Close()
}

// TestConcurrentSyncAndProbes is for the race detector: probes keep coming
// while the sync loop changes Services and counts.
func TestConcurrentSyncAndProbes(t *testing.T) {
	fn := newFakeNet()
	healthy := healthyProxy()
	s := newTestServer(t, fn, healthy)
	web := ServiceName{"ns", "web"}
	if err := s.SyncServices(map[ServiceName]uint16{web: 30000}); err != nil {
		t.Fatal(err)
	}
	addr := fn.addr(t, ":30000")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get("http://" + addr + "/")
				if err != nil {
					t.Errorf("probe: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for i := range 200 {
		other := ServiceName{"ns", fmt.Sprint("other-", i%3)}
		services := map[ServiceName]uint16{web: 30000, other: uint16(31000 + i%3)}
		if err := s.SyncServices(services); err != nil {
			t.Fatal(err)
		}
		if err := s.SyncEndpoints(map[ServiceName]int{web: i % 2, other: i}); err != nil {
			t.Fatal(err)
		}
		healthy.Store(i%5 != 0)
	}
	close(stop)
	wg.Wait()
}

func ipNet(cidr string) *net.IPNet {
	ip, n, err := net.ParseCIDR(cidr)
	if err != nil {
		panic(err)
	}
	n.IP = ip
	return n
}
