// Command coredns is CoreDNS with the plugins the conformance cluster uses
// (docs/conformance.md): those of the Corefile kubeadm's coredns addon writes
// (errors, health, ready, kubernetes, prometheus, forward, cache, loop,
// reload, loadbalance) and those of the suite's own DNS server pods (hosts,
// log). Upstream's main (github.com/coredns/coredns/coredns.go) imports every
// plugin, cloud providers' SDKs included: about 1400 packages to compile
// against about 800 here. Directives (the plugins' order) stay upstream's;
// plugins named there but not compiled in are an error only if a Corefile
// uses them.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
