package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/leftovers"
	"github.com/nftproxy/nftproxy/proxier/localnodeport"
	"github.com/nftproxy/nftproxy/proxier/proxyhealth"
	"github.com/nftproxy/nftproxy/proxier/readers"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
	"github.com/nftproxy/nftproxy/proxier/servicehealth"
	"github.com/nftproxy/nftproxy/proxier/traffic"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// bindRetryInterval is how long to wait before retrying a server that
// failed to bind, when bind failures are not fatal (upstream's default).
const bindRetryInterval = 5 * time.Second

// openNFTBackends is openBackends; tests replace it to see that a command
// does not open netlink.
var openNFTBackends = openBackends

// newProxyClient is newClient, the proxy's API client; the node-level
// smoke test (smoke_test.go) replaces it with a fake API in the proxy
// process it starts.
var newProxyClient = newClient

// ipv6SysctlDir exists unless the kernel runs with IPv6 disabled
// (ipv6.disable=1); a variable for tests.
var ipv6SysctlDir = "/proc/sys/net/ipv6"

// run carries out the command o describes; for the proxy itself, it wires
// nftproxy together and runs it until ctx is done. The caller has set up
// logging.
func run(ctx context.Context, o *options) error {
	if o.WriteConfigTo != "" {
		if err := writeConfigFile(o.WriteConfigTo, o.Config); err != nil {
			return err
		}
		klog.InfoS("Wrote configuration", "file", o.WriteConfigTo)
		return nil
	}
	if err := selectFamilies(o); err != nil {
		return err
	}
	logStartup(o)
	if o.InitOnly && !o.Cleanup { // upstream: --cleanup wins
		// Upstream's init in nftables mode: the conntrack sysctls. The
		// rules need CAP_NET_ADMIN only, so nothing else is done here.
		if err := setupConntrack(o.Conntrack); err != nil {
			return err
		}
		klog.InfoS("System initialized and --init-only specified; exiting")
		return nil
	}
	backends, closeBackends, err := openNFTBackends(o.Proxier, o.OwnTables)
	if err != nil {
		return err
	}
	defer closeBackends()
	if o.Cleanup {
		klog.InfoS("Deleting nftproxy's nftables tables (--cleanup)")
		return proxier.DeleteTables(ctx, backends)
	}
	if err := checkKernel(ctx, backends); err != nil {
		return err
	}
	return runProxy(ctx, o, backends)
}

// expressionProber is what checkKernel asks of a backend
// (nftnl.Netlink.MissingExpressions).
type expressionProber interface {
	MissingExpressions(ctx context.Context, f nft.Family) ([]string, error)
}

// checkKernel refuses to start on a kernel whose nf_tables lacks an
// expression type nftproxy's rules of a family use (a kernel older than
// the expression, or built without its module): every sync would fail.
// A probe that fails itself decides nothing: the syncs will say.
func checkKernel(ctx context.Context, backends map[nft.Family]nft.Backend) error {
	var errs []error
	for f, b := range backends {
		p, ok := b.(expressionProber)
		if !ok {
			continue
		}
		missing, err := p.MissingExpressions(ctx, f)
		switch {
		case err != nil:
			klog.ErrorS(err, "Cannot ask the kernel which nf_tables expressions it has", "ipFamily", f.IPFamily())
		case len(missing) > 0:
			errs = append(errs, fmt.Errorf("this kernel (%s) cannot run nftproxy's %s rules: nf_tables lacks %s",
				kernelRelease(), f.IPFamily(), strings.Join(missing, ", ")))
		}
	}
	return errors.Join(errs...)
}

// kernelRelease is uname -r, for messages.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// runProxy applies the startup settings, creates the proxier and runs it
// with its servers until ctx is done or one of them fails.
func runProxy(ctx context.Context, o *options, backends map[nft.Family]nft.Backend) error {
	kubeProxy, closeKubeProxy, err := checkLeftovers(ctx, o)
	if err != nil {
		return err
	}
	defer closeKubeProxy()
	if err := setupConntrack(o.Conntrack); err != nil {
		return err
	}
	applyOOMScoreAdj(o.OOMScoreAdj)
	info := buildInfo(o.Version.reported())
	metrics.BuildInfo.WithLabelValues(info.Major, info.Minor, info.GitVersion, info.GitCommit,
		info.GitTreeState, info.BuildDate, info.GoVersion, info.Compiler, info.Platform).Set(1)
	if err := publishConfigz(o.Config); err != nil {
		return err
	}
	client, clientConfig, err := newProxyClient(o.Client)
	if err != nil {
		return err
	}
	// Upstream's health timeout: an update may wait up to syncPeriod for
	// the next periodic sync; twice that means syncs are stuck.
	health := proxyhealth.New(2*o.Proxier.SyncPeriod, nil)
	ct, err := conntrack.NewNetlink(conntrack.NetlinkOptions{})
	if err != nil {
		return fmt.Errorf("conntrack: %w", err)
	}
	deps := proxier.Deps{Client: client, ClientConfig: clientConfig, NFT: backends, Health: health, Conntrack: ct,
		ServiceHealth: healthCheckServers(o.Proxier, health), FirstSync: kubeProxy.RemoveTables,
		Listed: func() {
			if _, p, ok := gcPercent(os.Getenv); ok {
				debug.SetGCPercent(p)
			}
		}}
	if mon := openMonitor(backends); mon != nil {
		defer mon.Close()
		deps.Monitor = mon
	}
	gate, closeGate := openReaders(o.Proxier.MaxReaderWait)
	defer closeGate()
	deps.Readers = gate
	for _, s := range deps.ServiceHealth {
		defer s.(*servicehealth.Server).Close()
	}
	deps.LocalhostNodePorts = localhostProxies(o.Proxier)
	for _, lp := range deps.LocalhostNodePorts {
		defer lp.(*localnodeport.Proxy).Close()
	}
	p, err := proxier.New(o.Proxier, deps)
	if err != nil {
		return fmt.Errorf("create proxier: %w", err)
	}
	closeTraffic, err := registerTrafficMetrics(o.Proxier, deps.Readers)
	if err != nil {
		return err
	}
	defer closeTraffic()
	closeLocalhost, err := registerLocalhostMetrics(o.Proxier, deps.Readers)
	if err != nil {
		return err
	}
	defer closeLocalhost()
	return runAll(ctx, proxyTasks(o, health, p)...)
}

// registerTrafficMetrics registers, with --service-traffic-metrics, the
// collector that reads the kernel's counters at each scrape, on a
// read-only socket of its own (the sync loop's is busy with its
// transactions).
func registerTrafficMetrics(cfg proxier.Config, gate *readers.Gate) (func(), error) {
	if cfg.TrafficCounters == ruleset.CountNone {
		return func() {}, nil
	}
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("traffic metrics: %w", err)
	}
	var hold func() func()
	if gate != nil {
		hold = gate.Hold
	}
	c := traffic.NewCollector(n, enabledFamilies(cfg), hold)
	if err := metrics.Registry.Register(c); err != nil {
		n.Close()
		return nil, fmt.Errorf("traffic metrics: %w", err)
	}
	return func() {
		metrics.Registry.Unregister(c)
		n.Close()
	}, nil
}

// registerLocalhostMetrics serves, with the gate
// KubeProxyNFTablesLocalhostNodePorts, upstream's three metrics of
// localhost NodePorts, the refused connections read from the kernel's
// counters at each scrape on a read-only socket of their own.
func registerLocalhostMetrics(cfg proxier.Config, gate *readers.Gate) (func(), error) {
	if !cfg.LocalhostNodePorts {
		return func() {}, nil
	}
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("localhost NodePort metrics: %w", err)
	}
	var hold func() func()
	if gate != nil {
		hold = gate.Hold
	}
	unregister, err := metrics.RegisterLocalhostNodePorts(localnodeport.NewRejectedCollector(n, enabledFamilies(cfg), hold))
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("localhost NodePort metrics: %w", err)
	}
	return func() {
		unregister()
		n.Close()
	}, nil
}

// localhostProxies returns the userspace proxies of localhost NodePorts,
// one per family whose TCP NodePorts they serve (Config.LocalhostProxied).
func localhostProxies(cfg proxier.Config) map[nft.Family]proxier.LocalhostNodePortProxy {
	out := map[nft.Family]proxier.LocalhostNodePortProxy{}
	for _, f := range enabledFamilies(cfg) {
		if cfg.LocalhostProxied(f) {
			out[f] = localnodeport.New(localnodeport.Config{Family: f})
		}
	}
	return out
}

// checkLeftovers reports what kube-proxy left in the kernel, before the
// first sync, and returns the checker whose RemoveTables deletes its
// tables after each family's first sync (with --remove-kube-proxy-tables;
// a no-op without), on a socket of its own.
func checkLeftovers(ctx context.Context, o *options) (*leftovers.Checker, func(), error) {
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("nftables socket for kube-proxy's leftovers: %w", err)
	}
	c := leftovers.NewChecker(n, enabledFamilies(o.Proxier), o.RemoveKubeProxyTables)
	c.Check(ctx)
	return c, func() { _ = n.Close() }, nil
}

// proxyTasks are what runs beside each other: the two HTTP servers, the
// proxier and, with --config, the watch of the file.
func proxyTasks(o *options, health *proxyhealth.Health, p *proxier.Proxier) []func(context.Context) error {
	tasks := []func(context.Context) error{
		func(ctx context.Context) error {
			return serveForever(ctx, "healthz", o.HealthzBindAddress, proxyhealth.HealthMux(health), o.BindAddressHardFail, bindRetryInterval)
		},
		func(ctx context.Context) error {
			return serveForever(ctx, "metrics", o.MetricsBindAddress, metricsMux(o), o.BindAddressHardFail, bindRetryInterval)
		},
		func(ctx context.Context) error {
			err := p.Run(ctx)
			if err == nil && ctx.Err() == nil {
				err = errors.New("proxier stopped unexpectedly")
			}
			return err
		},
	}
	if o.MetricsLoopbackAddress != "" {
		tasks = append(tasks, func(ctx context.Context) error {
			return serveForever(ctx, "metrics (loopback)", o.MetricsLoopbackAddress, metricsMux(o), o.BindAddressHardFail, bindRetryInterval)
		})
	}
	if o.ConfigFile != "" {
		w := &configWatcher{path: o.ConfigFile, content: o.ConfigData}
		tasks = append(tasks, w.run)
	}
	return tasks
}

// metricsMux is what the metrics server serves.
func metricsMux(o *options) *http.ServeMux {
	mux := proxyhealth.MetricsMux(metrics.Handler(), o.EnableProfiling)
	if o.EnableProfiling {
		installDebug(mux, o)
	}
	return mux
}

// runAll runs tasks until parent is done or one of them fails.
//
// Errors that come after parent was cancelled (SIGTERM) are the shutdown
// itself, not failures: the exit status stays 0 so that kubelet and
// systemd do not report a crash on every rollout.
func runAll(parent context.Context, tasks ...func(context.Context) error) error {
	g, ctx := errgroup.WithContext(parent)
	for _, task := range tasks {
		g.Go(func() error { return task(ctx) })
	}
	err := g.Wait()
	if err != nil && parent.Err() != nil {
		klog.InfoS("Stopped", "err", err)
		return nil
	}
	return err
}

// serveForever serves h on addr until ctx is done. An empty addr disables
// the server. When the server fails (typically: port in use), hardFail
// makes that fatal, as upstream's --bind-address-hard-fail; otherwise the
// error is logged and the server retried, so that a proxy whose health port
// is briefly taken still programs the node.
func serveForever(ctx context.Context, name, addr string, h http.Handler, hardFail bool, retry time.Duration) error {
	if addr == "" {
		klog.InfoS("Server disabled", "server", name)
		return nil
	}
	for {
		klog.InfoS("Starting server", "server", name, "address", addr)
		err := proxyhealth.ListenAndServe(ctx, addr, h)
		if err == nil {
			return nil
		}
		if hardFail {
			return fmt.Errorf("%s server: %w", name, err)
		}
		klog.ErrorS(err, "Server failed; retrying", "server", name, "retryIn", retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
}

// selectFamilies drops IPv6 when the kernel has it disabled, unless
// --ip-families asked for it explicitly; upstream likewise runs
// single-stack when the node cannot do IPv6.
func selectFamilies(o *options) error {
	if !o.Proxier.IPv6 {
		return nil
	}
	if _, err := os.Stat(ipv6SysctlDir); !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if o.IPFamiliesExplicit {
		return errors.New("--ip-families includes ipv6 but IPv6 is disabled in the kernel")
	}
	klog.InfoS("IPv6 is disabled in the kernel; programming IPv4 only")
	o.Proxier.IPv6 = false
	if !o.Proxier.IPv4 {
		return errors.New("no IP family left to program")
	}
	return nil
}

// openReaders opens what sees reads of the ruleset (proxier.Deps.Readers):
// other processes' from their netlink sockets (sock_diag, or
// /proc/net/netlink), and this process's own holds, which count even when
// the sockets cannot be listed. One read holds commits for at most
// maxReaderWait in all.
func openReaders(maxReaderWait time.Duration) (*readers.Gate, func()) {
	cfg := readers.DefaultConfig
	cfg.Budget = maxReaderWait
	l, err := nftnl.NewSocketLister(0)
	if err != nil {
		klog.ErrorS(err, "Cannot list netlink sockets")
		return readers.New(cfg, nil), func() {}
	}
	return readers.New(cfg, l), func() { l.Close() }
}

// openMonitor opens the listener for changes other processes make to the
// tables; without it (an error is logged) drift is found by the periodic
// full sync only.
func openMonitor(backends map[nft.Family]nft.Backend) *nftnl.Monitor {
	var ours []uint32
	for _, b := range backends {
		if n, ok := b.(*nftnl.Netlink); ok {
			ours = append(ours, n.PortID())
		}
	}
	mon, err := nftnl.NewMonitor(nftnl.NetlinkOptions{}, ours...)
	if err != nil {
		klog.ErrorS(err, "Cannot listen for nftables changes by other processes; only the periodic full sync finds them")
		return nil
	}
	return mon
}

// openBackends opens one netlink socket per enabled family, so that the
// families' syncs never wait on each other's batches.
func openBackends(cfg proxier.Config, own bool) (map[nft.Family]nft.Backend, func(), error) {
	backends := map[nft.Family]nft.Backend{}
	var opened []*nftnl.Netlink
	closeAll := func() {
		for _, n := range opened {
			_ = n.Close()
		}
	}
	for _, f := range enabledFamilies(cfg) {
		n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{OwnTable: own})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("nftables backend for %s: %w", f, err)
		}
		opened = append(opened, n)
		backends[f] = n
	}
	return backends, closeAll, nil
}

// healthCheckServers returns one server per family for the health check
// node ports of externalTrafficPolicy: Local Services, each counting that
// family's endpoints, as upstream. They listen on the local addresses in
// the --nodeport-addresses CIDRs (127.0.0.1 and ::1 too with "localhost",
// as upstream's), or with "primary" among them on every address (the
// node's primary IPs are only known once its Node object is seen).
func healthCheckServers(cfg proxier.Config, health *proxyhealth.Health) map[nft.Family]proxier.ServiceHealthServer {
	out := map[nft.Family]proxier.ServiceHealthServer{}
	addrs := cfg.NodePortCIDRs
	if cfg.NodePortPrimary {
		addrs = nil
	}
	for _, f := range enabledFamilies(cfg) {
		network := "tcp4"
		if f == nft.IPv6 {
			network = "tcp6"
		}
		out[f] = servicehealth.New(servicehealth.Config{Network: network, NodePortAddresses: addrs,
			ProxyHealthy: func() bool { return health.Status().Healthy }})
	}
	return out
}

func enabledFamilies(cfg proxier.Config) []nft.Family {
	var fams []nft.Family
	if cfg.IPv4 {
		fams = append(fams, nft.IPv4)
	}
	if cfg.IPv6 {
		fams = append(fams, nft.IPv6)
	}
	return fams
}

// newClient builds the API client as upstream does: in-cluster config when
// neither --kubeconfig nor --master is given, else the kubeconfig with
// --master overriding its server. It returns the client's configuration
// too (the proxier's watchers build clients of their own from it).
func newClient(c clientOptions) (kubernetes.Interface, *rest.Config, error) {
	cfg, err := restConfig(c)
	if err != nil {
		return nil, nil, fmt.Errorf("API client configuration: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	return client, cfg, err
}

func restConfig(c clientOptions) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if c.Kubeconfig == "" && c.Master == "" {
		klog.InfoS("Neither kubeconfig file nor master URL was specified, falling back to in-cluster config")
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: c.Kubeconfig},
			&clientcmd.ConfigOverrides{ClusterInfo: clientcmdapi.Cluster{Server: c.Master}},
		).ClientConfig()
	}
	if err != nil {
		return nil, err
	}
	if cfg.ExecProvider != nil {
		// client-go would run it: nftproxy runs no program (the image has
		// none, and a node's proxy must not depend on one).
		return nil, fmt.Errorf("kubeconfig %s: an exec credential plugin (%s) is not supported: nftproxy runs no programs; use a token or client certificate",
			c.Kubeconfig, cfg.ExecProvider.Command)
	}
	cfg.AcceptContentTypes = c.AcceptContentTypes
	cfg.ContentType = c.ContentType
	cfg.Wrap(watch.BufferStreams)
	cfg.QPS = c.QPS
	cfg.Burst = c.Burst
	return cfg, nil
}

// logStartup logs the version, the effective configuration and what is
// accepted but without effect, so that a migrated DaemonSet shows what it
// lost.
func logStartup(o *options) {
	info := buildInfo(o.Version.reported())
	klog.InfoS("Version info", "version", info.GitVersion, "gitCommit", info.GitCommit,
		"gitTreeState", info.GitTreeState, "buildDate", info.BuildDate, "goVersion", info.GoVersion, "platform", info.Platform)
	klog.InfoS("Golang settings", "GOGC", os.Getenv("GOGC"), "GOMAXPROCS", os.Getenv("GOMAXPROCS"), "GOTRACEBACK", os.Getenv("GOTRACEBACK"))
	c := o.Proxier
	klog.InfoS("Starting nftproxy", "node", c.NodeName, "ipv4", c.IPv4, "ipv6", c.IPv6,
		"clusterCIDRs", c.ClusterCIDRs, "serviceCIDRs", c.ServiceCIDRs,
		"masqueradeAll", c.MasqueradeAll, "masqueradeBit", c.MasqueradeBit,
		"syncPeriod", c.SyncPeriod, "minSyncPeriod", c.MinSyncPeriod, "syncBusyShare", c.SyncBusyShare, "maxReaderWait", c.MaxReaderWait)
	logFlagNotes(o)
	if o.MaxReaderWaitLowered > 0 {
		klog.InfoS("--max-reader-wait lowered to fit the sync period: /healthz fails when a change stays unapplied for twice the sync period",
			"default", o.MaxReaderWaitLowered, "maxReaderWait", c.MaxReaderWait, "syncPeriod", c.SyncPeriod)
	}
	switch {
	case len(c.NodePortCIDRs) == 0:
		klog.InfoS("NodePorts answer on the node's primary IPs (from its Node object)")
	case c.NodePortPrimary:
		klog.InfoS("NodePorts answer on the node's primary IPs (from its Node object) and on local addresses in", "nodePortAddresses", c.NodePortCIDRs)
	default:
		klog.InfoS("NodePorts answer on local addresses in", "nodePortAddresses", c.NodePortCIDRs)
	}
	if c.LocalhostNodePorts {
		for _, f := range enabledFamilies(c) {
			if c.LocalhostProxied(f) {
				klog.InfoS("Localhost NodePorts: TCP proxied in userspace on the loopback address, UDP and SCTP refused", "ipFamily", f.IPFamily())
			} else {
				klog.InfoS("Localhost NodePorts: refused (nodePortAddresses names no loopback CIDR of the family)", "ipFamily", f.IPFamily())
			}
		}
	}
	if len(c.ClusterCIDRs) == 0 && !c.MasqueradeAll {
		klog.InfoS("No --cluster-cidr: traffic to ClusterIPs from outside the pod network is not masqueraded")
	}
}

// logFlagNotes logs, once each, the flags that the config file replaced
// or that have no effect here, and the config file's unknown fields.
func logFlagNotes(o *options) {
	if o.LenientDecode != nil {
		klog.InfoS("Using lenient decoding as strict decoding failed", "file", o.ConfigFile, "err", o.LenientDecode)
	}
	if o.ConfigFileIPTablesMode {
		klog.InfoS("The config file says mode \"iptables\" (kubeadm v1.37 writes it when the mode is left unset): nftproxy programs nftables, "+
			"taking the settings its nftables section leaves unset from its iptables section", "file", o.ConfigFile)
	}
	for _, name := range o.IgnoredByConfig {
		klog.InfoS("Flag ignored because --config is given", "flag", name, "config", o.ConfigFile)
	}
	for _, name := range o.DeprecatedFlags {
		klog.InfoS("Flag is deprecated (as in kube-proxy)", "flag", name)
	}
	for _, name := range slices.Sorted(maps.Keys(o.NoEffectFlags)) {
		klog.InfoS("Flag has no effect in nftproxy", "flag", name, "reason", o.NoEffectFlags[name])
	}
	ignored := maps.Clone(o.Config.FeatureGates)
	for _, g := range honouredGates {
		delete(ignored, g)
	}
	if len(ignored) > 0 {
		klog.InfoS("Feature gates with no effect in nftproxy", "featureGates", ignored, "honoured", honouredGates)
	}
}
