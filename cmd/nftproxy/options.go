package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/proxier"
)

// options is everything the command line and the config file decide,
// validated. proxier.Config is what the proxier needs; the rest is for the
// wiring in run.go.
type options struct {
	Proxier proxier.Config

	Cleanup  bool // delete our tables and exit
	InitOnly bool // validate and exit

	Client clientOptions
	// ConfigSyncPeriod is the informers' resync period.
	ConfigSyncPeriod time.Duration

	// HealthzBindAddress and MetricsBindAddress are "host:port"; empty
	// disables the server.
	HealthzBindAddress  string
	MetricsBindAddress  string
	BindAddressHardFail bool
	// EnableProfiling serves /debug/pprof on the metrics server.
	EnableProfiling bool

	// IPFamiliesExplicit is set when --ip-families was given: a family the
	// kernel cannot program is then an error instead of being skipped.
	IPFamiliesExplicit bool

	// NodePortAddresses as given (also in Proxier.NodePortCIDRs); Conntrack
	// is applied once at startup.
	NodePortAddresses []string
	Conntrack         kpconfig.KubeProxyConntrackConfiguration
	FeatureGates      map[string]bool

	// Verbosity and VModule configure klog.
	Verbosity int
	VModule   string

	// IgnoredFlags are the ignoredFlags given; FileOverrides the flags that
	// overrode a --config value. run logs both.
	IgnoredFlags  []string
	FileOverrides []string
}

// clientOptions configure the Kubernetes API client.
type clientOptions struct {
	Kubeconfig         string
	Master             string
	ContentType        string
	AcceptContentTypes string
	QPS                float32
	Burst              int
}

// environment is what parsing reads from the outside, replaceable in tests.
type environment struct {
	readFile func(name string) ([]byte, error)
	hostname func() (string, error)
	output   io.Writer // usage and --help
}

// parseOptions turns the command line (without the program name) into
// options. Precedence: upstream defaults, then the --config file, then the
// flags actually given. (Upstream kube-proxy instead ignores most flags when
// --config is given; honouring them is a superset of that behaviour.)
func parseOptions(args []string, env environment) (*options, error) {
	first := &flagValues{cfg: defaultConfig()}
	fs := first.flagSet()
	fs.SetOutput(io.Discard) // main prints the error once, without the usage
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(env.output, "Usage of nftproxy:\n%s", fs.FlagUsages())
		}
		return nil, err
	}
	if len(fs.Args()) > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg := defaultConfig()
	if first.configFile != "" {
		data, err := env.readFile(first.configFile)
		if err != nil {
			return nil, fmt.Errorf("--config: %w", err)
		}
		if cfg, err = parseConfigFile(data); err != nil {
			return nil, fmt.Errorf("--config %s: %w", first.configFile, err)
		}
	}
	fv := &flagValues{cfg: cfg}
	fs = fv.flagSet()
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return fv.resolve(fs, env)
}

// resolve validates the merged configuration and converts it. All problems
// are reported at once, each naming its flag and config file field.
func (fv *flagValues) resolve(fs *pflag.FlagSet, env environment) (*options, error) {
	c := fv.cfg
	o := &options{
		Cleanup:             fv.cleanup,
		InitOnly:            fv.initOnly,
		ConfigSyncPeriod:    c.ConfigSyncPeriod.Duration,
		BindAddressHardFail: c.BindAddressHardFail,
		IPFamiliesExplicit:  fs.Changed("ip-families"),
		NodePortAddresses:   c.NodePortAddresses,
		Conntrack:           c.Conntrack,
		Verbosity:           int(c.Logging.Verbosity),
		VModule:             vmoduleString(c),
		Client: clientOptions{
			Kubeconfig:         c.ClientConnection.Kubeconfig,
			Master:             fv.master,
			ContentType:        c.ClientConnection.ContentType,
			AcceptContentTypes: c.ClientConnection.AcceptContentTypes,
			QPS:                c.ClientConnection.QPS,
			Burst:              int(c.ClientConnection.Burst),
		},
	}
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	check(checkMode(c))
	check(checkDetectLocalMode(c))
	check(checkPeriods(c))
	check(checkClient(c))
	check(checkLogging(c))
	check(checkNodePortAddresses(c.NodePortAddresses))
	var err error
	o.FeatureGates, err = featureGates(c.FeatureGates, fv.featureGates)
	check(err)
	o.HealthzBindAddress, err = bindAddress(c.HealthzBindAddress, fs.Changed("healthz-port"), fv.healthzPort, "--healthz-bind-address / healthzBindAddress")
	check(err)
	o.MetricsBindAddress, err = bindAddress(c.MetricsBindAddress, fs.Changed("metrics-port"), fv.metricsPort, "--metrics-bind-address / metricsBindAddress")
	check(err)
	o.EnableProfiling = c.EnableProfiling
	o.Proxier, err = fv.proxierConfig(env)
	check(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	o.IgnoredFlags, o.FileOverrides = changedFlags(fs, fv.configFile != "")
	return o, nil
}

// proxierConfig builds proxier.Config from the merged configuration.
func (fv *flagValues) proxierConfig(env environment) (proxier.Config, error) {
	c := fv.cfg
	pc := proxier.Config{
		MasqueradeAll:  c.NFTables.MasqueradeAll,
		SyncPeriod:     c.NFTables.SyncPeriod.Duration,
		MinSyncPeriod:  c.NFTables.MinSyncPeriod.Duration,
		FullSyncPeriod: defaultFullSyncPeriod,
		ResyncPeriod:   c.ConfigSyncPeriod.Duration,
	}
	var errs []error
	var err error
	pc.NodeName, err = nodeName(c.HostnameOverride, env.hostname)
	errs = append(errs, err)
	pc.MasqueradeBit, err = masqueradeBit(c.NFTables.MasqueradeBit)
	errs = append(errs, err)
	pc.ClusterCIDRs, err = parseCIDRs(c.ClusterCIDR, "--cluster-cidr / clusterCIDR")
	errs = append(errs, err)
	pc.ServiceCIDRs, err = parseCIDRs(fv.serviceCIDR, "--service-cidr")
	errs = append(errs, err)
	pc.IPv4, pc.IPv6, err = parseIPFamilies(fv.ipFamilies)
	errs = append(errs, err)
	pc.LocalDetect = proxier.LocalDetect{Mode: string(c.DetectLocalMode),
		BridgeInterface: c.DetectLocal.BridgeInterface, InterfaceNamePrefix: c.DetectLocal.InterfaceNamePrefix}
	if len(c.NodePortAddresses) != 1 || c.NodePortAddresses[0] != "primary" {
		// checkNodePortAddresses reports the unparsable ones.
		for _, a := range c.NodePortAddresses {
			if p, err := netip.ParsePrefix(a); err == nil {
				pc.NodePortCIDRs = append(pc.NodePortCIDRs, p.Masked())
			}
		}
	}
	return pc, errors.Join(errs...)
}

// checkMode refuses the proxy modes nftproxy does not implement, instead of
// silently running nftables rules where iptables or IPVS ones were asked for.
func checkMode(c *kpconfig.KubeProxyConfiguration) error {
	switch c.Mode {
	case "", "nftables":
		return nil
	}
	return fmt.Errorf("--proxy-mode / mode %q: nftproxy only implements the nftables mode (set it to \"nftables\" or leave it empty)", c.Mode)
}

// checkDetectLocalMode accepts upstream's modes, each with what it needs.
func checkDetectLocalMode(c *kpconfig.KubeProxyConfiguration) error {
	switch c.DetectLocalMode {
	case "", "ClusterCIDR", "NodeCIDR":
		return nil
	case "BridgeInterface":
		if c.DetectLocal.BridgeInterface == "" {
			return errors.New("--detect-local-mode / detectLocalMode BridgeInterface needs --pod-bridge-interface / detectLocal.bridgeInterface")
		}
		return nil
	case "InterfaceNamePrefix":
		if c.DetectLocal.InterfaceNamePrefix == "" {
			return errors.New("--detect-local-mode / detectLocalMode InterfaceNamePrefix needs --pod-interface-name-prefix / detectLocal.interfaceNamePrefix")
		}
		return nil
	}
	return fmt.Errorf("--detect-local-mode / detectLocalMode %q: unknown mode (ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix)", c.DetectLocalMode)
}

// checkPeriods applies upstream's validation of the sync periods.
func checkPeriods(c *kpconfig.KubeProxyConfiguration) error {
	sync, minSync := c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	var errs []error
	if sync <= 0 {
		errs = append(errs, fmt.Errorf("--iptables-sync-period / nftables.syncPeriod %v: must be greater than 0", sync))
	}
	if minSync < 0 {
		errs = append(errs, fmt.Errorf("--iptables-min-sync-period / nftables.minSyncPeriod %v: must be greater than or equal to 0", minSync))
	}
	if sync > 0 && minSync > sync {
		errs = append(errs, fmt.Errorf("--iptables-min-sync-period / nftables.minSyncPeriod %v: must not exceed the sync period %v", minSync, sync))
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--config-sync-period / configSyncPeriod %v: must be greater than 0", c.ConfigSyncPeriod.Duration))
	}
	return errors.Join(errs...)
}

func checkClient(c *kpconfig.KubeProxyConfiguration) error {
	var errs []error
	if c.ClientConnection.QPS < 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps / clientConnection.qps %v: must not be negative", c.ClientConnection.QPS))
	}
	if c.ClientConnection.Burst < 0 {
		errs = append(errs, fmt.Errorf("--kube-api-burst / clientConnection.burst %d: must not be negative", c.ClientConnection.Burst))
	}
	return errors.Join(errs...)
}

// checkLogging accepts klog's text format only: nftproxy does not link the
// JSON log format.
func checkLogging(c *kpconfig.KubeProxyConfiguration) error {
	if f := c.Logging.Format; f != "" && f != "text" {
		return fmt.Errorf("logging.format %q: nftproxy only supports \"text\"", f)
	}
	return nil
}

// checkNodePortAddresses applies upstream's rule: CIDRs, or "primary" alone.
func checkNodePortAddresses(addrs []string) error {
	for _, a := range addrs {
		if a == "primary" {
			if len(addrs) > 1 {
				return fmt.Errorf("--nodeport-addresses / nodePortAddresses %q: \"primary\" must be the only value", addrs)
			}
			continue
		}
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("--nodeport-addresses / nodePortAddresses %q: %w", a, err)
		}
	}
	return nil
}

// featureGates merges the file's gates with --feature-gates.
func featureGates(fromFile map[string]bool, fromFlag map[string]string) (map[string]bool, error) {
	gates := map[string]bool{}
	for k, v := range fromFile {
		gates[k] = v
	}
	for k, v := range fromFlag {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("--feature-gates %s=%s: value must be true or false", k, v)
		}
		gates[k] = b
	}
	return gates, nil
}

// bindAddress validates a server address: "host:port", a bare IP (the
// default port is appended, as upstream does), or empty (disabled). The
// deprecated --healthz-port/--metrics-port, when given, disable the server
// (0) or replace the port.
func bindAddress(addr string, portGiven bool, port int32, what string) (string, error) {
	if portGiven {
		if port == 0 {
			return "", nil
		}
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		addr = net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	if addr == "" {
		return "", nil
	}
	if ip, err := netip.ParseAddr(addr); err == nil {
		return net.JoinHostPort(ip.String(), strconv.Itoa(defaultPortFor(what))), nil
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%s %q: want IP:port", what, addr)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return "", fmt.Errorf("%s %q: %q is not an IP address", what, addr, host)
	}
	if p, err := strconv.ParseUint(portText, 10, 16); err != nil || p == 0 {
		return "", fmt.Errorf("%s %q: port must be 1-65535", what, addr)
	}
	return addr, nil
}

func defaultPortFor(what string) int {
	if strings.Contains(what, "healthz") {
		return defaultHealthzPort
	}
	return defaultMetricsPort
}

// nodeName is upstream's GetHostname: the override, else the hostname,
// trimmed and lower-cased (Node names are lower case).
func nodeName(override string, hostname func() (string, error)) (string, error) {
	name := override
	if name == "" {
		h, err := hostname()
		if err != nil {
			return "", fmt.Errorf("node name: --hostname-override not set and no hostname: %w", err)
		}
		name = h
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", errors.New("--hostname-override / hostnameOverride: empty node name")
	}
	return name, nil
}

func masqueradeBit(bit *int32) (int, error) {
	if *bit < 0 || *bit > 31 {
		return 0, fmt.Errorf("--iptables-masquerade-bit / nftables.masqueradeBit %d: must be within [0, 31]", *bit)
	}
	return int(*bit), nil
}

// parseCIDRs parses a comma-separated list of at most one prefix per IP
// family (a dual-stack pair), as upstream validates --cluster-cidr.
func parseCIDRs(list, what string) ([]netip.Prefix, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var prefixes []netip.Prefix
	seen := map[bool]bool{} // Is4 → seen
	for _, s := range strings.Split(list, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", what, s, err)
		}
		p = p.Masked()
		if seen[p.Addr().Is4()] {
			return nil, fmt.Errorf("%s %q: at most one CIDR per IP family", what, list)
		}
		seen[p.Addr().Is4()] = true
		prefixes = append(prefixes, p)
	}
	return prefixes, nil
}

// parseIPFamilies parses --ip-families; empty means both.
func parseIPFamilies(list string) (ipv4, ipv6 bool, err error) {
	if strings.TrimSpace(list) == "" {
		return true, true, nil
	}
	for _, s := range strings.Split(list, ",") {
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "ipv4":
			ipv4 = true
		case "ipv6":
			ipv6 = true
		default:
			return false, false, fmt.Errorf("--ip-families %q: %q is not ipv4 or ipv6", list, s)
		}
	}
	return ipv4, ipv6, nil
}

// vmoduleString renders logging.vmodule as klog's -vmodule value.
func vmoduleString(c *kpconfig.KubeProxyConfiguration) string {
	var parts []string
	for _, item := range c.Logging.VModule {
		parts = append(parts, fmt.Sprintf("%s=%d", item.FilePattern, item.Verbosity))
	}
	return strings.Join(parts, ",")
}

// changedFlags lists the ignored flags given and, when a config file was
// read, every flag given (each may override a file value).
func changedFlags(fs *pflag.FlagSet, withFile bool) (ignored, overrides []string) {
	fs.Visit(func(f *pflag.Flag) {
		for _, name := range ignoredFlags {
			if f.Name == name {
				ignored = append(ignored, f.Name)
			}
		}
		if withFile && f.Name != "config" {
			overrides = append(overrides, f.Name)
		}
	})
	return ignored, overrides
}
