package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/proxier/proxyhealth"
)

// writtenConfig runs nftproxy with args and --write-config-to and returns
// the file written and the options that wrote it.
func writtenConfig(t *testing.T, args ...string) ([]byte, *options) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	o, err := parseOptions(append(args, "--write-config-to="+path), testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), o); err != nil {
		t.Fatalf("run --write-config-to: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b, o
}

// TestWriteConfigDefaults: with no flags, --write-config-to writes what
// upstream kube-proxy v1.37 writes for nftables mode (as v1.36 did), byte for byte
// (testdata: kube-proxy --proxy-mode=nftables --write-config-to=FILE).
func TestWriteConfigDefaults(t *testing.T) {
	got, _ := writtenConfig(t)
	want, err := os.ReadFile(filepath.Join("testdata", "kube-proxy-write-config-nftables.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("written configuration\n%s\nwant (upstream's)\n%s", got, want)
	}
}

// upstreamComparable are flags that upstream kube-proxy and nftproxy both
// honour the same way in nftables mode.
var upstreamComparable = []string{
	"--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--masquerade-all", "--iptables-sync-period=1m",
	"--iptables-min-sync-period=2s", "--hostname-override=Node-A", "-v=3", "--vmodule=proxier=5",
	"--nodeport-addresses=10.0.0.0/8", "--healthz-bind-address=10.1.2.3:20256", "--conntrack-max-per-core=0",
	"--conntrack-udp-timeout=45s", "--feature-gates=ContextualLogging=false", "--kubeconfig=/k", "--profiling",
	"--detect-local-mode=NodeCIDR", "--oom-score-adj=-500", "--kube-api-qps=20", "--log-flush-frequency=3s",
	"--ipvs-scheduler=rr", "--bind-address=10.1.2.3",
}

// TestWriteConfigAsUpstream: the same flags make nftproxy and the upstream
// kube-proxy (built by e2e/tools/build.sh) write the same file.
func TestWriteConfigAsUpstream(t *testing.T) {
	args := append([]string{"--proxy-mode=nftables"}, upstreamComparable...)
	path := filepath.Join(t.TempDir(), "upstream.yaml")
	upstreamOutput(t, append(args, "--write-config-to="+path)...)
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := writtenConfig(t, args...)
	if string(got) != string(want) {
		t.Errorf("nftproxy wrote\n%s\nupstream kube-proxy wrote\n%s", got, want)
	}
}

// TestWriteConfigRoundTrip: the file --write-config-to writes, read back
// with --config, gives the same configuration.
func TestWriteConfigRoundTrip(t *testing.T) {
	own := []string{"--service-cidr=10.96.0.0/12", "--ip-families=ipv4"} // no config field: given both times
	args := append(append([]string{"--iptables-masquerade-bit=5", "--metrics-bind-address-override=10.0.0.7"},
		upstreamComparable...), own...)
	data, written := writtenConfig(t, args...)
	read, err := parseOptions(append([]string{"--config=c.yaml"}, own...), testEnv(map[string]string{"c.yaml": string(data)}))
	if err != nil {
		t.Fatal(err)
	}
	if read.LenientDecode != nil {
		t.Errorf("written file is not strictly decodable: %v", read.LenientDecode)
	}
	for _, o := range []*options{written, read} {
		o.WriteConfigTo, o.ConfigFile, o.ConfigData, o.FeatureGate, o.NoEffectFlags = "", "", nil, nil, nil
	}
	// The file holds one metricsBindAddress, the override's: the loopback
	// address served beside it comes with the override flag only.
	if written.MetricsLoopbackAddress != "127.0.0.1:10249" {
		t.Errorf("written: MetricsLoopbackAddress %q, want kube-proxy's default beside the override", written.MetricsLoopbackAddress)
	}
	written.MetricsLoopbackAddress = ""
	if !reflect.DeepEqual(written, read) {
		t.Errorf("read back:\n%+v\nwritten:\n%+v", read, written)
	}
	if read.Proxier.MasqueradeBit != 5 || read.MetricsBindAddress != "10.0.0.7:10249" || read.Proxier.NodeName != "node-a" {
		t.Errorf("read back masquerade bit %d, metrics %s, node %s", read.Proxier.MasqueradeBit, read.MetricsBindAddress, read.Proxier.NodeName)
	}
}

// TestConfigz: the metrics server's /configz serves the effective
// configuration under "kubeproxy.config.k8s.io", as upstream.
func TestConfigz(t *testing.T) {
	o, err := parseOptions([]string{"--hostname-override=worker-3", "--cluster-cidr=10.244.0.0/16",
		"--metrics-bind-address-override=10.0.0.7:9100"}, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := publishConfigz(o.Config); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(proxyhealth.MetricsMux(http.NotFoundHandler(), false))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/configz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /configz: %d, %v", resp.StatusCode, err)
	}
	var got kpconfig.KubeProxyConfiguration
	if err := yaml.UnmarshalStrict(body["kubeproxy.config.k8s.io"], &got); err != nil {
		t.Fatalf("configz entry: %v\n%s", err, body["kubeproxy.config.k8s.io"])
	}
	if got.Kind != "KubeProxyConfiguration" || got.APIVersion != "kubeproxy.config.k8s.io/v1alpha1" ||
		got.Mode != "nftables" || got.HostnameOverride != "worker-3" || got.ClusterCIDR != "10.244.0.0/16" ||
		got.MetricsBindAddress != "10.0.0.7:9100" || got.NFTables.SyncPeriod.Duration != defaultSyncPeriod {
		t.Errorf("configz = %+v", got)
	}
}
