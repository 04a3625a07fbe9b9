package proxyhealth

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestListenAndServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, MetricsMux(http.NotFoundHandler(), false)) }()

	resp, err := http.Get("http://" + ln.Addr().String() + "/proxyMode")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "nftables" {
		t.Errorf("/proxyMode = %q", b)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve after cancel = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestListenAndServeAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = ListenAndServe(context.Background(), ln.Addr().String(), http.NotFoundHandler())
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("ListenAndServe on a used port = %v, want address already in use", err)
	}
}

// TestListenAndServeCancelledContext checks that a server started after
// shutdown began returns instead of serving forever.
func TestListenAndServeCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- ListenAndServe(ctx, "127.0.0.1:0", http.NotFoundHandler()) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("ListenAndServe with a cancelled context did not return")
	}
}
