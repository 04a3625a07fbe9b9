// Command pause is the sandbox process of the pods `make kubelet-e2e` runs
// (containerd's sandbox_image): it holds a pod's namespaces and does nothing
// until it is asked to stop. The bed has no registry to pull upstream's pause
// image from, so it builds this one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
