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
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

func main() {
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
