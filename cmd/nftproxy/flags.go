package main

import (
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// flagValues is what the command line can set. Flags that have a config
// file field write straight into cfg (the defaults), so that without
// --config cfg is "defaults, then the flags given"; with --config, as in
// upstream kube-proxy, the file's configuration replaces cfg and only the
// flags that live outside it (below) and the logging flags still count.
type flagValues struct {
	cfg *kpconfig.KubeProxyConfiguration

	// Commands and their arguments.
	configFile    string
	writeConfigTo string
	cleanup       bool
	initOnly      bool
	version       versionFlag

	// Applied whether or not --config is given, as upstream.
	master           string
	hostnameOverride string

	// nftproxy's own flags: no config file field, so always applied.
	serviceCIDR                string
	ipFamilies                 string
	metricsBindAddressOverride string
	ownTables                  bool
	fullSyncPeriod             time.Duration
	maxReaderWait              time.Duration
	// maxReaderWaitSet: --max-reader-wait was given; maxReaderWaitLowered
	// the default it had before a short sync period lowered it.
	maxReaderWaitSet      bool
	maxReaderWaitLowered  time.Duration
	removeKubeProxyTables bool
	serviceTrafficMetrics string

	// Deprecated upstream flags that act on the bind addresses, only
	// without --config (upstream's addressFromDeprecatedFlags).
	healthzPort int32
	metricsPort int32

	// minSyncPeriodSet: the user set the minimum sync period (a flag, even
	// 0, or a non-zero value in the --config file), which is then honoured
	// as upstream honours it.
	minSyncPeriodSet bool
}

// Flag annotations: which flags the --config file overrides, which have
// no effect in nftproxy (with why), and which are nftproxy's own (not
// kube-proxy's: TestUpstreamFlagSet leaves them out of the comparison).
const (
	annotationConfigFile = "nftproxy.io/config-file"
	annotationNoEffect   = "nftproxy.io/no-effect"
	annotationOwn        = "nftproxy.io/own"
)

func newFlagValues() *flagValues {
	return &flagValues{cfg: defaultConfig(), healthzPort: defaultHealthzPort, metricsPort: defaultMetricsPort,
		ownTables: true, fullSyncPeriod: defaultFullSyncPeriod, maxReaderWait: defaultMaxReaderWait}
}

// flagSet declares nftproxy's flags: every flag of kube-proxy (the release
// upstream/flags.txt was generated from) with its name, type and meaning,
// and no other, plus nftproxy's own (annotationOwn). Like upstream, "_" is
// accepted for "-" in flag names.
func (fv *flagValues) flagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("nftproxy", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	fv.addCommandFlags(fs)
	fv.addNodeAndClientFlags(fs)
	fs.AddFlagSet(fv.nftproxyFlags())
	logsapi.AddFlags(&fv.cfg.Logging, fs)
	fs.AddFlagSet(fv.configFileFlags())
	addNoEffectFlags(fs)
	return fs
}

func (fv *flagValues) addCommandFlags(fs *pflag.FlagSet) {
	fs.StringVar(&fv.configFile, "config", fv.configFile, "The path to the configuration file (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1). As in kube-proxy, it replaces the flags that have a field in it; the logging flags, --hostname-override, --master and nftproxy's own flags still apply. nftproxy exits when the file changes on disk, so that its pod restarts with the new configuration.")
	fs.StringVar(&fv.writeConfigTo, "write-config-to", fv.writeConfigTo, "If set, write the configuration nftproxy would use (defaults, --config and flags) to this file as a KubeProxyConfiguration and exit.")
	fs.BoolVar(&fv.cleanup, "cleanup", fv.cleanup, "If true, delete nftproxy's nftables tables and exit.")
	fs.BoolVar(&fv.initOnly, "init-only", fv.initOnly, "If true, do the initialization that needs full root privileges (the conntrack sysctls) and exit. nftproxy can then run with only CAP_NET_ADMIN.")
	fs.Var(&fv.version, "version", "--version, --version=raw prints version information and quits; --version=vX.Y.Z... sets the reported version")
	fs.Lookup("version").NoOptDefVal = string(versionTrue)
}

// addNodeAndClientFlags declares the upstream flags that have no config
// file field of their own, or that upstream applies over the file.
func (fv *flagValues) addNodeAndClientFlags(fs *pflag.FlagSet) {
	fs.StringVar(&fv.hostnameOverride, "hostname-override", fv.hostnameOverride, "If non-empty, will be used as the name of the Node that nftproxy is running on. If unset, the node name is assumed to be the same as the node's hostname. Overrides the config file's hostnameOverride.")
	fs.StringVar(&fv.master, "master", fv.master, "The address of the Kubernetes API server (overrides any value in kubeconfig)")
}

// nftproxyFlags declares nftproxy's own flags, which kube-proxy does not
// have; none has a config file field, so all apply with --config too.
func (fv *flagValues) nftproxyFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("nftproxy-own", pflag.ContinueOnError)
	fv.addNFTProxyFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) { _ = fs.SetAnnotation(f.Name, annotationOwn, nil) })
	return fs
}

func (fv *flagValues) addNFTProxyFlags(fs *pflag.FlagSet) {
	fs.StringVar(&fv.serviceCIDR, "service-cidr", fv.serviceCIDR, "nftproxy: comma-separated service CIDRs (at most one per IP family), used when the cluster has no ServiceCIDR objects: traffic to an unallocated address in them is dropped. Empty: no such drop unless ServiceCIDR objects exist.")
	fs.StringVar(&fv.ipFamilies, "ip-families", fv.ipFamilies, "nftproxy: comma-separated IP families to program, 'ipv4' and/or 'ipv6'. Default: both (IPv6 is skipped if the kernel has it disabled).")
	fs.StringVar(&fv.metricsBindAddressOverride, "metrics-bind-address-override", fv.metricsBindAddressOverride, "nftproxy: \"host:port\" or a bare IP (port 10249) for the metrics server, winning over --metrics-bind-address and the config file's metricsBindAddress. It exists so that a DaemonSet can serve metrics on the node's own IP (--metrics-bind-address-override=$(NODE_IP), from status.hostIP) for Prometheus to scrape, while kubeadm's kube-proxy ConfigMap, shared by all nodes, stays unchanged. A loopback metricsBindAddress (kube-proxy's default 127.0.0.1:10249) stays served beside it.")
	fs.BoolVar(&fv.ownTables, "own-tables", fv.ownTables, "nftproxy: own the nftables tables (flags owner,persist; Linux 6.9): no other process can change or delete them while nftproxy runs, `nft flush ruleset` leaves them, and they keep serving after nftproxy exits until the next nftproxy claims them. On older kernels the tables are not owned. With false, another process can change them, and nftproxy repairs them at once (it hears of every change from the kernel). See docs/operations.md.")
	fs.BoolVar(&fv.removeKubeProxyTables, "remove-kube-proxy-tables", fv.removeKubeProxyTables, "nftproxy: after the first successful sync of each IP family, delete kube-proxy's nftables table of that family ('ip kube-proxy', 'ip6 kube-proxy') in one transaction. Until then, kube-proxy's stale rules still catch the new connections nftproxy's rules do not DNAT (to Services deleted or left without endpoints since kube-proxy stopped: they go to the old endpoints) and still apply stale loadBalancerSourceRanges. iptables chains and other tables are never touched. Default false: kube-proxy's leftovers are only logged and counted (nftproxy_kube_proxy_leftovers). See docs/migrating-from-kube-proxy.md.")
	fs.StringVar(&fv.serviceTrafficMetrics, "service-traffic-metrics", fv.serviceTrafficMetrics, "nftproxy: export new connections per Service port and frontend (nftproxy_service_new_connections_total) from kernel counters on the elements of the maps that dispatch each connection's first packet: 'services' (also what the flag alone means), 'endpoints' for new connections per endpoint as well (nftproxy_endpoint_new_connections_total), 'none' (default). Changing it rewrites the dispatch maps at the next start. See docs/operations.md for the cardinality.")
	fs.Lookup("service-traffic-metrics").NoOptDefVal = "services"
	fs.DurationVar(&fv.fullSyncPeriod, "full-sync-period", fv.fullSyncPeriod, "nftproxy: how often the tables are read back from the kernel and checked against what nftproxy wants there, repairing any difference, even when nothing reported a change (changes by other processes are reported by the kernel and repaired at once). 0 disables the periodic check.")
	fs.DurationVar(&fv.maxReaderWait, "max-reader-wait", fv.maxReaderWait, "nftproxy: how long, at most, a sync waits while another process reads the nftables ruleset (nft list, nft -f, iptables-nft, nftproxy diff): every commit makes a read under way start over, so that without the wait a stream of changes keeps `nft list ruleset` from ever finishing. A change after a quiet spell (no sync for this long) is not held. 0: syncs never wait. See docs/operations.md, \"A busy node\".")
}

// configFileFlags declares the flags that have a config file field (or,
// for the deprecated ports, act on one); --config replaces them all.
func (fv *flagValues) configFileFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("config-file", pflag.ContinueOnError)
	fv.addClientFlags(fs)
	fv.addProxyFlags(fs)
	fv.addServerFlags(fs)
	fv.addConntrackFlags(fs)
	fv.addUnusedConfigFlags(fs)
	fs.VisitAll(func(f *pflag.Flag) {
		_ = fs.SetAnnotation(f.Name, annotationConfigFile, nil)
		f.Usage += " Ignored if a config file is given by --config."
	})
	return fs
}

func (fv *flagValues) addClientFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	cc := &c.ClientConnection
	fs.StringVar(&cc.Kubeconfig, "kubeconfig", cc.Kubeconfig, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&cc.ContentType, "kube-api-content-type", cc.ContentType, "Content type of requests sent to apiserver.")
	fs.Float32Var(&cc.QPS, "kube-api-qps", cc.QPS, "QPS to use while talking with kubernetes apiserver.")
	fs.Int32Var(&cc.Burst, "kube-api-burst", cc.Burst, "Burst to use while talking with kubernetes apiserver.")
	fs.DurationVar(&c.ConfigSyncPeriod.Duration, "config-sync-period", c.ConfigSyncPeriod.Duration, "How often configuration from the apiserver is refreshed.  Must be greater than 0.")
	fs.Var(cliflag.NewMapStringBool(&c.FeatureGates), "feature-gates", "A set of key=value pairs for the feature gates of kube-proxy "+upstreamRelease()+" (upstream/feature-gates.txt); unknown gates, and locked ones set against their default, are an error, as upstream. nftproxy honours the logging gates (LoggingAlphaOptions, LoggingBetaOptions, ContextualLogging) and KubeProxyNFTablesLocalhostNodePorts (alpha, default false: NodePort connections to 127.0.0.1 and ::1 are refused, or for TCP proxied when --nodeport-addresses names loopback); the others have no effect.")
}

func (fv *flagValues) addProxyFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	fs.Var((*stringValue)(&c.Mode), "proxy-mode", "Which proxy mode to use: nftproxy only implements 'nftables' (empty means the same).")
	fs.StringVar(&c.ClusterCIDR, "cluster-cidr", c.ClusterCIDR, "The CIDR range of the pods in the cluster (for dual-stack clusters, a comma-separated IPv4,IPv6 pair). Traffic to a ClusterIP from outside it is masqueraded.")
	fs.Var((*stringValue)(&c.DetectLocalMode), "detect-local-mode", "Mode to use to detect local traffic: ClusterCIDR (default), NodeCIDR, BridgeInterface or InterfaceNamePrefix.")
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", c.DetectLocal.BridgeInterface, "A bridge interface name. With --detect-local-mode=BridgeInterface, traffic from this bridge is local.")
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix, "An interface name prefix. With --detect-local-mode=InterfaceNamePrefix, traffic from interfaces whose name begins with it is local.")
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", c.NodePortAddresses, "A list of CIDR ranges and keywords: NodePorts answer only on the node's addresses inside them. Keywords: 'primary' (the default: the node's primary IPs, from its Node object), 'localhost' (127.0.0.0/8 and ::1/128) and 'all' (0.0.0.0/0 and ::/0); each at most once, mixed with each other and with CIDRs. An IP family the list names nothing of answers on all its addresses. Loopback addresses answer only with the KubeProxyNFTablesLocalhostNodePorts feature gate, for TCP, when the list names them (e.g. 'primary,localhost').")
	fs.BoolVar(&c.NFTables.MasqueradeAll, "masquerade-all", c.NFTables.MasqueradeAll, "SNAT all traffic sent via Service cluster IPs.")
	fs.Int32Var(c.IPTables.MasqueradeBit, "iptables-masquerade-bit", *c.IPTables.MasqueradeBit, "The bit of the fwmark space to mark packets requiring SNAT with. Must be within the range [0, 31]. (Upstream ignores this flag in nftables mode; nftproxy honours it.)")
	fs.DurationVar(&c.NFTables.SyncPeriod.Duration, "iptables-sync-period", c.NFTables.SyncPeriod.Duration, "The longest time between two rule syncs (e.g. '5s', '1m', '2h22m'). Must be greater than 0.")
	fs.DurationVar(&c.NFTables.MinSyncPeriod.Duration, "iptables-min-sync-period", c.NFTables.MinSyncPeriod.Duration, "The minimum period between rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate resync. Unset (nftproxy): syncs are spaced by their cost instead.")
}

func (fv *flagValues) addServerFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	fs.StringVar(&c.HealthzBindAddress, "healthz-bind-address", c.HealthzBindAddress, "The IP address and port for the health check server to serve on. Set empty to disable.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", c.MetricsBindAddress, "The IP address and port for the metrics server to serve on. (Set to '0.0.0.0:10249' / '[::]:10249' to bind on all interfaces.) Empty on the command line: no metrics server (nftproxy; kube-proxy refuses an empty address). See also --metrics-bind-address-override.")
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "If true nftproxy will treat failure to bind to a port as fatal and exit.")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "If true enables profiling via web interface on /debug/pprof handler of the metrics server.")
	fs.Int32Var(c.OOMScoreAdj, "oom-score-adj", *c.OOMScoreAdj, "The oom-score-adj value for the nftproxy process. Values must be within the range [-1000, 1000].")
	fs.Int32Var(&fv.healthzPort, "healthz-port", fv.healthzPort, "The port to bind the health check server. Use 0 to disable.")
	fs.Int32Var(&fv.metricsPort, "metrics-port", fv.metricsPort, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "use --healthz-bind-address instead")
	_ = fs.MarkDeprecated("metrics-port", "use --metrics-bind-address instead")
}

func (fv *flagValues) addConntrackFlags(fs *pflag.FlagSet) {
	ct := &fv.cfg.Conntrack
	// Applied once at startup (conntrack.ApplySysctls); inside a network
	// namespace the read-only ones are logged and skipped.
	fs.Int32Var(ct.MaxPerCore, "conntrack-max-per-core", *ct.MaxPerCore, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(ct.Min, "conntrack-min", *ct.Min, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.")
	fs.DurationVar(&ct.TCPEstablishedTimeout.Duration, "conntrack-tcp-timeout-established", ct.TCPEstablishedTimeout.Duration, "Idle timeout for established TCP connections (0 to leave as-is).")
	fs.DurationVar(&ct.TCPCloseWaitTimeout.Duration, "conntrack-tcp-timeout-close-wait", ct.TCPCloseWaitTimeout.Duration, "NAT timeout for TCP connections in the CLOSE_WAIT state.")
	fs.BoolVar(&ct.TCPBeLiberal, "conntrack-tcp-be-liberal", ct.TCPBeLiberal, "Enable liberal mode for tracking TCP packets.")
	fs.DurationVar(&ct.UDPTimeout.Duration, "conntrack-udp-timeout", ct.UDPTimeout.Duration, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is).")
	fs.DurationVar(&ct.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", ct.UDPStreamTimeout.Duration, "Idle timeout for ASSURED UDP connections (0 to leave as-is).")
}

// noEffect says why each upstream flag nftproxy accepts does nothing here;
// startup logs the reason for each one given.
var noEffect = map[string]string{
	"bind-address":                    "nftproxy takes the node's primary IPs from its Node object",
	"show-hidden-metrics-for-version": "nftproxy has no hidden metrics",
	"iptables-localhost-nodeports":    "iptables mode only",
	"ipvs-sync-period":                "IPVS mode only",
	"ipvs-min-sync-period":            "IPVS mode only",
	"ipvs-scheduler":                  "IPVS mode only",
	"ipvs-exclude-cidrs":              "IPVS mode only",
	"ipvs-strict-arp":                 "IPVS mode only",
	"ipvs-tcp-timeout":                "IPVS mode only",
	"ipvs-tcpfin-timeout":             "IPVS mode only",
	"ipvs-udp-timeout":                "IPVS mode only",
}

// addUnusedConfigFlags declares the config file flags that have no effect,
// with upstream's types, so that existing DaemonSets parse as for
// kube-proxy; the values still go to cfg (and --write-config-to, /configz).
func (fv *flagValues) addUnusedConfigFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	fs.StringVar(&c.BindAddress, "bind-address", c.BindAddress, "Overrides kube-proxy's idea of what its node's primary IP is.")
	fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", c.ShowHiddenMetricsForVersion, "The previous version for which you want to show hidden metrics.")
	fs.BoolVar(c.IPTables.LocalhostNodePorts, "iptables-localhost-nodeports", *c.IPTables.LocalhostNodePorts, "If false, NodePorts are not accepted on localhost.")
	fs.DurationVar(&c.IPVS.SyncPeriod.Duration, "ipvs-sync-period", c.IPVS.SyncPeriod.Duration, "How often the IPVS rules are re-synchronized.")
	fs.DurationVar(&c.IPVS.MinSyncPeriod.Duration, "ipvs-min-sync-period", c.IPVS.MinSyncPeriod.Duration, "The minimum period between IPVS rule resyncs.")
	fs.StringVar(&c.IPVS.Scheduler, "ipvs-scheduler", c.IPVS.Scheduler, "The IPVS scheduler type.")
	fs.StringSliceVar(&c.IPVS.ExcludeCIDRs, "ipvs-exclude-cidrs", c.IPVS.ExcludeCIDRs, "CIDRs the IPVS proxier should not touch when cleaning up.")
	fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", c.IPVS.StrictARP, "Enable strict ARP (arp_ignore 1, arp_announce 2).")
	fs.DurationVar(&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", c.IPVS.TCPTimeout.Duration, "The timeout for idle IPVS TCP connections.")
	fs.DurationVar(&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", c.IPVS.TCPFinTimeout.Duration, "The timeout for IPVS TCP connections after a FIN.")
	fs.DurationVar(&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", c.IPVS.UDPTimeout.Duration, "The timeout for IPVS UDP packets.")
}

// addNoEffectFlags marks every flag of noEffect. (kube-proxy up to v1.36
// also had cAdvisor's --boot-id-file and --machine-id-file, which v1.37
// dropped with cAdvisor; nftproxy follows the newest release.)
func addNoEffectFlags(fs *pflag.FlagSet) {
	for name, why := range noEffect {
		if f := fs.Lookup(name); f != nil { // TestEveryUpstreamFlagAccepted checks they all are
			_ = fs.SetAnnotation(name, annotationNoEffect, []string{why})
			f.Usage += " No effect in nftproxy: " + why + "."
		}
	}
}

// stringValue is a pflag.Value over a string-kinded type (ProxyMode,
// LocalMode), which pflag's StringVar cannot take.
type stringValue string

func (s *stringValue) String() string     { return string(*s) }
func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) Type() string       { return "string" }
