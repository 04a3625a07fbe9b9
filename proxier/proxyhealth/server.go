package proxyhealth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// shutdownGrace bounds how long in-flight requests may finish after the
// context is cancelled; probes are answered in microseconds.
const shutdownGrace = 2 * time.Second

// ListenAndServe serves handler on addr ("host:port") until ctx is done,
// then returns nil. Failing to listen (address in use, bad address) or to
// serve is returned: whether that is fatal is the caller's choice
// (upstream's bindAddressHardFail).
func ListenAndServe(ctx context.Context, addr string, handler http.Handler) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	return Serve(ctx, ln, handler)
}

// Serve is ListenAndServe on an existing listener, which it closes.
func Serve(ctx context.Context, ln net.Listener, handler http.Handler) error {
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
	}
	stop := context.AfterFunc(ctx, func() {
		shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	})
	defer stop()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve on %s: %w", ln.Addr(), err)
}
