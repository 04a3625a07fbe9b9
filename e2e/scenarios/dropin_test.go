package scenarios

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// configMapVolume lays a directory out as kubelet lays out a ConfigMap
// volume: each version of the data in a timestamped directory, "..data" a
// symlink to the current one, and each key a symlink through "..data".
// An update writes a new version and renames a new symlink over "..data".
type configMapVolume struct {
	t   *testing.T
	dir string
}

func (v configMapVolume) update(version string, data map[string]string) {
	v.t.Helper()
	if err := os.Mkdir(filepath.Join(v.dir, version), 0o755); err != nil {
		v.t.Fatal(err)
	}
	for key, value := range data {
		if err := os.WriteFile(filepath.Join(v.dir, version, key), []byte(value), 0o644); err != nil {
			v.t.Fatal(err)
		}
		link := filepath.Join(v.dir, key)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", key), link); err != nil {
				v.t.Fatal(err)
			}
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(version, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
}

func kubeProxyConfig(kubeconfig, clusterCIDR string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: %s
clusterCIDR: %s
nftables:
  minSyncPeriod: 0s
`, kubeconfig, clusterCIDR)
}

// TestDropInConfigFile: nftproxy started as kubeadm's DaemonSet starts
// kube-proxy (the configuration in a ConfigMap volume, --hostname-override)
// plus --metrics-bind-address-override with the node's IP: a flag the file
// has a field for is ignored and logged, the metrics server answers on the
// node's IP with kubernetes_build_info and the effective configuration on
// /configz and on the file's loopback address too, and an update of the ConfigMap makes nftproxy exit with status
// 1, so that kubelet restarts it with the new configuration.
func TestDropInConfigFile(t *testing.T) {
	testbed.RequirePrivileges(t)
	bin := testbed.GoBuild(t, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	bed := testbed.Start(t, testbed.Options{})
	n := bed.AddNode("n1")
	volume := configMapVolume{t: t, dir: t.TempDir()}
	volume.update("..2026_11_24_01", map[string]string{"config.conf": kubeProxyConfig(bed.ProxyKubeconfig, clusterCIDRs)})
	p := n.Start(bin, "--config", filepath.Join(volume.dir, "config.conf"), "--hostname-override", n.Name,
		"--metrics-bind-address-override", n.IPv4.String(), "--kube-api-qps=30", "--v", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.WaitForLog(ctx, "Synced"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Log(), `"Flag ignored because --config is given" flag="kube-api-qps"`) {
		t.Errorf("the ignored --kube-api-qps is not logged:\n%s", p.Log())
	}
	base := fmt.Sprintf("http://%s:10249", n.IPv4)
	metrics, err := n.HTTPGet(ctx, base+"/metrics")
	if err != nil || !strings.Contains(metrics, "kubernetes_build_info{") {
		t.Errorf("GET /metrics on the node IP: %v; kubernetes_build_info missing", err)
	}
	body, err := n.HTTPGet(ctx, base+"/configz")
	if err != nil {
		t.Fatalf("GET /configz: %v", err)
	}
	var configz map[string]struct {
		HostnameOverride   string `json:"hostnameOverride"`
		MetricsBindAddress string `json:"metricsBindAddress"`
		ClusterCIDR        string `json:"clusterCIDR"`
		ClientConnection   struct {
			QPS float32 `json:"qps"`
		} `json:"clientConnection"`
	}
	if err := json.Unmarshal([]byte(body), &configz); err != nil {
		t.Fatalf("/configz: %v\n%s", err, body)
	}
	got := configz["kubeproxy.config.k8s.io"]
	if got.HostnameOverride != n.Name || got.MetricsBindAddress != n.IPv4.String()+":10249" ||
		got.ClusterCIDR != clusterCIDRs || got.ClientConnection.QPS != 5 {
		t.Errorf("/configz = %+v, want the file's configuration with the node name and metrics address", got)
	}
	// The file's loopback address (kube-proxy's default) is served beside
	// the node's IP, as kube-proxy serves it: upstream's e2e test "should
	// check kube-proxy urls" curls localhost:10249/proxyMode on the node.
	if mode, err := n.HTTPGet(ctx, "http://127.0.0.1:10249/proxyMode"); err != nil || strings.TrimSpace(mode) != "nftables" {
		t.Errorf("GET /proxyMode on the node's loopback = %q, %v; want nftables", mode, err)
	}

	volume.update("..2026_11_24_02", map[string]string{"config.conf": kubeProxyConfig(bed.ProxyKubeconfig, "10.244.0.0/16")})
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("nftproxy still runs 30 s after its ConfigMap changed:\n%s", p.Log())
	}
	var exit *exec.ExitError
	if err := p.Err(); !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("nftproxy exited with %v, want status 1", err)
	}
	if !strings.Contains(p.Log(), "Configuration file changed on disk") {
		t.Errorf("no log line about the changed configuration:\n%s", p.Log())
	}
}
