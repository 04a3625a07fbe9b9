// Command nftproxy is a drop-in replacement for kube-proxy in nftables mode:
// it accepts kube-proxy's flags and KubeProxyConfiguration file and serves
// the same health and metrics endpoints.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// defaultGCPercent is nftproxy's GOGC unless the environment sets one.
// Most of the proxy's heap is long-lived state (the informers' objects,
// the model, the desired ruleset): with Go's default of 100 the heap grows
// to twice what is live before it is collected, and the peaks of a full
// sync, which builds the whole desired state again, sit at that bound. At
// 100,000 Services of 10 endpoints a restart peaked at 562-610 MB with
// 100 and 518 MB with 50 (docs/benchmarks.md).
const defaultGCPercent = 50

// gcPercent returns the GC percentage to set, unless GOGC is set.
func gcPercent(getenv func(string) string) (int, bool) {
	if getenv("GOGC") != "" {
		return 0, false
	}
	return defaultGCPercent, true
}

func main() {
	if p, ok := gcPercent(os.Getenv); ok {
		debug.SetGCPercent(p)
	}
	o, err := parseOptions(os.Args[1:], environment{readFile: os.ReadFile, hostname: os.Hostname, output: os.Stderr})
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nftproxy: %v\n", err)
		os.Exit(2)
	}
	// SIGTERM is how kubelet stops the pod; both signals end run cleanly.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = run(ctx, o)
	stop()
	if err != nil {
		klog.ErrorS(err, "nftproxy failed")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
	klog.Flush()
}
