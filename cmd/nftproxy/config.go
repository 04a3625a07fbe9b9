package main

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// Defaults of kube-proxy v1.36 (pkg/proxy/apis/config/v1alpha1/defaults.go)
// for the fields nftproxy reads.
const (
	defaultHealthzBindAddress  = "0.0.0.0:10256"
	defaultMetricsBindAddress  = "127.0.0.1:10249"
	defaultHealthzPort         = 10256
	defaultMetricsPort         = 10249
	defaultSyncPeriod          = 30 * time.Second
	defaultMinSyncPeriod       = time.Second
	defaultMasqueradeBit       = 14
	defaultConfigSyncPeriod    = 15 * time.Minute
	defaultContentType         = "application/vnd.kubernetes.protobuf"
	defaultQPS                 = 5
	defaultBurst               = 10
	defaultConntrackMaxPerCore = 32 * 1024
	defaultConntrackMin        = 128 * 1024
	defaultTCPEstablished      = 24 * time.Hour
	defaultTCPCloseWait        = time.Hour
	// defaultFullSyncPeriod is how often the whole ruleset is checked against the kernel
	// even without failures (upstream: hourly); no flag sets it.
	defaultFullSyncPeriod = time.Hour
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

// setDefaults fills what the file left unset, as upstream's defaulting does,
// so that the flags (whose defaults are taken from cfg) show the values that
// will be used.
func setDefaults(cfg *kpconfig.KubeProxyConfiguration) {
	setString(&cfg.HealthzBindAddress, defaultHealthzBindAddress)
	setString(&cfg.MetricsBindAddress, defaultMetricsBindAddress)
	setDuration(&cfg.NFTables.SyncPeriod, defaultSyncPeriod)
	setDuration(&cfg.NFTables.MinSyncPeriod, defaultMinSyncPeriod)
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
// a file written for a newer kube-proxy keeps working.
func parseConfigFile(data []byte) (*kpconfig.KubeProxyConfiguration, error) {
	cfg := &kpconfig.KubeProxyConfiguration{}
	if strictErr := yaml.UnmarshalStrict(data, cfg); strictErr != nil {
		cfg = &kpconfig.KubeProxyConfiguration{}
		if err := yaml.Unmarshal(data, cfg); err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		klog.InfoS("Using lenient decoding as strict decoding failed", "err", strictErr)
	}
	if cfg.APIVersion != configAPIVersion || cfg.Kind != configKind {
		return nil, fmt.Errorf("apiVersion %q kind %q: want apiVersion %q kind %q",
			cfg.APIVersion, cfg.Kind, configAPIVersion, configKind)
	}
	if cfg.Mode == "" {
		inheritIPTablesSettings(cfg)
	}
	setDefaults(cfg)
	return cfg, nil
}

// inheritIPTablesSettings copies the iptables section into the nftables
// fields the file leaves unset. It applies when mode is empty, which
// upstream reads as "iptables": such a file keeps its settings in the
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
