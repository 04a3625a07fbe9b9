package main

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// Defaults of kube-proxy (pkg/proxy/apis/config/v1alpha1/defaults.go, unchanged from v1.36 to v1.37).
const (
	defaultBindAddress         = "0.0.0.0"
	defaultHealthzPort         = 10256
	defaultMetricsPort         = 10249
	defaultSyncPeriod          = 30 * time.Second
	defaultMinSyncPeriod       = time.Second
	defaultMasqueradeBit       = 14
	defaultOOMScoreAdj         = -999
	defaultConfigSyncPeriod    = 15 * time.Minute
	defaultContentType         = "application/vnd.kubernetes.protobuf"
	defaultQPS                 = 5
	defaultBurst               = 10
	defaultConntrackMaxPerCore = 32 * 1024
	defaultConntrackMin        = 128 * 1024
	defaultTCPEstablished      = 24 * time.Hour
	defaultTCPCloseWait        = time.Hour
	// defaultSyncBusyShare is the share of time syncs may take when the
	// user set no minimum sync period (runner.Config.BusyShare).
	defaultSyncBusyShare = 0.1
	// defaultFullSyncPeriod is how often the whole ruleset is checked against the kernel
	// even without failures (upstream: hourly); no flag sets it.
	defaultFullSyncPeriod = time.Hour
	// defaultMaxReaderWait bounds a sync's wait for other processes'
	// reads of the ruleset: long enough for a listing of the largest
	// table measured (docs/operations.md), short enough that a process
	// reading without end delays changes no more than that.
	defaultMaxReaderWait = 10 * time.Second
)

// configAPIVersion and configKind identify the file format --config accepts.
var (
	configAPIVersion = kpconfig.SchemeGroupVersion.String()
	configKind       = "KubeProxyConfiguration"
)

// defaultConfig returns the configuration kube-proxy would use with no
// flags and no file.
func defaultConfig() *kpconfig.KubeProxyConfiguration {
	cfg := &kpconfig.KubeProxyConfiguration{}
	setDefaults(cfg)
	return cfg
}

// setDefaults fills what is unset as upstream's v1alpha1 defaulting does,
// so that the flags (whose defaults are taken from cfg) show the values that
// will be used, and a written configuration reads like upstream's.
func setDefaults(cfg *kpconfig.KubeProxyConfiguration) {
	setString(&cfg.BindAddress, defaultBindAddress)
	healthzHost, metricsHost := defaultServerHosts(cfg.BindAddress)
	setString(&cfg.HealthzBindAddress, net.JoinHostPort(healthzHost, strconv.Itoa(defaultHealthzPort)))
	setString(&cfg.MetricsBindAddress, net.JoinHostPort(metricsHost, strconv.Itoa(defaultMetricsPort)))
	setInt32(&cfg.OOMScoreAdj, defaultOOMScoreAdj)
	setDuration(&cfg.IPTables.SyncPeriod, defaultSyncPeriod)
	setDuration(&cfg.IPTables.MinSyncPeriod, defaultMinSyncPeriod)
	if cfg.IPTables.LocalhostNodePorts == nil {
		cfg.IPTables.LocalhostNodePorts = ptr.To(true)
	}
	setDuration(&cfg.IPVS.SyncPeriod, defaultSyncPeriod)
	setDuration(&cfg.NFTables.SyncPeriod, defaultSyncPeriod)
	setDuration(&cfg.NFTables.MinSyncPeriod, defaultMinSyncPeriod)
	setInt32(&cfg.IPTables.MasqueradeBit, defaultMasqueradeBit)
	setInt32(&cfg.NFTables.MasqueradeBit, defaultMasqueradeBit)
	setDuration(&cfg.ConfigSyncPeriod, defaultConfigSyncPeriod)
	setString(&cfg.ClientConnection.ContentType, defaultContentType)
	if cfg.ClientConnection.QPS == 0 {
		cfg.ClientConnection.QPS = defaultQPS
	}
	if cfg.ClientConnection.Burst == 0 {
		cfg.ClientConnection.Burst = defaultBurst
	}
	setInt32(&cfg.Conntrack.MaxPerCore, defaultConntrackMaxPerCore)
	setInt32(&cfg.Conntrack.Min, defaultConntrackMin)
	if cfg.Conntrack.TCPEstablishedTimeout == nil {
		cfg.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: defaultTCPEstablished}
	}
	if cfg.Conntrack.TCPCloseWaitTimeout == nil {
		cfg.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: defaultTCPCloseWait}
	}
	if cfg.FeatureGates == nil {
		cfg.FeatureGates = map[string]bool{}
	}
	logsapi.SetRecommendedLoggingConfiguration(&cfg.Logging)
}

// defaultServerHosts are the default health and metrics hosts: IPv6 ones
// when bindAddress is not IPv4, as upstream.
func defaultServerHosts(bindAddress string) (healthz, metrics string) {
	if ip, err := netip.ParseAddr(bindAddress); err == nil && !ip.Unmap().Is4() {
		return "::", "::1"
	}
	return "0.0.0.0", "127.0.0.1"
}

func setString(p *string, v string) {
	if *p == "" {
		*p = v
	}
}

func setDuration(p *metav1.Duration, v time.Duration) {
	if p.Duration == 0 {
		p.Duration = v
	}
}

func setInt32(p **int32, v int32) {
	if *p == nil {
		*p = &v
	}
}

// parseConfigFile decodes a KubeProxyConfiguration (YAML or JSON) and
// applies the defaults. Like upstream, unknown fields are an error only if
// the lenient decoding fails too: kube-proxy logs a warning and goes on, so
// a file written for a newer kube-proxy keeps working. lenient is the
// strict decoding's error, for that warning.
func parseConfigFile(data []byte) (cfg *kpconfig.KubeProxyConfiguration, lenient, err error) {
	cfg = &kpconfig.KubeProxyConfiguration{}
	if strictErr := yaml.UnmarshalStrict(data, cfg); strictErr != nil {
		cfg = &kpconfig.KubeProxyConfiguration{}
		if err := yaml.Unmarshal(data, cfg); err != nil {
			return nil, nil, fmt.Errorf("decode: %w", err)
		}
		lenient = strictErr
	}
	if cfg.APIVersion != configAPIVersion || cfg.Kind != configKind {
		return nil, nil, fmt.Errorf("apiVersion %q kind %q: want apiVersion %q kind %q",
			cfg.APIVersion, cfg.Kind, configAPIVersion, configKind)
	}
	if cfg.Mode == "" || cfg.Mode == "iptables" {
		inheritIPTablesSettings(cfg)
	}
	setDefaults(cfg)
	return cfg, lenient, nil
}

// completeForNFTables completes a merged configuration (whose mode is
// nftables or empty) as upstream completes one for nftables mode
// (platformApplyDefaults), and leaves it as upstream's conversion back to
// v1alpha1 does: the sync periods and masqueradeAll live only in the
// nftables section. The result is what --write-config-to writes and
// /configz serves, and reads back to the same configuration.
func completeForNFTables(cfg *kpconfig.KubeProxyConfiguration) {
	cfg.TypeMeta = metav1.TypeMeta{APIVersion: configAPIVersion, Kind: configKind}
	cfg.Mode = "nftables"
	if cfg.DetectLocalMode == "" {
		cfg.DetectLocalMode = "ClusterCIDR"
	}
	if len(cfg.NodePortAddresses) == 0 {
		cfg.NodePortAddresses = []string{"primary"}
	}
	cfg.IPTables.SyncPeriod, cfg.IPTables.MinSyncPeriod = metav1.Duration{}, metav1.Duration{}
	cfg.IPVS.SyncPeriod, cfg.IPVS.MinSyncPeriod = metav1.Duration{}, metav1.Duration{}
	cfg.IPTables.MasqueradeAll = false
}

// writeConfigFile writes cfg as upstream's --write-config-to does: YAML
// with the fields in JSON order (sorted), apiVersion and kind included.
func writeConfigFile(path string, cfg *kpconfig.KubeProxyConfiguration) error {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("--write-config-to: encode: %w", err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	return nil
}

// inheritIPTablesSettings copies the iptables section into the nftables
// fields the file leaves unset. It applies when mode is empty, which
// upstream reads as "iptables", or "iptables", which kubeadm v1.37 writes
// for an unset mode (checkMode): such a file keeps its settings in the
// iptables section, and a drop-in replacement must honour them.
func inheritIPTablesSettings(cfg *kpconfig.KubeProxyConfiguration) {
	nft, ipt := &cfg.NFTables, &cfg.IPTables
	if nft.MasqueradeBit == nil {
		nft.MasqueradeBit = ipt.MasqueradeBit
	}
	nft.MasqueradeAll = nft.MasqueradeAll || ipt.MasqueradeAll
	if nft.SyncPeriod.Duration == 0 {
		nft.SyncPeriod = ipt.SyncPeriod
	}
	if nft.MinSyncPeriod.Duration == 0 {
		nft.MinSyncPeriod = ipt.MinSyncPeriod
	}
}

// minSyncPeriodSet reports whether a configuration file sets a minimum
// sync period: upstream's decoding turns an absent or 0s one (as kubeadm
// writes) into its default, which nftproxy replaces.
func minSyncPeriodSet(data []byte) bool {
	var periods struct {
		Mode     string                                  `json:"mode"`
		IPTables struct{ MinSyncPeriod metav1.Duration } `json:"iptables"`
		NFTables struct{ MinSyncPeriod metav1.Duration } `json:"nftables"`
	}
	if err := yaml.Unmarshal(data, &periods); err != nil {
		return false
	}
	// Without a mode the iptables section's value is inherited
	// (inheritIPTablesSettings); kubeadm's iptables value is ignored in
	// nftables mode, as upstream ignores it.
	return periods.NFTables.MinSyncPeriod.Duration > 0 ||
		(periods.Mode == "" || periods.Mode == "iptables") && periods.IPTables.MinSyncPeriod.Duration > 0
}
