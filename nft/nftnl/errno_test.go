package nftnl

import (
	"context"
	"errors"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
	"golang.org/x/sys/unix"
)

// TestKernelErrnos: the kernel, through our encoder, answers every case
// of nfttest.ErrnoCases with the errno the Fake gives (nftfake's
// TestFakeErrnos runs the same table), or where older kernels answer
// another for the same refusal, that one (ErrnoCase.Older), each in a
// fresh namespace. What
// our encoder refuses must be refused before the kernel answers.
func TestKernelErrnos(t *testing.T) {
	for _, tc := range nfttest.ErrnoCases() {
		t.Run(tc.Name, func(t *testing.T) {
			n := newTestNS(t).netlink(t)
			if !tc.Encoder {
				if err := tc.CheckKernel(context.Background(), n); err != nil {
					t.Error(err)
				}
				return
			}
			base := tc.Base()
			apply(t, n, nft.Diff(nil, base))
			err := n.Apply(context.Background(), &nft.Transaction{Family: base.Family, Ops: []nft.Op{tc.Op}})
			var errno unix.Errno
			if err == nil || errors.As(err, &errno) {
				t.Errorf("error %v, want our encoder's refusal (no kernel errno)", err)
			}
		})
	}
}
