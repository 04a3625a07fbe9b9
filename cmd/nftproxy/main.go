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
// sync, which builds the whole desired state again, sit at that bound
// (docs/code-figures.md).
const defaultGCPercent = 50

// listingGCPercent is the GC percentage while the informers list, before
// the first sync. The list allocates a decoded object for every object it
// keeps converted, and at defaultGCPercent the collector's work lengthens
// the list of a large cluster markedly. The heap then holds the informers'
// objects only, so that twice it stays under the peak of the first sync,
// which runs at defaultGCPercent (docs/benchmarks.md).
const listingGCPercent = 100

// gcPercent returns the GC percentages to set while the informers list
// and afterwards, unless GOGC is set.
func gcPercent(getenv func(string) string) (listing, steady int, ok bool) {
	if getenv("GOGC") != "" {
		return 0, 0, false
	}
	return listingGCPercent, defaultGCPercent, true
}

func main() {
	os.Exit(runMain(context.Background(), os.Args[1:]))
}

// runMain is the process: nftproxy with the command line args, the
// process's standard streams and files, until parent is done or a signal
// ends it; it returns the exit status. The node-level smoke test's
// processes (smoke_test.go) run it too.
func runMain(parent context.Context, args []string) int {
	if p, _, ok := gcPercent(os.Getenv); ok {
		debug.SetGCPercent(p)
	}
	env := environment{readFile: os.ReadFile, hostname: os.Hostname, stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin}
	// SIGTERM is how kubelet stops the pod; both signals end run cleanly.
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return execute(ctx, args, env)
}

// execute runs nftproxy with the command line args and returns the exit
// status: 0 on success (--help, --version and --write-config-to too), 2
// for a command line or configuration that is not valid, 1 when running
// failed (including the --config file changing on disk, so that the pod
// restarts with it). `nftproxy dump`, `diff` and `explain` are commands of their own
// (dump.go, diff.go, explain.go).
func execute(ctx context.Context, args []string, env environment) int {
	if len(args) > 0 && args[0] == "dump" {
		return executeDump(ctx, args[1:], env)
	}
	if len(args) > 0 && args[0] == "diff" {
		return executeDiff(ctx, args[1:], env)
	}
	if len(args) > 0 && args[0] == "explain" {
		return executeExplain(ctx, args[1:], env)
	}
	o, err := parseOptions(args, env)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "nftproxy: %v\n", err)
		return 2
	}
	if o.Version.print(env.stdout) {
		return 0
	}
	if err := applyLogging(&o.Config.Logging, o.FeatureGate, env.stdout, env.stderr); err != nil {
		fmt.Fprintf(env.stderr, "nftproxy: %v\n", err)
		return 2
	}
	defer klog.Flush()
	if err := run(ctx, o); err != nil {
		klog.ErrorS(err, "nftproxy failed")
		return 1
	}
	return 0
}
