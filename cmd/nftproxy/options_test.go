package main

import (
	"errors"
	"io"
	"io/fs"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// testEnv serves files from a map and reports hostname "Node-1 ".
func testEnv(files map[string]string) environment {
	return environment{
		readFile: func(name string) ([]byte, error) {
			if s, ok := files[name]; ok {
				return []byte(s), nil
			}
			return nil, fs.ErrNotExist
		},
		hostname: func() (string, error) { return "Node-1 ", nil },
		stdout:   io.Discard,
		stderr:   io.Discard,
	}
}

// defaultProxierConfig is what no flags and no file give.
func defaultProxierConfig() proxier.Config {
	return proxier.Config{
		NodeName:       "node-1",
		MasqueradeBit:  14,
		IPv4:           true,
		IPv6:           true,
		SyncPeriod:     30 * time.Second,
		FullSyncPeriod: time.Hour,
		SyncBusyShare:  0.1,
		MaxReaderWait:  10 * time.Second,
		ResyncPeriod:   15 * time.Minute,
		LocalDetect:    proxier.LocalDetect{Mode: proxier.DetectClusterCIDR},
		// nftables mode's default --nodeport-addresses=primary.
		NodePortPrimary: true,
	}
}

func prefixes(s ...string) []netip.Prefix {
	var ps []netip.Prefix
	for _, p := range s {
		ps = append(ps, netip.MustParsePrefix(p))
	}
	return ps
}

// kubeadmConfig is the config.conf kubeadm v1.36 writes into the
// kube-proxy ConfigMap (with kind's cluster CIDRs and mode nftables; the
// config API's fields did not change in v1.37, but kubeadm v1.37 writes
// "mode: iptables" where the mode was left unset: kubeadmDefaultConfig).
const kubeadmConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 1s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: nftables
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`

// kubeadmDefaultConfig is kubeadmConfig as kubeadm v1.37 writes it for a
// cluster that leaves the mode unset.
var kubeadmDefaultConfig = strings.Replace(kubeadmConfig, "\nmode: nftables\n", "\nmode: iptables\n", 1)

func TestParseOptionsProxierConfig(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		files map[string]string
		want  func(c *proxier.Config)
	}{
		{name: "defaults", want: func(*proxier.Config) {}},
		{
			name: "flags",
			args: []string{
				"--hostname-override=Worker-7", "--proxy-mode=nftables",
				"--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--service-cidr=10.96.0.0/12",
				"--masquerade-all", "--iptables-masquerade-bit=5",
				"--iptables-sync-period=1m", "--iptables-min-sync-period=0", "--ip-families=IPv4",
			},
			want: func(c *proxier.Config) {
				c.NodeName = "worker-7"
				c.ClusterCIDRs = prefixes("10.244.0.0/16", "fd00:10:244::/56")
				c.ServiceCIDRs = prefixes("10.96.0.0/12")
				c.MasqueradeAll = true
				c.MasqueradeBit = 5
				c.SyncPeriod, c.MinSyncPeriod = time.Minute, 0
				c.SyncBusyShare = 0 // a flag's 0 syncs on every change, as upstream
				c.IPv6 = false
			},
		},
		{
			name:  "nftproxy's full sync period, with or without --config",
			args:  []string{"--config=c.yaml", "--full-sync-period=5m"},
			files: map[string]string{"c.yaml": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"},
			want:  func(c *proxier.Config) { c.FullSyncPeriod = 5 * time.Minute },
		},
		{
			name:  "nftproxy's reader wait, with or without --config",
			args:  []string{"--config=c.yaml", "--max-reader-wait=0"},
			files: map[string]string{"c.yaml": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"},
			want:  func(c *proxier.Config) { c.MaxReaderWait = 0 },
		},
		{
			name: "non-canonical CIDR is masked",
			args: []string{"--cluster-cidr=10.244.1.7/16"},
			want: func(c *proxier.Config) { c.ClusterCIDRs = prefixes("10.244.0.0/16") },
		},
		{
			name:  "kubeadm config file",
			args:  []string{"--config=/var/lib/kube-proxy/config.conf", "--hostname-override=kind-worker"},
			files: map[string]string{"/var/lib/kube-proxy/config.conf": kubeadmConfig},
			want: func(c *proxier.Config) {
				c.NodeName = "kind-worker"
				c.ClusterCIDRs = prefixes("10.244.0.0/16", "fd00:10:244::/56")
			},
		},
		{
			// Its iptables section is read as for an empty mode: kubeadm's
			// minSyncPeriod 1s is the one kube-proxy used in that mode.
			name:  "kubeadm v1.37's config file for an unset mode (mode iptables)",
			args:  []string{"--config=/var/lib/kube-proxy/config.conf", "--hostname-override=kind-worker"},
			files: map[string]string{"/var/lib/kube-proxy/config.conf": kubeadmDefaultConfig},
			want: func(c *proxier.Config) {
				c.NodeName = "kind-worker"
				c.ClusterCIDRs = prefixes("10.244.0.0/16", "fd00:10:244::/56")
				c.MinSyncPeriod, c.SyncBusyShare = time.Second, 0
			},
		},
		{
			name: "file nftables section",
			args: []string{"--config=c.yaml"},
			files: map[string]string{"c.yaml": `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
nftables: {masqueradeBit: 3, masqueradeAll: true, syncPeriod: 10s, minSyncPeriod: 2s}
iptables: {masqueradeBit: 9, syncPeriod: 1h}
`},
			want: func(c *proxier.Config) {
				c.MasqueradeBit, c.MasqueradeAll = 3, true
				c.SyncPeriod, c.MinSyncPeriod = 10*time.Second, 2*time.Second
				c.SyncBusyShare = 0               // set: honoured as upstream
				c.MaxReaderWait = 8 * time.Second // the default, lowered to fit the sync period
			},
		},
		{
			name: "a minimum sync period flag is honoured",
			args: []string{"--iptables-min-sync-period=1s"},
			want: func(c *proxier.Config) { c.MinSyncPeriod, c.SyncBusyShare = time.Second, 0 },
		},
		{
			name: "file without mode uses the iptables section",
			args: []string{"--config=c.yaml"},
			files: map[string]string{"c.yaml": `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
iptables: {masqueradeBit: 9, masqueradeAll: true, syncPeriod: 1m}
`},
			want: func(c *proxier.Config) {
				c.MasqueradeBit, c.MasqueradeAll = 9, true
				c.SyncPeriod = time.Minute
			},
		},
		{
			name: "the file replaces the flags it has a field for",
			args: []string{"--config=c.yaml", "--iptables-sync-period=45s", "--cluster-cidr=10.0.0.0/8", "--masquerade-all"},
			files: map[string]string{"c.yaml": `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clusterCIDR: 192.168.0.0/16
hostnameOverride: from-file
nftables: {syncPeriod: 10s, masqueradeBit: 7}
`},
			want: func(c *proxier.Config) {
				c.NodeName = "from-file"
				c.ClusterCIDRs = prefixes("192.168.0.0/16")
				c.SyncPeriod = 10 * time.Second
				c.MasqueradeBit = 7
				c.MaxReaderWait = 9 * time.Second // the default, lowered to fit the sync period
			},
		},
		{
			name: "flags with no field in the file apply over it",
			args: []string{"--config=c.yaml", "--hostname-override=From-Flag ", "--service-cidr=10.96.0.0/12", "--ip-families=ipv4"},
			files: map[string]string{"c.yaml": `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
hostnameOverride: from-file
`},
			want: func(c *proxier.Config) {
				c.NodeName = "from-flag"
				c.ServiceCIDRs = prefixes("10.96.0.0/12")
				c.IPv6 = false
			},
		},
		{
			name: "the masquerade bit flag applies to nftables without a file",
			args: []string{"--iptables-masquerade-bit=3"},
			want: func(c *proxier.Config) { c.MasqueradeBit = 3 },
		},
		{
			name: "file with unknown fields is decoded leniently",
			args: []string{"--config=c.json"},
			files: map[string]string{"c.json": `{"apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
"kind": "KubeProxyConfiguration", "mode": "nftables", "someFutureField": 1,
"nftables": {"masqueradeBit": 2}}`},
			want: func(c *proxier.Config) { c.MasqueradeBit = 2 },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseOptions(tt.args, testEnv(tt.files))
			if err != nil {
				t.Fatalf("parseOptions: %v", err)
			}
			want := defaultProxierConfig()
			tt.want(&want)
			if !reflect.DeepEqual(o.Proxier, want) {
				t.Errorf("proxier.Config\n got %+v\nwant %+v", o.Proxier, want)
			}
		})
	}
}

func TestParseOptionsServerAndClient(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		files map[string]string
		check func(t *testing.T, o *options)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, o *options) {
				want := clientOptions{ContentType: "application/vnd.kubernetes.protobuf", QPS: 5, Burst: 10}
				expect(t, "Client", o.Client, want)
				expect(t, "HealthzBindAddress", o.HealthzBindAddress, "0.0.0.0:10256")
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "127.0.0.1:10249")
				expect(t, "ConfigSyncPeriod", o.ConfigSyncPeriod, 15*time.Minute)
				expect(t, "Conntrack.MaxPerCore", *o.Conntrack.MaxPerCore, int32(32768))
				expect(t, "Conntrack.TCPCloseWaitTimeout", o.Conntrack.TCPCloseWaitTimeout.Duration, time.Hour)
				expect(t, "IPFamiliesExplicit", o.IPFamiliesExplicit, false)
				expect(t, "OwnTables", o.OwnTables, true)
				expect(t, "EnableProfiling", o.EnableProfiling, false)
				expect(t, "OOMScoreAdj", o.OOMScoreAdj, -999)
				expect(t, "Logging.Format", o.Config.Logging.Format, "text")
				expect(t, "NoEffectFlags", o.NoEffectFlags, map[string]string{})
			},
		},
		{
			name: "client and server flags",
			args: []string{
				"--kubeconfig=/k", "--master=https://10.0.0.1:6443", "--kube-api-qps=50", "--kube-api-burst=100",
				"--kube-api-content-type=application/json", "--config-sync-period=1m",
				"--healthz-bind-address=[::]:1234", "--metrics-bind-address=", "--bind-address-hard-fail",
				"--nodeport-addresses=10.0.0.0/8,fd00::/64", "--conntrack-max-per-core=0",
				"--conntrack-tcp-timeout-close-wait=30m", "--feature-gates=LoggingAlphaOptions=true,ContextualLogging=false",
				"-v=4", "--vmodule=sync*=5", "--cleanup", "--ip-families=ipv6", "--profiling", "--oom-score-adj=-500",
				"--own-tables=false",
			},
			check: func(t *testing.T, o *options) {
				want := clientOptions{Kubeconfig: "/k", Master: "https://10.0.0.1:6443",
					ContentType: "application/json", QPS: 50, Burst: 100}
				expect(t, "Client", o.Client, want)
				expect(t, "ConfigSyncPeriod", o.ConfigSyncPeriod, time.Minute)
				expect(t, "HealthzBindAddress", o.HealthzBindAddress, "[::]:1234")
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "")
				expect(t, "BindAddressHardFail", o.BindAddressHardFail, true)
				expect(t, "EnableProfiling", o.EnableProfiling, true)
				expect(t, "NodePortAddresses", o.NodePortAddresses, []string{"10.0.0.0/8", "fd00::/64"})
				expect(t, "Conntrack.MaxPerCore", *o.Conntrack.MaxPerCore, int32(0))
				expect(t, "Conntrack.TCPCloseWaitTimeout", o.Conntrack.TCPCloseWaitTimeout.Duration, 30*time.Minute)
				expect(t, "FeatureGates", o.Config.FeatureGates, map[string]bool{"LoggingAlphaOptions": true, "ContextualLogging": false})
				expect(t, "LoggingAlphaOptions", o.FeatureGate.Enabled("LoggingAlphaOptions"), true)
				expect(t, "Verbosity", o.Config.Logging.Verbosity, logsapi.VerbosityLevel(4))
				expect(t, "VModule", o.Config.Logging.VModule, logsapi.VModuleConfiguration{{FilePattern: "sync*", Verbosity: 5}})
				expect(t, "Cleanup", o.Cleanup, true)
				expect(t, "OwnTables", o.OwnTables, false)
				expect(t, "IPFamiliesExplicit", o.IPFamiliesExplicit, true)
				expect(t, "OOMScoreAdj", o.OOMScoreAdj, -500)
			},
		},
		{
			name:  "kubeadm config file",
			args:  []string{"--config=k"},
			files: map[string]string{"k": kubeadmConfig},
			check: func(t *testing.T, o *options) {
				want := clientOptions{Kubeconfig: "/var/lib/kube-proxy/kubeconfig.conf",
					ContentType: "application/vnd.kubernetes.protobuf", QPS: 5, Burst: 10}
				expect(t, "Client", o.Client, want)
				expect(t, "HealthzBindAddress", o.HealthzBindAddress, "0.0.0.0:10256")
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "127.0.0.1:10249")
				expect(t, "ConfigSyncPeriod", o.ConfigSyncPeriod, 15*time.Minute)
				expect(t, "IgnoredByConfig", o.IgnoredByConfig, []string(nil))
				expect(t, "ConfigData", string(o.ConfigData), kubeadmConfig)
			},
		},
		{
			name: "bare IP gets the default port",
			args: []string{"--healthz-bind-address=10.1.2.3", "--metrics-bind-address=::1"},
			check: func(t *testing.T, o *options) {
				expect(t, "HealthzBindAddress", o.HealthzBindAddress, "10.1.2.3:10256")
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "[::1]:10249")
			},
		},
		{
			name: "deprecated port flags complete a bare IP or disable, as upstream",
			args: []string{"--healthz-port=0", "--metrics-port=9999", "--metrics-bind-address=10.1.2.3"},
			check: func(t *testing.T, o *options) {
				expect(t, "HealthzBindAddress", o.HealthzBindAddress, "")
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "10.1.2.3:9999")
				expect(t, "DeprecatedFlags", o.DeprecatedFlags, []string{"healthz-port", "metrics-port"})
			},
		},
		{
			name: "deprecated port flag leaves an address with a port alone, as upstream",
			args: []string{"--metrics-port=9999"},
			check: func(t *testing.T, o *options) {
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "127.0.0.1:10249")
				if _, ok := o.NoEffectFlags["metrics-port"]; !ok {
					t.Errorf("NoEffectFlags = %v, want metrics-port", o.NoEffectFlags)
				}
			},
		},
		{
			name: "metrics address override wins over the flag and the file",
			args: []string{"--config=c.yaml", "--metrics-bind-address-override=10.0.0.7", "--metrics-bind-address=0.0.0.0:1"},
			files: map[string]string{"c.yaml": `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
metricsBindAddress: 127.0.0.1:20249
`},
			check: func(t *testing.T, o *options) {
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "10.0.0.7:10249")
				expect(t, "Config.MetricsBindAddress", o.Config.MetricsBindAddress, "10.0.0.7:10249")
				expect(t, "IgnoredByConfig", o.IgnoredByConfig, []string{"metrics-bind-address"})
				// The file's loopback address stays served (upstream's e2e
				// "should check kube-proxy urls" curls localhost:10249).
				expect(t, "MetricsLoopbackAddress", o.MetricsLoopbackAddress, "127.0.0.1:20249")
			},
		},
		{
			name: "metrics address override with a port; kube-proxy's default loopback address stays",
			args: []string{"--metrics-bind-address-override=[fd00::7]:9100"},
			check: func(t *testing.T, o *options) {
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "[fd00::7]:9100")
				expect(t, "MetricsLoopbackAddress", o.MetricsLoopbackAddress, "127.0.0.1:10249")
			},
		},
		{
			name: "metrics address override beside all addresses: no second server",
			args: []string{"--metrics-bind-address=0.0.0.0:10249", "--metrics-bind-address-override=10.0.0.7"},
			check: func(t *testing.T, o *options) {
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "10.0.0.7:10249")
				expect(t, "MetricsLoopbackAddress", o.MetricsLoopbackAddress, "")
			},
		},
		{
			name: "metrics address override to the loopback address itself: no second server",
			args: []string{"--metrics-bind-address-override=127.0.0.1:10249"},
			check: func(t *testing.T, o *options) {
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "127.0.0.1:10249")
				expect(t, "MetricsLoopbackAddress", o.MetricsLoopbackAddress, "")
			},
		},
		{
			name: "file: client connection and logging; logging flags win, others are ignored",
			args: []string{"--config=c.yaml", "-v=2", "--vmodule=proxier=4", "--master=https://m:6443",
				"--kube-api-qps=99", "--feature-gates=LoggingAlphaOptions=true", "--healthz-port=0"},
			files: map[string]string{"c.yaml": `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf, qps: 20, burst: 30}
logging: {verbosity: 6, vmodule: [{filePattern: watch, verbosity: 3}]}
healthzBindAddress: 0.0.0.0:20256
enableProfiling: true
featureGates: {ContextualLogging: false}
`},
			check: func(t *testing.T, o *options) {
				want := clientOptions{Kubeconfig: "/var/lib/kube-proxy/kubeconfig.conf", Master: "https://m:6443",
					ContentType: "application/vnd.kubernetes.protobuf", QPS: 20, Burst: 30}
				expect(t, "Client", o.Client, want)
				expect(t, "Verbosity", o.Config.Logging.Verbosity, logsapi.VerbosityLevel(2))
				expect(t, "VModule", o.Config.Logging.VModule, logsapi.VModuleConfiguration{
					{FilePattern: "proxier", Verbosity: 4}, {FilePattern: "watch", Verbosity: 3}})
				expect(t, "HealthzBindAddress", o.HealthzBindAddress, "0.0.0.0:20256")
				expect(t, "EnableProfiling", o.EnableProfiling, true)
				expect(t, "FeatureGates", o.Config.FeatureGates, map[string]bool{"ContextualLogging": false})
				expect(t, "IgnoredByConfig", o.IgnoredByConfig, []string{"feature-gates", "healthz-port", "kube-api-qps"})
			},
		},
		{
			name: "IPv6 bind address gives IPv6 default servers, as upstream",
			args: []string{"--config=c.yaml"},
			files: map[string]string{"c.yaml": `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: "::"
`},
			check: func(t *testing.T, o *options) {
				expect(t, "HealthzBindAddress", o.HealthzBindAddress, "[::]:10256")
				expect(t, "MetricsBindAddress", o.MetricsBindAddress, "[::1]:10249")
			},
		},
		{
			name: "ignored upstream flags are accepted and reported",
			args: []string{"--oom-score-adj=-999", "--ipvs_scheduler=rr", "--bind-address=0.0.0.0", "--ipvs-strict-arp"},
			check: func(t *testing.T, o *options) {
				got := slices.Sorted(maps.Keys(o.NoEffectFlags))
				expect(t, "NoEffectFlags", got, []string{"bind-address", "ipvs-scheduler", "ipvs-strict-arp"})
			},
		},
		{
			name:  "unknown fields in the file are reported",
			args:  []string{"--config=c"},
			files: map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfutureField: 1\n"},
			check: func(t *testing.T, o *options) {
				if o.LenientDecode == nil || !strings.Contains(o.LenientDecode.Error(), "futureField") {
					t.Errorf("LenientDecode = %v, want the unknown field", o.LenientDecode)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseOptions(tt.args, testEnv(tt.files))
			if err != nil {
				t.Fatalf("parseOptions: %v", err)
			}
			tt.check(t, o)
		})
	}
}

// TestFeatureGatesOfTheRelease: the gates kube-proxy v1.37 added are
// accepted, from the command line and the config file, with the state
// upstream gives them (before, "unrecognized feature gate:
// KubeProxyNFTablesLocalhostNodePorts" stopped nftproxy at start). A later
// release that graduates or removes one of them fails this test: follow it.
func TestFeatureGatesOfTheRelease(t *testing.T) {
	gates := "KubeProxyNFTablesLocalhostNodePorts=true,NFTablesNetlink=false,KubeProxyIPVS=false,NativeHistograms=false"
	for _, tc := range []struct {
		name  string
		args  []string
		files map[string]string
	}{
		{"flag", []string{"--feature-gates=" + gates}, nil},
		{"config file", []string{"--config=c"}, map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfeatureGates:\n  " +
			strings.ReplaceAll(strings.ReplaceAll(gates, "=", ": "), ",", "\n  ") + "\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseOptions(tc.args, testEnv(tc.files))
			if err != nil {
				t.Fatal(err)
			}
			for gate, want := range map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": true, "NFTablesNetlink": false, "KubeProxyIPVS": false, "NativeHistograms": false} {
				if got := o.FeatureGate.Enabled(featuregate.Feature(gate)); got != want {
					t.Errorf("%s = %v, want %v", gate, got, want)
				}
			}
		})
	}
	defaults, err := parseOptions(nil, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	for gate, want := range map[string]bool{"KubeProxyNFTablesLocalhostNodePorts": false, "NFTablesNetlink": true, "KubeProxyIPVS": true, "NativeHistograms": true} {
		if got := defaults.FeatureGate.Enabled(featuregate.Feature(gate)); got != want {
			t.Errorf("default %s = %v, want %v (v1.37's default)", gate, got, want)
		}
	}
}

// TestConfigFileIPTablesMode: the "mode: iptables" kubeadm v1.37 writes
// for an unset mode is read as nftables, noted for the startup log and
// completed to "nftables" for /configz; --proxy-mode=iptables, an explicit
// choice, and IPVS anywhere are refused.
func TestConfigFileIPTablesMode(t *testing.T) {
	file := func(mode string) map[string]string {
		return map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: " + mode + "\n"}
	}
	for _, tc := range []struct {
		name    string
		args    []string
		files   map[string]string
		wantErr string
		noted   bool
	}{
		{name: "kubeadm's iptables in the file", args: []string{"--config=c"}, files: file("iptables"), noted: true},
		{name: "nftables in the file", args: []string{"--config=c"}, files: file("nftables")},
		{name: "empty in the file", args: []string{"--config=c"}, files: file(`""`)},
		{name: "iptables flag", args: []string{"--proxy-mode=iptables"}, wantErr: `--proxy-mode / mode "iptables": nftproxy only implements the nftables mode`},
		{name: "ipvs in the file", args: []string{"--config=c"}, files: file("ipvs"), wantErr: `mode "ipvs"`},
		{name: "iptables flag beside a file: the file wins, as upstream", args: []string{"--config=c", "--proxy-mode=iptables"}, files: file("nftables")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseOptions(tc.args, testEnv(tc.files))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.ConfigFileIPTablesMode != tc.noted {
				t.Errorf("ConfigFileIPTablesMode %v, want %v", o.ConfigFileIPTablesMode, tc.noted)
			}
			if o.Config.Mode != "nftables" {
				t.Errorf("effective mode %q, want nftables (/configz, --write-config-to)", o.Config.Mode)
			}
		})
	}
}

func TestParseOptionsErrors(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		files map[string]string
		want  []string // substrings of the error
	}{
		{name: "iptables mode", args: []string{"--proxy-mode=iptables"},
			want: []string{`--proxy-mode / mode "iptables": nftproxy only implements the nftables mode`}},
		{name: "ipvs mode from file", args: []string{"--config=c"},
			files: map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"},
			want:  []string{`mode "ipvs"`}},
		{name: "detect-local-mode BridgeInterface without an interface", args: []string{"--detect-local-mode=BridgeInterface"},
			want: []string{"--pod-bridge-interface"}},
		{name: "detect-local-mode InterfaceNamePrefix without a prefix", args: []string{"--detect-local-mode=InterfaceNamePrefix"},
			want: []string{"--pod-interface-name-prefix"}},
		{name: "detect-local-mode typo", args: []string{"--detect-local-mode=Cluster"},
			want: []string{`"Cluster": unknown mode`}},
		{name: "bad cluster CIDR", args: []string{"--cluster-cidr=10.0.0.0/33"},
			want: []string{`--cluster-cidr / clusterCIDR "10.0.0.0/33"`}},
		{name: "two IPv4 cluster CIDRs", args: []string{"--cluster-cidr=10.0.0.0/16,10.1.0.0/16"},
			want: []string{"at most one CIDR per IP family"}},
		{name: "bad service CIDR", args: []string{"--service-cidr=10.96.0.0"},
			want: []string{`--service-cidr "10.96.0.0"`}},
		{name: "masquerade bit", args: []string{"--iptables-masquerade-bit=32"},
			want: []string{"nftables.masqueradeBit 32: must be within [0, 31]"}},
		{name: "sync periods", args: []string{"--iptables-sync-period=1s", "--iptables-min-sync-period=2s"},
			want: []string{"must not exceed the sync period"}},
		{name: "negative full sync period", args: []string{"--full-sync-period=-1s"},
			want: []string{"--full-sync-period -1s: must not be negative"}},
		{name: "negative reader wait", args: []string{"--max-reader-wait=-1s"},
			want: []string{"--max-reader-wait -1s: must not be negative"}},
		{name: "a reader wait that would turn /healthz 503", args: []string{"--max-reader-wait=30s"},
			want: []string{"--max-reader-wait 30s: at most 29s with the sync period 30s (--iptables-sync-period / nftables.syncPeriod): /healthz fails"}},
		{name: "a reader wait longer than the sync period leaves", args: []string{"--max-reader-wait=5s", "--iptables-sync-period=6s", "--iptables-min-sync-period=2s"},
			want: []string{"--max-reader-wait 5s: at most 4s with the sync period 6s"}},
		{name: "zero sync period", args: []string{"--iptables-sync-period=0"},
			want: []string{"nftables.syncPeriod 0s: must be greater than 0"}},
		{name: "ip families", args: []string{"--ip-families=ipv4,ip7"},
			want: []string{`"ip7" is not ipv4 or ipv6`}},
		{name: "healthz address", args: []string{"--healthz-bind-address=localhost:10256"},
			want: []string{`--healthz-bind-address / healthzBindAddress "localhost:10256": "localhost" is not an IP address`}},
		{name: "metrics port", args: []string{"--metrics-bind-address=127.0.0.1:99999"},
			want: []string{"port must be 1-65535"}},
		{name: "feature gate value", args: []string{"--feature-gates=LoggingAlphaOptions=maybe"},
			want: []string{`"--feature-gates" flag: invalid value of LoggingAlphaOptions: maybe`}},
		{name: "unknown feature gate", args: []string{"--feature-gates=NoSuchGate=true"},
			want: []string{"--feature-gates / featureGates: unrecognized feature gate: NoSuchGate"}},
		{name: "unknown feature gate in the file", args: []string{"--config=c"},
			files: map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfeatureGates: {NoSuchGate: true}\n"},
			want:  []string{"--feature-gates / featureGates: unrecognized feature gate: NoSuchGate"}},
		{name: "feature gate kube-proxy v1.37 removed", args: []string{"--feature-gates=SidecarContainers=true"},
			want: []string{"--feature-gates / featureGates: unrecognized feature gate: SidecarContainers"}},
		{name: "feature gate v1.37 locked", args: []string{"--config=c"},
			files: map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nfeatureGates: {RelaxedServiceNameValidation: false}\n"},
			want:  []string{"cannot set feature gate RelaxedServiceNameValidation to false, feature is locked to true"}},
		{name: "locked feature gate", args: []string{"--feature-gates=MultiCIDRServiceAllocator=false"},
			want: []string{"cannot set feature gate MultiCIDRServiceAllocator to false, feature is locked to true"}},
		{name: "bind address", args: []string{"--bind-address=node-1"},
			want: []string{`--bind-address / bindAddress "node-1": not an IP address`}},
		{name: "metrics address override", args: []string{"--metrics-bind-address-override=node-ip"},
			want: []string{`--metrics-bind-address-override "node-ip": want IP:port`}},
		{name: "oom score", args: []string{"--oom-score-adj=-1001"},
			want: []string{"--oom-score-adj / oomScoreAdj -1001: must be within [-1000, 1000]"}},
		{name: "conntrack", args: []string{"--conntrack-min=-1", "--conntrack-udp-timeout=-1s"},
			want: []string{"--conntrack-min / conntrack.min: must be greater", "--conntrack-udp-timeout / conntrack.udpTimeout: must be greater"}},
		{name: "empty hostname override", args: []string{"--hostname-override= "},
			want: []string{"--hostname-override: empty hostname-override is invalid"}},
		{name: "unknown logging format", args: []string{"--logging-format=xml"},
			want: []string{`--logging-format / logging.format: Invalid value: "xml": Unsupported log format`}},
		{name: "unknown logging format in the file", args: []string{"--config=c"},
			files: map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging: {format: xml}\n"},
			want:  []string{`logging.format: Invalid value: "xml"`}},
		{name: "vmodule with json", args: []string{"--logging-format=json", "--vmodule=a=1"},
			want: []string{"--vmodule / logging.vmodule: Forbidden: Only supported for text log format"}},
		{name: "alpha logging option without its gate", args: []string{"--log-text-split-stream"},
			want: []string{"--log-text-split-stream / logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"}},
		{name: "flush frequency", args: []string{"--log-flush-frequency=0"},
			want: []string{"--log-flush-frequency / logging.flushFrequency"}},
		{name: "nodeport addresses", args: []string{"--nodeport-addresses=primary,10.0.0.0/33"},
			want: []string{`nodePortAddresses[1] "10.0.0.0/33": neither a CIDR nor one of the keywords primary, localhost, all`}},
		{name: "unknown flag", args: []string{"--no-such-flag"},
			want: []string{"unknown flag: --no-such-flag"}},
		{name: "stray argument", args: []string{"run"},
			want: []string{`unexpected arguments ["run"]`}},
		{name: "missing config file", args: []string{"--config=/nope"},
			want: []string{"--config: file does not exist"}},
		{name: "wrong kind", args: []string{"--config=c"},
			files: map[string]string{"c": "apiVersion: v1\nkind: ConfigMap\n"},
			want:  []string{`want apiVersion "kubeproxy.config.k8s.io/v1alpha1" kind "KubeProxyConfiguration"`}},
		{name: "not YAML", args: []string{"--config=c"},
			files: map[string]string{"c": "{{{"},
			want:  []string{"--config c: decode:"}},
		{name: "all problems at once", args: []string{"--proxy-mode=ipvs", "--iptables-masquerade-bit=-1", "--kube-api-qps=-1"},
			want: []string{`mode "ipvs"`, "masqueradeBit -1", "clientConnection.qps -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseOptions(tt.args, testEnv(tt.files))
			if err == nil {
				t.Fatal("parseOptions succeeded, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nlacks %q", err, w)
				}
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out strings.Builder
	env := testEnv(nil)
	env.stdout = &out
	_, err := parseOptions([]string{"--help"}, env)
	if !errors.Is(err, pflag.ErrHelp) {
		t.Fatalf("err = %v, want pflag.ErrHelp", err)
	}
	for _, flag := range []string{"--config", "--iptables-sync-period", "--service-cidr", "--ip-families",
		"--metrics-bind-address-override", "--logging-format", "--version", "No effect in nftproxy: IPVS mode only",
		"--remove-kube-proxy-tables"} {
		if !strings.Contains(out.String(), flag) {
			t.Errorf("usage lacks %s", flag)
		}
	}
}

// TestRemoveKubeProxyTables: off by default; the flag turns it on, with or
// without a config file (which has no such field).
func TestRemoveKubeProxyTables(t *testing.T) {
	env := testEnv(map[string]string{"c.yaml": kubeadmConfig})
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--remove-kube-proxy-tables"}, true},
		{[]string{"--config=c.yaml", "--remove-kube-proxy-tables"}, true},
		{[]string{"--config=c.yaml"}, false},
	} {
		o, err := parseOptions(tt.args, env)
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if o.RemoveKubeProxyTables != tt.want {
			t.Errorf("%q: RemoveKubeProxyTables = %v, want %v", tt.args, o.RemoveKubeProxyTables, tt.want)
		}
	}
}

// TestServiceTrafficMetrics: none by default; the flag alone asks for
// services, a value for endpoints; with or without a config file (which
// has no such field); any other value is refused.
func TestServiceTrafficMetrics(t *testing.T) {
	env := testEnv(map[string]string{"c.yaml": kubeadmConfig})
	for _, tt := range []struct {
		args []string
		want ruleset.Counters
	}{
		{nil, ruleset.CountNone},
		{[]string{"--service-traffic-metrics"}, ruleset.CountServices},
		{[]string{"--service-traffic-metrics=endpoints"}, ruleset.CountEndpoints},
		{[]string{"--service-traffic-metrics=none"}, ruleset.CountNone},
		{[]string{"--config=c.yaml", "--service-traffic-metrics=services"}, ruleset.CountServices},
	} {
		o, err := parseOptions(tt.args, env)
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if o.Proxier.TrafficCounters != tt.want {
			t.Errorf("%q: TrafficCounters = %v, want %v", tt.args, o.Proxier.TrafficCounters, tt.want)
		}
	}
	if _, err := parseOptions([]string{"--service-traffic-metrics=packets"}, env); err == nil ||
		!strings.Contains(err.Error(), "--service-traffic-metrics") {
		t.Errorf("--service-traffic-metrics=packets: err = %v, want it refused", err)
	}
}

func TestNodeNameFromHostname(t *testing.T) {
	env := testEnv(nil)
	env.hostname = func() (string, error) { return "", errors.New("no uts") }
	if _, err := parseOptions(nil, env); err == nil || !strings.Contains(err.Error(), "no uts") {
		t.Errorf("err = %v, want the hostname error", err)
	}
	if o, err := parseOptions([]string{"--hostname-override=n"}, env); err != nil || o.Proxier.NodeName != "n" {
		t.Errorf("with override: %v, %v", o, err)
	}
}

func expect[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

// TestNodePortAddressKeywords: --nodeport-addresses (and the file's
// nodePortAddresses) take CIDRs and the keywords primary, localhost and
// all, mixed, each keyword once; localhost and all expand to both
// families' CIDRs, primary stays a flag, and /configz (o.Config) keeps
// the list as given.
func TestNodePortAddressKeywords(t *testing.T) {
	tests := []struct {
		name    string
		list    string // "-": the flag not given
		primary bool
		cidrs   []netip.Prefix
		err     string
	}{
		{name: "default", list: "-", primary: true},
		{name: "primary", list: "primary", primary: true},
		{name: "localhost", list: "localhost", cidrs: prefixes("127.0.0.0/8", "::1/128")},
		{name: "all", list: "all", cidrs: prefixes("0.0.0.0/0", "::/0")},
		{name: "primary and localhost", list: "primary,localhost", primary: true, cidrs: prefixes("127.0.0.0/8", "::1/128")},
		{name: "keywords in any order, with CIDRs", list: "10.0.0.0/8,localhost,all,fd00::/64,primary", primary: true,
			cidrs: prefixes("10.0.0.0/8", "127.0.0.0/8", "::1/128", "0.0.0.0/0", "::/0", "fd00::/64")},
		{name: "a CIDR's host bits are masked", list: "127.0.0.1/8,10.1.2.3/16", cidrs: prefixes("127.0.0.0/8", "10.1.0.0/16")},
		{name: "a CIDR may repeat", list: "10.0.0.0/8,10.0.0.0/8", cidrs: prefixes("10.0.0.0/8", "10.0.0.0/8")},
		{name: "a keyword may not", list: "localhost,primary,localhost",
			err: `--nodeport-addresses / nodePortAddresses[2] "localhost": keyword given twice`},
		{name: "primary twice", list: "primary,primary", err: `nodePortAddresses[1] "primary": keyword given twice`},
		{name: "unknown keyword", list: "loopback", err: `nodePortAddresses[0] "loopback": neither a CIDR nor one of the keywords primary, localhost, all`},
		{name: "keywords are case sensitive", list: "Primary", err: `nodePortAddresses[0] "Primary": neither a CIDR`},
		{name: "a bare address is no CIDR", list: "10.0.0.1", err: `nodePortAddresses[0] "10.0.0.1": neither a CIDR`},
		{name: "every problem is reported", list: "all,x,all",
			err: `nodePortAddresses[1] "x": neither a CIDR nor one of the keywords primary, localhost, all` + "\n" +
				`--nodeport-addresses / nodePortAddresses[2] "all": keyword given twice`},
	}
	for _, tt := range tests {
		for _, from := range []string{"flag", "file"} {
			t.Run(tt.name+"/"+from, func(t *testing.T) {
				var args []string
				files := map[string]string{}
				switch {
				case tt.list == "-":
				case from == "flag":
					args = []string{"--nodeport-addresses=" + tt.list}
				default:
					args = []string{"--config=c"}
					files["c"] = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n" +
						"nodePortAddresses: [" + tt.list + "]\n"
				}
				o, err := parseOptions(args, testEnv(files))
				if tt.err != "" {
					if err == nil || !strings.Contains(err.Error(), tt.err) {
						t.Fatalf("error %v, want %q", err, tt.err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				expect(t, "NodePortPrimary", o.Proxier.NodePortPrimary, tt.primary)
				expect(t, "NodePortCIDRs", o.Proxier.NodePortCIDRs, tt.cidrs)
				given := []string{"primary"} // nftables mode's default, as /configz shows it
				if tt.list != "-" {
					given = strings.Split(tt.list, ",")
				}
				expect(t, "Config.NodePortAddresses", o.Config.NodePortAddresses, given)
			})
		}
	}
}

// TestLocalhostNodePortsGate: kube-proxy 1.37's gates are accepted, and
// KubeProxyNFTablesLocalhostNodePorts (default off), from the flag or the
// file, reaches the proxier's configuration; the proxies are made for the
// families whose loopback nodePortAddresses names.
func TestLocalhostNodePortsGate(t *testing.T) {
	file := func(gates string) map[string]string {
		return map[string]string{"c": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n" +
			"featureGates: {" + gates + "}\nnodePortAddresses: [primary, 127.0.0.0/8]\n"}
	}
	for _, tc := range []struct {
		name  string
		args  []string
		files map[string]string
		on    bool
	}{
		{name: "default off"},
		{name: "flag", args: []string{"--feature-gates=KubeProxyNFTablesLocalhostNodePorts=true,NFTablesNetlink=false"}, on: true},
		{name: "flag off", args: []string{"--feature-gates=KubeProxyNFTablesLocalhostNodePorts=false"}},
		{name: "file", args: []string{"--config=c"}, files: file("KubeProxyNFTablesLocalhostNodePorts: true"), on: true},
		{name: "file without", args: []string{"--config=c"}, files: file("NFTablesNetlink: true")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseOptions(tc.args, testEnv(tc.files))
			if err != nil {
				t.Fatal(err)
			}
			expect(t, "LocalhostNodePorts", o.Proxier.LocalhostNodePorts, tc.on)
			var families []string
			for f := range localhostProxies(o.Proxier) {
				families = append(families, f.String())
			}
			if tc.files != nil && tc.on {
				expect(t, "proxied families", families, []string{"ip"})
			} else {
				expect(t, "proxied families", families, []string(nil))
			}
		})
	}
}

// FuzzNodePortAddresses: any list is either refused or expands to valid
// CIDRs, two per localhost and all keyword and one per CIDR entry, and
// to primary exactly when it names it.
func FuzzNodePortAddresses(f *testing.F) {
	for _, s := range []string{"primary", "localhost,all", "primary,10.0.0.0/8,::1/128", "all,all", "127.0.0.1/8", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		list := strings.Split(s, ",")
		if err := checkNodePortAddresses(list); err != nil {
			return
		}
		primary, cidrs := expandNodePortAddresses(list)
		want := 0
		for _, a := range list {
			switch a {
			case nodePortLocalhost, nodePortAll:
				want += 2
			case nodePortPrimary:
			default:
				want++
			}
		}
		if primary != slices.Contains(list, nodePortPrimary) || len(cidrs) != want {
			t.Fatalf("%q: primary %v, %d CIDRs %v, want %d", s, primary, len(cidrs), cidrs, want)
		}
		for _, p := range cidrs {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("%q: CIDR %v", s, p)
			}
		}
	})
}
