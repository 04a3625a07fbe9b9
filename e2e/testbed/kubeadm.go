package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// kubeadmConfig is what `kubeadm init` would be given for a dual-stack bed:
// its control-plane endpoint, pod subnets that hold every node's pod CIDRs
// (PodCIDRs: kube-proxy's clusterCIDR) and the Service ranges (ServiceCIDRs;
// the coredns addon's Service kube-dns takes the tenth address of the IPv4
// one, ClusterDNSIP). kube-proxy's mode
// is left unset, as on a default cluster: kubeadm v1.37 then writes "mode:
// iptables" into the ConfigMap, which nftproxy reads as nftables
// (docs/migrating-from-kube-proxy.md). The Kubernetes version is
// pinned, or kubeadm would ask dl.k8s.io for the latest; the node name, CRI
// socket and advertise address are set so that it looks nothing up on this
// machine (hostname, container runtime, default route). Of those, the addon
// phase uses the advertise address only: its family picks kube-proxy's
// bindAddress, and it is the endpoint when controlPlaneEndpoint is unset.
// With ipv6Primary every list and address is of IPv6 first.
func kubeadmConfig(ipv6Primary bool) string {
	advertise, endpoint := ControlIPv4, ControlIPv4
	if ipv6Primary {
		advertise, endpoint = ControlIPv6, "["+ControlIPv6+"]"
	}
	return `apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: ` + advertise + `
  bindPort: 6443
nodeRegistration:
  name: control-plane
  criSocket: unix:///run/containerd/containerd.sock
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: ` + kubebin.Pinned().Kubernetes + `
controlPlaneEndpoint: "` + endpoint + `:6443"
networking:
  podSubnet: ` + familyOrder(PodCIDRs, ipv6Primary) + `
  serviceSubnet: ` + familyOrder(ServiceCIDRs, ipv6Primary) + `
  dnsDomain: cluster.local
---
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
`
}

// ClusterDNSIP is the address of Service kube-system/kube-dns that kubeadm's
// coredns addon creates: the tenth of serviceSubnet's first range.
const ClusterDNSIP = "10.96.0.10"

// ClusterDNSIPv6 is the same on an IPv6-primary bed.
const ClusterDNSIPv6 = "fd00:96::a"

// ClusterDNSIP is Service kube-dns's address on this bed.
func (b *Bed) ClusterDNSIP() string {
	if b.opts.IPv6Primary {
		return ClusterDNSIPv6
	}
	return ClusterDNSIP
}

// KubeadmProxyAddon runs kubeadm's kube-proxy addon phase against the bed,
// as its admin, from the control namespace: ServiceAccount, RBAC,
// ConfigMap and DaemonSet kube-proxy, as `kubeadm init` creates them.
// kubeProxy holds more fields of the KubeProxyConfiguration (YAML lines,
// or ""); the config file is written into dir. It returns kubeadm's output
// and fails the test if kubeadm fails.
func (b *Bed) KubeadmProxyAddon(t testing.TB, kubeadm, dir, kubeProxy string) string {
	t.Helper()
	return b.KubeadmAddons(t, kubeadm, dir, kubeProxy, "kube-proxy")
}

// KubeadmAddons runs kubeadm's addon phases ("kube-proxy", "coredns": the
// Deployment coredns, its ConfigMap with kubeadm's Corefile, RBAC and
// Service kube-dns at ClusterDNSIP) in order, as KubeadmProxyAddon does, and
// returns their output.
func (b *Bed) KubeadmAddons(t testing.TB, kubeadm, dir, kubeProxy string, addons ...string) string {
	t.Helper()
	cfg, err := writeKubeadmConfig(dir, kubeProxy, b.opts.IPv6Primary)
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, addon := range addons {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := b.AdminExec(ctx, kubeadm, "init", "phase", "addon", addon, "--config", cfg)
		cancel()
		if err != nil {
			t.Fatalf("kubeadm addon %s: %v\n%s", addon, err, out)
		}
		t.Logf("kubeadm addon %s: %s", addon, strings.TrimSpace(out))
		all.WriteString(out)
	}
	return all.String()
}

// writeKubeadmConfig writes the bed's kubeadm configuration, with kubeProxy's
// lines added to its KubeProxyConfiguration, to dir/kubeadm.yaml and
// returns the file's path.
func writeKubeadmConfig(dir, kubeProxy string, ipv6Primary bool) (string, error) {
	cfg := filepath.Join(dir, "kubeadm.yaml")
	return cfg, os.WriteFile(cfg, []byte(kubeadmConfig(ipv6Primary)+kubeProxy), 0o644)
}

// KubeadmImages lists the images kubeadm's phases would run for the bed's
// configuration (`kubeadm config images list`; it needs no cluster): among
// them the kube-proxy and coredns images of its addons.
func KubeadmImages(kubeadm, dir string) ([]string, error) {
	cfg, err := writeKubeadmConfig(dir, "", false)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, kubeadm, "config", "images", "list", "--config", cfg).Output()
	if err != nil {
		return nil, fmt.Errorf("kubeadm config images list: %w", err)
	}
	return strings.Fields(string(out)), nil
}
