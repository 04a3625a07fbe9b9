package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// options is everything the command line and the config file decide,
// validated. proxier.Config is what the proxier needs; the rest is for the
// wiring in run.go.
type options struct {
	Proxier proxier.Config

	// Version is --version: when it asks for printing, nothing else is set.
	Version       versionFlag
	WriteConfigTo string // write Config there and exit
	Cleanup       bool   // delete our tables and exit
	InitOnly      bool   // apply the privileged settings and exit

	// Config is the effective KubeProxyConfiguration: defaults, then the
	// --config file or the flags, completed for nftables mode as upstream
	// completes it. --write-config-to writes it, /configz serves it.
	Config *kpconfig.KubeProxyConfiguration
	// ConfigFile is --config and ConfigData the content parsed from it; run
	// exits when the file's content changes.
	ConfigFile string
	ConfigData []byte
	// FeatureGate holds the feature gates given, checked against
	// kube-proxy's; nftproxy reads those in honouredGates.
	FeatureGate featuregate.FeatureGate

	Client clientOptions
	// ConfigSyncPeriod is the informers' resync period.
	ConfigSyncPeriod time.Duration

	// HealthzBindAddress and MetricsBindAddress are "host:port"; empty
	// disables the server.
	HealthzBindAddress string
	MetricsBindAddress string
	// MetricsLoopbackAddress is a second address of the metrics server:
	// the configured metricsBindAddress when --metrics-bind-address-override
	// moved the server off it and it is a loopback address (kubeadm's
	// 127.0.0.1:10249). kube-proxy answers there, and so do node-local
	// clients (upstream's e2e tests curl localhost:10249/proxyMode from the
	// node); empty when there is none.
	MetricsLoopbackAddress string
	BindAddressHardFail    bool
	// EnableProfiling serves /debug/pprof on the metrics server.
	EnableProfiling bool

	// MaxReaderWaitLowered, if set, is the default --max-reader-wait that
	// was lowered to proxier.MaxReaderWaitLimit (a short sync period).
	MaxReaderWaitLowered time.Duration

	// IPFamiliesExplicit is set when --ip-families was given: a family the
	// kernel cannot program is then an error instead of being skipped.
	IPFamiliesExplicit bool
	// OwnTables: the tables are owned by nftproxy's sockets (--own-tables).
	OwnTables bool
	// RemoveKubeProxyTables deletes kube-proxy's nftables tables after the
	// first successful sync of each family (--remove-kube-proxy-tables).
	RemoveKubeProxyTables bool

	// NodePortAddresses as given (also in Proxier.NodePortCIDRs); Conntrack
	// is applied once at startup, OOMScoreAdj when the proxy starts.
	NodePortAddresses []string
	Conntrack         kpconfig.KubeProxyConntrackConfiguration
	OOMScoreAdj       int

	// What startup logs about the command line: the flags given that have
	// no effect (with why), those --config replaced, the deprecated ones,
	// and why strict decoding of the file failed.
	NoEffectFlags   map[string]string
	IgnoredByConfig []string
	DeprecatedFlags []string
	LenientDecode   error
	// ConfigFileIPTablesMode: the --config file says mode "iptables", as
	// kubeadm v1.37 writes it by default; nftables is programmed instead.
	ConfigFileIPTablesMode bool
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
	stdout   io.Writer // --help, --version; JSON info logs with split streams
	stderr   io.Writer // errors; JSON logs
	stdin    io.Reader // nftproxy dump --from-file -
}

// parseOptions turns the command line (without the program name) into
// options, with upstream kube-proxy's precedence: without --config, the
// defaults and then the flags given; with --config, the file, then the
// logging flags, --hostname-override and the flags that have no field in
// it (--master, the commands, nftproxy's own flags).
func parseOptions(args []string, env environment) (*options, error) {
	return parseCommandOptions("nftproxy", args, env, nil)
}

// parseCommandOptions is parseOptions for command name, a subcommand
// (nftproxy dump) if extra (not nil) declares flags of its own.
func parseCommandOptions(name string, args []string, env environment, extra func(*pflag.FlagSet)) (*options, error) {
	fv := newFlagValues()
	fs := fv.flagSet()
	if extra != nil {
		extra(fs)
	}
	fs.SetOutput(io.Discard) // main prints the error once, without the usage
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(env.stdout, "Usage of %s:\n%s", name, fs.FlagUsages())
			if extra == nil {
				fmt.Fprintf(env.stdout, "\nCommands:\n  nftproxy dump [flags]   print the tables nftproxy would program for a node (nftproxy dump --help)\n  nftproxy diff [flags]   compare the node's tables with those (nftproxy diff --help)\n")
			}
		}
		return nil, err
	}
	if len(fs.Args()) > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o := &options{Version: fv.version, ConfigFile: fv.configFile, WriteConfigTo: fv.writeConfigTo,
		Cleanup: fv.cleanup, InitOnly: fv.initOnly, NoEffectFlags: map[string]string{}}
	if fv.version == versionTrue || fv.version == versionRaw {
		return o, nil
	}
	var err error
	if fv.configFile != "" {
		err = fv.useConfigFile(fs, env, o)
	} else {
		fv.useFlags(fs, o)
	}
	if err != nil {
		return nil, err
	}
	if err := fv.resolve(fs, env, o); err != nil {
		return nil, err
	}
	return o, nil
}

// useConfigFile replaces the flags' configuration by the file's, as
// upstream: the logging flags given are copied over it, and the other
// flags that have a field in it are reported as ignored.
func (fv *flagValues) useConfigFile(fs *pflag.FlagSet, env environment, o *options) error {
	data, err := env.readFile(fv.configFile)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	cfg, lenient, err := parseConfigFile(data)
	if err != nil {
		return fmt.Errorf("--config %s: %w", fv.configFile, err)
	}
	if err := copyLoggingFlags(fs, &cfg.Logging); err != nil {
		return err
	}
	fs.Visit(func(f *pflag.Flag) {
		if _, ok := f.Annotations[annotationConfigFile]; ok {
			o.IgnoredByConfig = append(o.IgnoredByConfig, f.Name)
		}
	})
	fv.cfg, o.ConfigData, o.LenientDecode = cfg, data, lenient
	fv.minSyncPeriodSet = minSyncPeriodSet(data)
	return nil
}

// useFlags completes the flags' configuration: the deprecated port flags
// (upstream applies them without --config and --write-config-to) and the
// masquerade bit, which nftproxy honours in nftables mode.
func (fv *flagValues) useFlags(fs *pflag.FlagSet, o *options) {
	c := fv.cfg
	// A flag's 0 syncs on every change, as upstream's.
	fv.minSyncPeriodSet = fs.Changed("iptables-min-sync-period")
	if fs.Changed("iptables-masquerade-bit") {
		*c.NFTables.MasqueradeBit = *c.IPTables.MasqueradeBit
	}
	if fv.writeConfigTo != "" {
		return
	}
	for _, p := range []struct {
		flag, addrFlag string
		addr           *string
		port           int32
	}{
		{"healthz-port", "--healthz-bind-address", &c.HealthzBindAddress, fv.healthzPort},
		{"metrics-port", "--metrics-bind-address", &c.MetricsBindAddress, fv.metricsPort},
	} {
		var applied bool
		*p.addr, applied = addressFromPortFlag(*p.addr, p.port)
		if !applied && fs.Changed(p.flag) {
			o.NoEffectFlags[p.flag] = p.addrFlag + " has a port; as in kube-proxy, the port flag only completes a bare IP"
		}
	}
}

// resolve completes, validates and converts the merged configuration. All
// problems are reported at once, each naming its flag and config field.
func (fv *flagValues) resolve(fs *pflag.FlagSet, env environment, o *options) error {
	c := fv.cfg
	var errs []error
	check := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	check(checkMode(c, fv.configFile != ""))
	o.ConfigFileIPTablesMode = fv.configFile != "" && c.Mode == "iptables"
	check(fv.applyHostnameOverride())
	completeForNFTables(c)
	check(checkDetectLocalMode(c))
	check(checkPeriods(c))
	check(checkClient(c))
	check(checkLinux(c))
	check(checkNodePortAddresses(c.NodePortAddresses))
	var err error
	o.FeatureGate, err = featureGateFor(c.FeatureGates)
	check(err)
	if err == nil {
		check(validateLogging(&c.Logging, o.FeatureGate))
	}
	check(fv.resolveServers(o))
	fv.maxReaderWaitSet = fs.Changed("max-reader-wait")
	o.Proxier, err = fv.proxierConfig(env)
	check(err)
	o.MaxReaderWaitLowered = fv.maxReaderWaitLowered
	if o.FeatureGate != nil {
		o.Proxier.LocalhostNodePorts = o.FeatureGate.Enabled(gateLocalhostNodePorts)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fv.fillOptions(fs, o)
	return nil
}

// applyHostnameOverride applies --hostname-override over the file's
// hostnameOverride, trimmed and lower-cased, as upstream.
func (fv *flagValues) applyHostnameOverride() error {
	if fv.hostnameOverride == "" {
		return nil
	}
	name := strings.TrimSpace(fv.hostnameOverride)
	if name == "" {
		return errors.New("--hostname-override: empty hostname-override is invalid")
	}
	fv.cfg.HostnameOverride = strings.ToLower(name)
	return nil
}

// resolveServers validates the server addresses and applies
// --metrics-bind-address-override; Config gets the addresses served.
func (fv *flagValues) resolveServers(o *options) error {
	c := fv.cfg
	var errs [3]error
	o.HealthzBindAddress, errs[0] = bindAddress(c.HealthzBindAddress, defaultHealthzPort, "--healthz-bind-address / healthzBindAddress")
	o.MetricsBindAddress, errs[1] = bindAddress(c.MetricsBindAddress, defaultMetricsPort, "--metrics-bind-address / metricsBindAddress")
	if fv.metricsBindAddressOverride != "" {
		configured := o.MetricsBindAddress
		o.MetricsBindAddress, errs[2] = bindAddress(fv.metricsBindAddressOverride, defaultMetricsPort, "--metrics-bind-address-override")
		if isLoopback(configured) && configured != o.MetricsBindAddress {
			o.MetricsLoopbackAddress = configured
		}
	}
	c.HealthzBindAddress, c.MetricsBindAddress = o.HealthzBindAddress, o.MetricsBindAddress
	return errors.Join(errs[:]...)
}

// isLoopback reports whether hostport ("127.0.0.1:10249") is on a loopback
// address.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// fillOptions copies the validated configuration into o.
func (fv *flagValues) fillOptions(fs *pflag.FlagSet, o *options) {
	c := fv.cfg
	o.Config = c
	o.ConfigSyncPeriod = c.ConfigSyncPeriod.Duration
	o.BindAddressHardFail = c.BindAddressHardFail
	o.EnableProfiling = c.EnableProfiling
	o.IPFamiliesExplicit = fs.Changed("ip-families")
	o.OwnTables = fv.ownTables
	o.RemoveKubeProxyTables = fv.removeKubeProxyTables
	o.NodePortAddresses = c.NodePortAddresses
	o.Conntrack = c.Conntrack
	o.OOMScoreAdj = int(*c.OOMScoreAdj)
	o.Client = clientOptions{
		Kubeconfig:         c.ClientConnection.Kubeconfig,
		Master:             fv.master,
		ContentType:        c.ClientConnection.ContentType,
		AcceptContentTypes: c.ClientConnection.AcceptContentTypes,
		QPS:                c.ClientConnection.QPS,
		Burst:              int(c.ClientConnection.Burst),
	}
	fs.Visit(func(f *pflag.Flag) {
		why, ok := f.Annotations[annotationNoEffect]
		if ok && !slices.Contains(o.IgnoredByConfig, f.Name) {
			o.NoEffectFlags[f.Name] = why[0]
		}
		if f.Deprecated != "" {
			o.DeprecatedFlags = append(o.DeprecatedFlags, f.Name)
		}
	})
}

// parseTrafficMetrics parses --service-traffic-metrics.
func parseTrafficMetrics(v string) (ruleset.Counters, error) {
	for _, c := range []ruleset.Counters{ruleset.CountNone, ruleset.CountServices, ruleset.CountEndpoints} {
		if v == c.String() || v == "" && c == ruleset.CountNone {
			return c, nil
		}
	}
	return ruleset.CountNone, fmt.Errorf("--service-traffic-metrics %q: want none, services or endpoints", v)
}

// proxierConfig builds proxier.Config from the merged configuration.
func (fv *flagValues) proxierConfig(env environment) (proxier.Config, error) {
	c := fv.cfg
	pc := proxier.Config{
		MasqueradeAll:  c.NFTables.MasqueradeAll,
		SyncPeriod:     c.NFTables.SyncPeriod.Duration,
		MinSyncPeriod:  c.NFTables.MinSyncPeriod.Duration,
		FullSyncPeriod: fv.fullSyncPeriod,
		MaxReaderWait:  fv.maxReaderWait,
		ResyncPeriod:   c.ConfigSyncPeriod.Duration,
	}
	if !fv.minSyncPeriodSet {
		// Upstream's default minSyncPeriod (1 s, which /configz still
		// shows) is a bound here: syncs are spaced by their cost.
		pc.MinSyncPeriod, pc.SyncBusyShare = 0, defaultSyncBusyShare
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
	pc.TrafficCounters, err = parseTrafficMetrics(fv.serviceTrafficMetrics)
	errs = append(errs, err)
	if fv.fullSyncPeriod < 0 {
		errs = append(errs, fmt.Errorf("--full-sync-period %v: must not be negative", fv.fullSyncPeriod))
	}
	if fv.maxReaderWait < 0 {
		errs = append(errs, fmt.Errorf("--max-reader-wait %v: must not be negative", fv.maxReaderWait))
	}
	if limit := proxier.MaxReaderWaitLimit(pc); pc.MaxReaderWait > limit {
		if fv.maxReaderWaitSet {
			errs = append(errs, fmt.Errorf("--max-reader-wait %v: at most %v with the sync period %v (--iptables-sync-period / nftables.syncPeriod): "+
				"/healthz fails when a change stays unapplied for twice the sync period, and a change waits for readers, then for its sync",
				pc.MaxReaderWait, limit, pc.SyncPeriod))
		} else {
			fv.maxReaderWaitLowered = pc.MaxReaderWait
			pc.MaxReaderWait = limit
		}
	}
	pc.LocalDetect = proxier.LocalDetect{Mode: string(c.DetectLocalMode),
		BridgeInterface: c.DetectLocal.BridgeInterface, InterfaceNamePrefix: c.DetectLocal.InterfaceNamePrefix}
	pc.NodePortPrimary, pc.NodePortCIDRs = expandNodePortAddresses(c.NodePortAddresses)
	return pc, errors.Join(errs...)
}
