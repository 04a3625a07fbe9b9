// Package servicehealth serves the per-Service health checks of Services with
// externalTrafficPolicy: Local: one HTTP listener per healthCheckNodePort,
// answering 200 when this node has a ready local endpoint for the Service and
// the proxy is healthy, 503 otherwise. Cloud load balancers probe it to send
// external traffic only to nodes that can serve it without leaving the node.
//
// It mirrors upstream's pkg/proxy/healthcheck/service_health.go (Kubernetes
// v1.36), response bytes and headers included. The proxy's own /healthz lives
// in proxier/proxyhealth.
//
// This package imports neither k8s.io/api nor proxier/model: ServiceName has
// the same shape as model.ServiceName, so the proxier converts with
// servicehealth.ServiceName(name).
package servicehealth

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// ServiceName identifies a Service.
type ServiceName struct{ Namespace, Name string }

func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

// Config is what New needs.
type Config struct {
	// Network is the listeners' network: "tcp4" or "tcp6" for a server
	// per IP family (as upstream, where each family's proxier runs its own,
	// counting that family's endpoints), or "tcp" (also when empty) for
	// both families on one socket.
	Network string
	// NodePortAddresses restricts the listeners to the local addresses
	// inside these prefixes (--nodeport-addresses; "primary" is the node's
	// primary IPs as single-address prefixes). Prefixes of the other family
	// than Network are ignored. Nil, no prefix of Network's family, or a
	// zero-length prefix: listen on every address (":port").
	NodePortAddresses []netip.Prefix
	// ProxyHealthy reports whether the proxy is healthy (upstream: the
	// /healthz state, without node eligibility). Nil: always healthy.
	ProxyHealthy func() bool
	// Listen opens a listener. Nil: net.Listen. Tests pass a hook.
	Listen func(network, addr string) (net.Listener, error)
}

// readHeaderTimeout bounds how long a client may take to send its request
// headers, so that idle probers cannot hold connections forever.
const readHeaderTimeout = 10 * time.Second

// Server runs the health check listeners. It is safe for concurrent use; the
// sync loop calls SyncServices then SyncEndpoints after each successful sync.
type Server struct {
	network      string
	hosts        []string // hosts to bind each port on; "" is every address
	proxyHealthy func() bool
	listen       func(network, addr string) (net.Listener, error)
	serving      sync.WaitGroup // one per http.Server.Serve goroutine

	mu sync.RWMutex
	// services holds every Service with a health check port, bound or not
	// (a Service whose port could not be bound has no servers and is
	// retried on the next SyncServices).
	services map[ServiceName]*service
}

// service is the health check of one Service.
type service struct {
	name    ServiceName
	port    uint16
	servers []binding // one per host; nil while not bound
	// localEndpoints is the number of ready endpoints on this node;
	// guarded by Server.mu.
	localEndpoints int
}

// New returns a Server with no Service. The addresses in
// cfg.NodePortAddresses are resolved now, once, as upstream does: addresses
// added to the node later are not listened on.
func New(cfg Config) *Server {
	return newServer(cfg, net.InterfaceAddrs)
}

// newServer is New with the local addresses listed by interfaceAddrs.
func newServer(cfg Config, interfaceAddrs func() ([]net.Addr, error)) *Server {
	s := &Server{
		network:      cfg.Network,
		proxyHealthy: cfg.ProxyHealthy,
		listen:       cfg.Listen,
		services:     map[ServiceName]*service{},
	}
	if s.network == "" {
		s.network = "tcp"
	}
	if s.proxyHealthy == nil {
		s.proxyHealthy = func() bool { return true }
	}
	if s.listen == nil {
		s.listen = net.Listen
	}
	s.hosts = bindHosts(s.network, cfg.NodePortAddresses, interfaceAddrs)
	return s
}

// SyncServices makes the health check ports be those of newServices:
// listeners of Services that are gone, or whose port changed, are closed;
// new ones are opened; unchanged ones keep running. Ports of 0 are ignored.
//
// A port that cannot be bound (on any of the addresses) is logged, leaves
// no listener open for that Service, and is tried again on the next call;
// other Services are not affected. The returned error joins these failures
// for callers that want to count them; they are already logged.
func (s *Server) SyncServices(newServices map[ServiceName]uint16) error {
	s.mu.Lock()
	defer s.mu.Unlock()

	// Close first, so that a port moving from one Service to another in
	// the same sync is free when the new owner binds it.
	for name, svc := range s.services {
		port, found := newServices[name]
		if found && port == svc.port {
			continue
		}
		klog.V(2).InfoS("Closing healthcheck", "service", name, "port", svc.port)
		svc.close()
		if !found || port == 0 {
			delete(s.services, name)
			continue
		}
		// Same Service, new port: keep its endpoint count.
		svc.port = port
	}

	var errs []error
	for name, port := range newServices {
		if port == 0 {
			continue
		}
		svc := s.services[name]
		if svc == nil {
			svc = &service{name: name, port: port}
			s.services[name] = svc
		}
		if svc.servers != nil {
			continue
		}
		klog.V(2).InfoS("Opening healthcheck", "service", name, "port", port)
		if err := s.open(svc); err != nil {
			klog.ErrorS(err, "Failed to start healthcheck; retrying on the next sync", "service", name, "port", port)
			errs = append(errs, fmt.Errorf("healthcheck for %s on port %d: %w", name, port, err))
		}
	}
	return errors.Join(errs...)
}

// SyncEndpoints sets the number of ready local endpoints of each Service.
// Services with a health check port that are missing from newEndpoints have
// none; counts of Services without a health check port are dropped.
func (s *Server) SyncEndpoints(newEndpoints map[ServiceName]int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, svc := range s.services {
		svc.localEndpoints = newEndpoints[name]
	}
	return nil
}

// Close closes every listener and forgets every Service, then waits for the
// serving goroutines to return. A later SyncServices opens them again.
func (s *Server) Close() {
	s.mu.Lock()
	for name, svc := range s.services {
		svc.close()
		delete(s.services, name)
	}
	s.mu.Unlock()
	s.serving.Wait()
}

// open binds svc.port on every host and serves the health check there. On
// failure it closes what it opened, leaving svc unbound.
func (s *Server) open(svc *service) error {
	servers := make([]binding, 0, len(s.hosts))
	for _, host := range s.hosts {
		addr := net.JoinHostPort(host, strconv.Itoa(int(svc.port)))
		ln, err := s.listen(s.network, addr)
		if err != nil {
			for _, b := range servers {
				b.close(svc)
			}
			return fmt.Errorf("listen on %s %s: %w", s.network, addr, err)
		}
		srv := &http.Server{
			Handler:           &handler{server: s, service: svc},
			ReadHeaderTimeout: readHeaderTimeout,
		}
		s.serving.Add(1)
		go func() {
			defer s.serving.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.ErrorS(err, "Healthcheck stopped serving", "service", svc.name, "address", ln.Addr())
			}
		}()
		servers = append(servers, binding{server: srv, listener: ln})
	}
	svc.servers = servers
	return nil
}

// close closes svc's listeners and their connections; svc is then unbound.
func (svc *service) close() {
	for _, b := range svc.servers {
		b.close(svc)
	}
	svc.servers = nil
}

// binding is one listener and the HTTP server on it.
type binding struct {
	server   *http.Server
	listener net.Listener
}

// close closes the server, its connections and its listener. The listener is
// closed here too because the server only knows it once its Serve goroutine
// has started: the port must be free when close returns, for a Service that
// takes it over in the same sync.
func (b binding) close(svc *service) {
	if err := b.server.Close(); err != nil {
		klog.ErrorS(err, "Error closing healthcheck", "service", svc.name, "port", svc.port)
	}
	_ = b.listener.Close() // already closed when Serve had started
}

// handler answers every request on one Service's port, whatever its method
// and path, as upstream does.
type handler struct {
	server  *Server
	service *service
}

// response is upstream's body. Fields are in upstream's order: with
// json.MarshalIndent and a tab it gives the same bytes as upstream's
// dedented template (no trailing newline).
type response struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (h *handler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.server.mu.RLock()
	count := h.service.localEndpoints
	h.server.mu.RUnlock()
	healthy := h.server.proxyHealthy()

	var r response
	r.Service.Namespace = h.service.name.Namespace
	r.Service.Name = h.service.name.Name
	r.LocalEndpoints = count
	r.ServiceProxyHealthy = healthy
	body, err := json.MarshalIndent(r, "", "\t")
	if err != nil { // cannot happen: response holds only strings, an int, a bool
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// Upstream (v1.36) also tells weight-aware load balancers how many
	// endpoints this node has.
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(body)
}
