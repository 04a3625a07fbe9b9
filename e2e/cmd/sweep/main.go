// Command sweep removes what e2e test beds left behind when their test process died
// without cleaning up (SIGKILL, go test -timeout, a crash): network namespaces named
// "nfpXXXXX-…", processes inside them or marked with NFTPROXY_E2E_BED, cgroups named
// like them (a kubelet's pods, e2e/kubenode), working directories $TMPDIR/nfpXXXXX-* and
// owner files in /run/nftproxy-e2e. Beds whose test process is still running are left
// alone unless -force is given. testbed.Start runs the same sweep once per test process.
// It also removes the namespaces of kernel tests (internal/testutil/netns,
// "nftproxy-…-PID-…") whose process is gone.
//
//	sudo go run ./e2e/cmd/sweep [-force]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/netns"
)

func main() {
	force := flag.Bool("force", false, "also remove beds whose test process is still running")
	flag.Parse()
	removed, err := testbed.Sweep(*force)
	kernel, kerr := netns.Sweep()
	removed, err = append(removed, kernel...), errors.Join(err, kerr)
	for _, r := range removed {
		fmt.Println("removed", r)
	}
	if len(removed) == 0 {
		fmt.Println("nothing to remove")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sweep:", err)
		os.Exit(1)
	}
}
