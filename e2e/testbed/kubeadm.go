package testbed

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kubeadmConfig is what `kubeadm init` would be given for the bed: its
// control-plane endpoint and a pod subnet that holds every node's IPv4 pod
// CIDR (10.244.N.0/24). kube-proxy's mode is left unset, as on a default
// cluster: kubeadm v1.37 then writes "mode: iptables" into the ConfigMap,
// which nftproxy reads as nftables (docs/migrating-from-kube-proxy.md).
// The Kubernetes version is
// pinned, or kubeadm would ask dl.k8s.io for the latest; the node name, CRI
// socket and advertise address are set so that it looks nothing up on this
// machine (hostname, container runtime, default route). Of those, the addon
// phase uses the advertise address only: its family picks kube-proxy's
// bindAddress, and it is the endpoint when controlPlaneEndpoint is unset.
func kubeadmConfig() string {
	return `apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: ` + ControlIPv4 + `
  bindPort: 6443
nodeRegistration:
  name: control-plane
  criSocket: unix:///run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: ` + KubeVersions().Kubernetes + `
controlPlaneEndpoint: ` + ControlIPv4 + `:6443
networking:
  podSubnet: 10.244.0.0/16
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
`
}

// KubeadmProxyAddon runs kubeadm's kube-proxy addon phase against the bed,
// as its admin, from the control namespace: ServiceAccount, RBAC,
// ConfigMap and DaemonSet kube-proxy, as `kubeadm init` creates them.
// kubeProxy holds more fields of the KubeProxyConfiguration (YAML lines,
// or ""); the config file is written into dir. It returns kubeadm's output
// and fails the test if kubeadm fails.
func (b *Bed) KubeadmProxyAddon(t testing.TB, kubeadm, dir, kubeProxy string) string {
	t.Helper()
	cfg := filepath.Join(dir, "kubeadm.yaml")
	if err := os.WriteFile(cfg, []byte(kubeadmConfig()+kubeProxy), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := b.Ctl.Exec(ctx, kubeadm, "init", "phase", "addon", "kube-proxy", "--config", cfg,
		"--kubeconfig", b.AdminKubeconfig)
	if err != nil {
		t.Fatalf("kubeadm: %v\n%s", err, out)
	}
	t.Logf("kubeadm: %s", strings.TrimSpace(out))
	return out
}
