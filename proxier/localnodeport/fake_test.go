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
	"time"
)

// fakeNetwork is a Network in memory: listeners that tests connect to,
// and endpoints that answer with a handler of the test's.
type fakeNetwork struct {
	mu        sync.Mutex
	listeners map[netip.AddrPort]*fakeListener
	refuse    map[netip.AddrPort]bool // Listen fails there
	endpoints map[netip.AddrPort]func(net.Conn)
	dialed    []netip.AddrPort
	dialCtx   []context.Context // the contexts of the dials, in order
	hang      bool              // Dial waits for its context's end
}

func newFakeNetwork() *fakeNetwork {
	return &fakeNetwork{listeners: map[netip.AddrPort]*fakeListener{}, refuse: map[netip.AddrPort]bool{},
		endpoints: map[netip.AddrPort]func(net.Conn){}}
}

func (n *fakeNetwork) Listen(addr netip.AddrPort) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refuse[addr] || n.listeners[addr] != nil {
		return nil, fmt.Errorf("listen tcp %s: %w", addr, syscall.EADDRINUSE)
	}
	l := &fakeListener{net: n, addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
	n.listeners[addr] = l
	return l, nil
}

func (n *fakeNetwork) Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	n.mu.Lock()
	n.dialed = append(n.dialed, addr)
	n.dialCtx = append(n.dialCtx, ctx)
	handler, hang := n.endpoints[addr], n.hang
	n.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if handler == nil {
		return nil, fmt.Errorf("dial tcp %s: %w", addr, syscall.ECONNREFUSED)
	}
	mine, theirs := connPair(addr)
	go handler(theirs)
	return mine, nil
}

// serve makes ep answer each connection with handler.
func (n *fakeNetwork) serve(ep netip.AddrPort, handler func(net.Conn)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.endpoints[ep] = handler
}

// dials returns the endpoints dialed so far.
func (n *fakeNetwork) dials() []netip.AddrPort {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]netip.AddrPort(nil), n.dialed...)
}

// listening returns the open listener on addr, or nil.
func (n *fakeNetwork) listening(addr netip.AddrPort) *fakeListener {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.listeners[addr]
}

// connect opens a client connection to the listener on addr.
func (n *fakeNetwork) connect(addr netip.AddrPort) (net.Conn, error) {
	l := n.listening(addr)
	if l == nil {
		return nil, fmt.Errorf("connect %s: %w", addr, syscall.ECONNREFUSED)
	}
	mine, theirs := connPair(addr)
	select {
	case l.conns <- theirs:
		return mine, nil
	case <-l.done:
		return nil, fmt.Errorf("connect %s: %w", addr, syscall.ECONNREFUSED)
	}
}

type fakeListener struct {
	net   *fakeNetwork
	addr  netip.AddrPort
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (l *fakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *fakeListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.net.mu.Lock()
		delete(l.net.listeners, l.addr)
		l.net.mu.Unlock()
	})
	return nil
}

func (l *fakeListener) Addr() net.Addr { return net.TCPAddrFromAddrPort(l.addr) }

// connPair returns the two ends of a connection in memory that, like
// TCP, can be half-closed: CloseWrite makes the other end read EOF while
// it can still write back.
func connPair(addr netip.AddrPort) (*fakeConn, *fakeConn) {
	ar, bw := io.Pipe()
	br, aw := io.Pipe()
	return &fakeConn{r: ar, w: aw, addr: addr}, &fakeConn{r: br, w: bw, addr: addr}
}

type fakeConn struct {
	r    *io.PipeReader
	w    *io.PipeWriter
	addr netip.AddrPort
}

func (c *fakeConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if errors.Is(err, io.ErrClosedPipe) {
		err = net.ErrClosed
	}
	return n, err
}

func (c *fakeConn) Write(b []byte) (int, error) { return c.w.Write(b) }
func (c *fakeConn) CloseWrite() error           { return c.w.Close() }
func (c *fakeConn) Close() error {
	c.w.Close()
	return c.r.Close()
}
func (c *fakeConn) LocalAddr() net.Addr              { return net.TCPAddrFromAddrPort(c.addr) }
func (c *fakeConn) RemoteAddr() net.Addr             { return net.TCPAddrFromAddrPort(c.addr) }
func (c *fakeConn) SetDeadline(time.Time) error      { return nil }
func (c *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// echoThen answers a connection with prefix and everything it reads, then
// closes it once the client has finished writing.
func echoThen(prefix string) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		c.Write([]byte(prefix))
		io.Copy(c, c)
	}
}
