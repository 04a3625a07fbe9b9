// Package localnodeport serves TCP NodePorts on the node's loopback
// address in userspace: kube-proxy 1.37's localhost NodePorts (feature
// gate KubeProxyNFTablesLocalhostNodePorts), for an IP family whose
// --nodeport-addresses names a loopback CIDR (127.0.0.0/8, ::1/128, the
// keyword "localhost"). The kernel's rules never DNAT a connection to a
// loopback address: its replies would come from an endpoint to a source
// only the node has. A Proxy instead listens on 127.0.0.1:<NodePort> (or
// [::1]:<NodePort>) and copies each connection to one of the Service's
// endpoints, as the node's own client. UDP and SCTP NodePorts on loopback
// are refused by the rules (proxier/ruleset.LocalhostNodePorts).
//
// The proxier hands a Proxy the NodePorts after each successful sync
// (Sync). Its I/O goes through Network, its time through a clock, and its
// random choice through a function, so that tests drive all three.
package localnodeport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// DefaultDialTimeout bounds the connection to an endpoint (upstream's).
const DefaultDialTimeout = 5 * time.Second

// acceptRetry is the pause after an Accept error other than the
// listener's end (too many open files): a retry at once would spin.
const acceptRetry = 50 * time.Millisecond

// Port is one TCP NodePort the proxy serves.
type Port struct {
	// Service names the Service port in logs ("ns/name:port").
	Service string
	// Endpoints are where connections go: the Service port's endpoints
	// for cluster traffic, or with externalTrafficPolicy: Local this
	// node's. None: no listener (the kernel refuses the connection).
	Endpoints []netip.AddrPort
	// AffinityTimeout, if not 0 (sessionAffinity: ClientIP), pins the
	// listener to the endpoint its last connection went to, for this
	// long after each connection. Every local client has the loopback
	// source address, so they all share one pin, as they share one
	// affinity entry in the kernel's rules.
	AffinityTimeout time.Duration
}

// Network is the I/O of a Proxy: the host's (nil in Config), or a fake.
type Network interface {
	// Listen opens a TCP listener on addr.
	Listen(addr netip.AddrPort) (net.Listener, error)
	// Dial connects to addr over TCP, within ctx's deadline.
	Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
}

// Config is what New needs.
type Config struct {
	// Family is the IP family served: 127.0.0.1, or ::1.
	Family nft.Family
	// Network: nil, the host's.
	Network Network
	// Clock times the session affinity; nil, the real clock.
	Clock clock.PassiveClock
	// IntN picks an endpoint, a number in [0, n); nil, math/rand/v2.IntN.
	IntN func(n int) int
	// DialTimeout bounds the connection to an endpoint; 0,
	// DefaultDialTimeout.
	DialTimeout time.Duration
}

// Proxy serves the TCP NodePorts of one IP family on its loopback
// address. Its methods may be called from any goroutine.
type Proxy struct {
	cfg  Config
	addr netip.Addr // 127.0.0.1 or ::1
	fam  string     // the ip_family label

	mu        sync.Mutex
	listeners map[uint16]*listener
	failed    map[uint16]bool // could not be bound at the last Sync
	closed    bool
}

// New returns a Proxy with no listener. Its family's listener creation
// failures are served at 0 from then on (with the gate on).
func New(cfg Config) *Proxy {
	if cfg.Network == nil {
		cfg.Network = hostNetwork{family: cfg.Family}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.IntN == nil {
		cfg.IntN = rand.IntN
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	addr := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if cfg.Family == nft.IPv6 {
		addr = netip.IPv6Loopback()
	}
	metrics.LocalhostNodePortListenerCreationFailuresTotal.WithLabelValues(cfg.Family.IPFamily())
	return &Proxy{cfg: cfg, addr: addr, fam: cfg.Family.IPFamily(), listeners: map[uint16]*listener{}, failed: map[uint16]bool{}}
}

// Sync makes the listeners those of ports, by NodePort: a port with
// endpoints is listened on, a listener whose port is gone or has no
// endpoints left is closed, and its connections with it (as upstream's).
// A listener that stays serves new connections with the port's new
// endpoints and affinity; a change of the affinity timeout forgets the
// pinned endpoint.
//
// A port that cannot be bound (another process listens there) is logged
// and counted, and tried again at the next Sync (Pending says there is
// one); the other ports are served. The error joins these failures.
func (p *Proxy) Sync(ports map[uint16]Port) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("localhost NodePort proxy closed")
	}
	for nodePort, l := range p.listeners {
		if port, ok := ports[nodePort]; !ok || len(port.Endpoints) == 0 {
			klog.V(2).InfoS("Closing localhost NodePort listener", "ipFamily", p.fam, "nodePort", nodePort, "service", l.current().Service)
			l.close()
			delete(p.listeners, nodePort)
		}
	}
	clear(p.failed)
	var errs []error
	for nodePort, port := range ports {
		if len(port.Endpoints) == 0 {
			continue
		}
		if l, ok := p.listeners[nodePort]; ok {
			l.update(port)
			continue
		}
		l, err := p.listen(nodePort, port)
		if err != nil {
			klog.ErrorS(err, "Cannot listen for a localhost NodePort; trying again at the next sync", "ipFamily", p.fam,
				"nodePort", nodePort, "service", port.Service)
			metrics.LocalhostNodePortListenerCreationFailuresTotal.WithLabelValues(p.fam).Inc()
			p.failed[nodePort] = true
			errs = append(errs, err)
			continue
		}
		klog.V(4).InfoS("Listening for a localhost NodePort", "ipFamily", p.fam, "nodePort", nodePort, "service", port.Service,
			"endpoints", len(port.Endpoints))
		p.listeners[nodePort] = l
	}
	metrics.LocalhostNodePortListeners.WithLabelValues(p.fam).Set(float64(len(p.listeners)))
	return errors.Join(errs...)
}

// Pending reports whether the last Sync could not bind some port: the
// caller should call Sync again, even with nothing changed.
func (p *Proxy) Pending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.failed) > 0
}

// Listening returns the NodePorts listened on, sorted.
func (p *Proxy) Listening() []uint16 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]uint16, 0, len(p.listeners))
	for nodePort := range p.listeners {
		out = append(out, nodePort)
	}
	slices.Sort(out)
	return out
}

// Close closes every listener and connection and waits for their
// goroutines; Sync then fails.
func (p *Proxy) Close() {
	p.mu.Lock()
	ls := p.listeners
	p.listeners, p.closed = map[uint16]*listener{}, true
	p.mu.Unlock()
	for _, l := range ls {
		l.close()
	}
	for _, l := range ls {
		l.wait()
	}
	metrics.LocalhostNodePortListeners.WithLabelValues(p.fam).Set(0)
}

func (p *Proxy) listen(nodePort uint16, port Port) (*listener, error) {
	addr := netip.AddrPortFrom(p.addr, nodePort)
	ln, err := p.cfg.Network.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("localhost NodePort %d: %w", nodePort, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{proxy: p, addr: addr, ln: ln, ctx: ctx, cancel: cancel}
	l.update(port)
	l.conns.Add(1)
	go l.accept()
	return l, nil
}

// listener is one NodePort's listener and its connections.
type listener struct {
	proxy  *Proxy
	addr   netip.AddrPort
	ln     net.Listener
	ctx    context.Context // done: the listener and its connections close
	cancel context.CancelFunc
	conns  sync.WaitGroup // the accept loop and each connection

	mu       sync.Mutex
	port     Port
	pinned   netip.AddrPort // the endpoint of the affinity (invalid: none)
	pinnedAt time.Time      // its last connection
}

// update takes the port's new endpoints and affinity.
func (l *listener) update(port Port) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if port.AffinityTimeout != l.port.AffinityTimeout {
		l.pinned = netip.AddrPort{}
	}
	port.Endpoints = slices.Clone(port.Endpoints)
	l.port = port
}

func (l *listener) current() Port {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.port
}

// pick returns the endpoint of a new connection: the pinned one while the
// affinity holds and it is still an endpoint (its time renewed), else one
// at random, pinned if the port has affinity.
func (l *listener) pick() (netip.AddrPort, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	eps := l.port.Endpoints
	if len(eps) == 0 {
		return netip.AddrPort{}, false
	}
	now := l.proxy.cfg.Clock.Now()
	timeout := l.port.AffinityTimeout
	if timeout > 0 && l.pinned.IsValid() && now.Sub(l.pinnedAt) <= timeout && slices.Contains(eps, l.pinned) {
		l.pinnedAt = now
		return l.pinned, true
	}
	ep := eps[l.proxy.cfg.IntN(len(eps))]
	if timeout > 0 {
		l.pinned, l.pinnedAt = ep, now
	}
	return ep, true
}

func (l *listener) close() {
	l.cancel()
	_ = l.ln.Close()
}

func (l *listener) wait() { l.conns.Wait() }

func (l *listener) accept() {
	defer l.conns.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			klog.V(4).InfoS("Accept failed on a localhost NodePort", "address", l.addr, "err", err)
			select {
			case <-l.ctx.Done():
				return
			case <-time.After(acceptRetry):
			}
			continue
		}
		l.conns.Add(1)
		go l.serve(c)
	}
}

// serve copies one client connection to an endpoint and back. Each way
// ends with a half-close of its destination, so that a client that
// shuts down its writing side still reads the answer. Both connections
// close when the listener does.
func (l *listener) serve(client net.Conn) {
	defer l.conns.Done()
	defer client.Close()
	ep, ok := l.pick()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(l.ctx, l.proxy.cfg.DialTimeout)
	backend, err := l.proxy.cfg.Network.Dial(ctx, ep)
	cancel()
	if err != nil {
		klog.V(4).InfoS("Cannot connect to the endpoint of a localhost NodePort", "address", l.addr, "endpoint", ep, "err", err)
		return
	}
	defer backend.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-l.ctx.Done():
			_ = client.Close()
			_ = backend.Close()
		case <-done:
		}
	}()
	var ways sync.WaitGroup
	ways.Go(func() { pipe(backend, client, l.addr, "to endpoint") })
	pipe(client, backend, l.addr, "to client")
	ways.Wait()
}

// pipe copies src to dst until src ends, then half-closes dst.
func pipe(dst, src net.Conn, addr netip.AddrPort, way string) {
	if _, err := io.Copy(dst, src); err != nil && !errors.Is(err, net.ErrClosed) {
		klog.V(4).InfoS("Copy failed on a localhost NodePort connection", "address", addr, "way", way, "err", err)
	}
	if hc, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = hc.CloseWrite()
	}
}

// hostNetwork is the host's TCP.
type hostNetwork struct{ family nft.Family }

func (h hostNetwork) network() string {
	if h.family == nft.IPv6 {
		return "tcp6"
	}
	return "tcp4"
}

func (h hostNetwork) Listen(addr netip.AddrPort) (net.Listener, error) {
	return net.Listen(h.network(), addr.String())
}

func (h hostNetwork) Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, h.network(), addr.String())
}
