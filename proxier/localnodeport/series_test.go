package localnodeport

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// TestCreationFailuresFromStart: a proxy's listener creation failures are
// served at 0 from its creation, before any listener failed.
func TestCreationFailuresFromStart(t *testing.T) {
	metrics.LocalhostNodePortListenerCreationFailuresTotal.Reset()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(metrics.LocalhostNodePortListenerCreationFailuresTotal)
	New(Config{Family: nft.IPv6}).Close()
	v, ok := testutil.Served(t, reg, "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total",
		map[string]string{"ip_family": "IPv6"})
	if !ok || v != 0 {
		t.Errorf("creation failures: served %v, value %v; want served at 0", ok, v)
	}
}
