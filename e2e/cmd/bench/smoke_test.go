package main

import (
	"os"
	"strings"
	"testing"
)

// TestSmoke runs `bench --smoke` (50 Services × 2 endpoints, 3 changes of
// each kind, nftproxy and upstream kube-proxy) and fails when nftproxy's
// numbers are missing or absurd. It needs the real test bed, so it runs only
// with NFTPROXY_E2E=1 (make e2e).
func TestSmoke(t *testing.T) {
	if os.Getenv("NFTPROXY_E2E") != "1" {
		t.Skip("set NFTPROXY_E2E=1 (make e2e) to run the benchmark's smoke mode")
	}
	rep := run(t, smokeConfig())
	if problems := rep.validate(); len(problems) > 0 {
		t.Fatalf("nftproxy's numbers are missing or absurd:\n  %s", strings.Join(problems, "\n  "))
	}
}
