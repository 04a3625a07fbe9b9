package nftfake_test

import (
	"context"
	"testing"

	"github.com/nftproxy/nftproxy/nft/nftfake"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// TestFakeErrnos: the Fake refuses what the kernel refuses, with the
// kernel's errors (nfttest.ErrnoCases; nftnl's TestKernelErrnos runs the
// same table against the kernel), so that the proxier's tests see such an
// operation fail the sync as the kernel would.
func TestFakeErrnos(t *testing.T) {
	for _, tc := range nfttest.ErrnoCases() {
		if err := tc.Check(context.Background(), nftfake.New()); err != nil {
			t.Errorf("%s: %v", tc.Name, err)
		}
	}
}
