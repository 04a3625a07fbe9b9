package main

import (
	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// flagValues is what the command line can set. Flags that have a config
// file field write straight into cfg, so that "defaults, then the file, then
// the flags given" is just: fill cfg, then parse the flags into it.
type flagValues struct {
	cfg *kpconfig.KubeProxyConfiguration

	configFile   string
	master       string
	cleanup      bool
	initOnly     bool
	serviceCIDR  string
	ipFamilies   string
	healthzPort  int32
	metricsPort  int32
	featureGates map[string]string
}

// ignoredFlags are upstream flags nftproxy accepts so that existing
// DaemonSets start, but which have no effect here (iptables/IPVS-only, or
// features not carried over). run logs each one given.
var ignoredFlags = []string{
	"bind-address", "show-hidden-metrics-for-version", "oom-score-adj",
	"iptables-localhost-nodeports", "pod-bridge-interface", "pod-interface-name-prefix",
	"ipvs-sync-period", "ipvs-min-sync-period", "ipvs-scheduler", "ipvs-exclude-cidrs",
	"ipvs-strict-arp", "ipvs-tcp-timeout", "ipvs-tcpfin-timeout", "ipvs-udp-timeout",
}

// flagSet declares nftproxy's flags: upstream kube-proxy's names and
// meanings, plus --service-cidr and --ip-families.
func (fv *flagValues) flagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("nftproxy", pflag.ContinueOnError)
	fv.addGeneralFlags(fs)
	fv.addClientFlags(fs)
	fv.addProxyFlags(fs)
	fv.addServerFlags(fs)
	fv.addConntrackFlags(fs)
	fv.addIgnoredFlags(fs)
	return fs
}

func (fv *flagValues) addGeneralFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	fs.StringVar(&fv.configFile, "config", fv.configFile, "The path to the configuration file (KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1). Flags given on the command line override it.")
	fs.BoolVar(&fv.cleanup, "cleanup", fv.cleanup, "If true, delete nftproxy's nftables tables and exit.")
	fs.BoolVar(&fv.initOnly, "init-only", fv.initOnly, "If true, exit after validating the configuration (nftproxy needs no privileged initialization step).")
	fs.StringVar(&c.HostnameOverride, "hostname-override", c.HostnameOverride, "If non-empty, will be used as the name of the Node that nftproxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	fs.StringToStringVar(&fv.featureGates, "feature-gates", fv.featureGates, "A set of key=value pairs for kube-proxy feature gates. Accepted for compatibility; nftproxy has no feature gates and ignores them.")
	fs.VarP(logsapi.VerbosityLevelPflag(&c.Logging.Verbosity), "v", "v", "number for the log level verbosity")
	fs.Var(logsapi.VModuleConfigurationPflag(&c.Logging.VModule), "vmodule", "comma-separated list of pattern=N settings for file-filtered logging (only works for text log format)")
}

func (fv *flagValues) addClientFlags(fs *pflag.FlagSet) {
	cc := &fv.cfg.ClientConnection
	fs.StringVar(&cc.Kubeconfig, "kubeconfig", cc.Kubeconfig, "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&fv.master, "master", fv.master, "The address of the Kubernetes API server (overrides any value in kubeconfig)")
	fs.StringVar(&cc.ContentType, "kube-api-content-type", cc.ContentType, "Content type of requests sent to apiserver.")
	fs.Float32Var(&cc.QPS, "kube-api-qps", cc.QPS, "QPS to use while talking with kubernetes apiserver")
	fs.Int32Var(&cc.Burst, "kube-api-burst", cc.Burst, "Burst to use while talking with kubernetes apiserver")
	fs.DurationVar(&fv.cfg.ConfigSyncPeriod.Duration, "config-sync-period", fv.cfg.ConfigSyncPeriod.Duration, "How often configuration from the apiserver is refreshed.  Must be greater than 0.")
}

func (fv *flagValues) addProxyFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	fs.Var((*stringValue)(&c.Mode), "proxy-mode", "Which proxy mode to use: nftproxy only implements 'nftables' (empty means the same).")
	fs.StringVar(&c.ClusterCIDR, "cluster-cidr", c.ClusterCIDR, "The CIDR range of the pods in the cluster (for dual-stack clusters, a comma-separated IPv4,IPv6 pair). Traffic to a ClusterIP from outside it is masqueraded.")
	fs.StringVar(&fv.serviceCIDR, "service-cidr", fv.serviceCIDR, "nftproxy: comma-separated service CIDRs (at most one per IP family), used when the cluster has no ServiceCIDR objects: traffic to an unallocated address in them is dropped. Empty: no such drop unless ServiceCIDR objects exist.")
	fs.Var((*stringValue)(&c.DetectLocalMode), "detect-local-mode", "Mode to use to detect local traffic: ClusterCIDR (default), NodeCIDR, BridgeInterface or InterfaceNamePrefix.")
	fs.StringSliceVar(&c.NodePortAddresses, "nodeport-addresses", c.NodePortAddresses, "A list of CIDR ranges that contain valid node IPs, or alternatively, the single string 'primary' (the default: the node's primary IPs). NodePorts answer only on these addresses.")
	fs.BoolVar(&c.NFTables.MasqueradeAll, "masquerade-all", c.NFTables.MasqueradeAll, "SNAT all traffic sent via Service cluster IPs.")
	fs.Int32Var(c.NFTables.MasqueradeBit, "iptables-masquerade-bit", *c.NFTables.MasqueradeBit, "The bit of the fwmark space to mark packets requiring SNAT with. Must be within the range [0, 31]. (Upstream ignores this flag in nftables mode; nftproxy honours it.)")
	fs.DurationVar(&c.NFTables.SyncPeriod.Duration, "iptables-sync-period", c.NFTables.SyncPeriod.Duration, "The longest time between two rule syncs (e.g. '5s', '1m', '2h22m'). Must be greater than 0.")
	fs.DurationVar(&c.NFTables.MinSyncPeriod.Duration, "iptables-min-sync-period", c.NFTables.MinSyncPeriod.Duration, "The minimum period between rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate resync.")
	fs.StringVar(&fv.ipFamilies, "ip-families", fv.ipFamilies, "nftproxy: comma-separated IP families to program, 'ipv4' and/or 'ipv6'. Default: both (IPv6 is skipped if the kernel has it disabled).")
}

func (fv *flagValues) addServerFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	fs.StringVar(&c.HealthzBindAddress, "healthz-bind-address", c.HealthzBindAddress, "The IP address and port for the health check server to serve on. Set empty to disable.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", c.MetricsBindAddress, "The IP address and port for the metrics server to serve on. (Set to '0.0.0.0:10249' / '[::]:10249' to bind on all interfaces.) Set empty to disable.")
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", c.BindAddressHardFail, "If true nftproxy will treat failure to bind to a port as fatal and exit")
	fs.BoolVar(&c.EnableProfiling, "profiling", c.EnableProfiling, "If true enables profiling via web interface on /debug/pprof handler of the metrics server.")
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

// addIgnoredFlags declares ignoredFlags with upstream's types, so that
// "--profiling" (no value) parses as it does for kube-proxy.
func (fv *flagValues) addIgnoredFlags(fs *pflag.FlagSet) {
	c := fv.cfg
	const ignored = " Ignored by nftproxy."
	fs.StringVar(&c.BindAddress, "bind-address", c.BindAddress, "Overrides kube-proxy's idea of what its node's primary IP is."+ignored)
	fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", c.ShowHiddenMetricsForVersion, "The previous version for which you want to show hidden metrics."+ignored)
	fs.Int32Var(new(int32), "oom-score-adj", -999, "The oom-score-adj value for the process."+ignored)
	fs.Bool("iptables-localhost-nodeports", true, "iptables mode only."+ignored)
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", c.DetectLocal.BridgeInterface, "For --detect-local-mode=BridgeInterface: the bridge of this node's pods.")
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", c.DetectLocal.InterfaceNamePrefix, "For --detect-local-mode=InterfaceNamePrefix: the name prefix of this node's pod interfaces.")
	fs.Duration("ipvs-sync-period", 0, "IPVS mode only."+ignored)
	fs.Duration("ipvs-min-sync-period", 0, "IPVS mode only."+ignored)
	fs.String("ipvs-scheduler", "", "IPVS mode only."+ignored)
	fs.StringSlice("ipvs-exclude-cidrs", nil, "IPVS mode only."+ignored)
	fs.Bool("ipvs-strict-arp", false, "IPVS mode only."+ignored)
	fs.Duration("ipvs-tcp-timeout", 0, "IPVS mode only."+ignored)
	fs.Duration("ipvs-tcpfin-timeout", 0, "IPVS mode only."+ignored)
	fs.Duration("ipvs-udp-timeout", 0, "IPVS mode only."+ignored)
}

// stringValue is a pflag.Value over a string-kinded type (ProxyMode,
// LocalMode), which pflag's StringVar cannot take.
type stringValue string

func (s *stringValue) String() string     { return string(*s) }
func (s *stringValue) Set(v string) error { *s = stringValue(v); return nil }
func (s *stringValue) Type() string       { return "string" }
