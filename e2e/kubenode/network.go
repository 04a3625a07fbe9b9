package kubenode

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// cniBinDir holds the CNI plugins of Debian's containernetworking-plugins
// package (bridge, host-local, loopback, portmap, ...): read-only, shared by
// every node.
const cniBinDir = "/usr/lib/cni"

// cniPlugins are the plugins a node with a pod network runs: containerd runs
// loopback itself for every sandbox, the conflist the others.
var cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}

// podRangeStart is the first host number host-local hands out in a node's
// IPv4 pod CIDR. The bed's own pod namespaces (testbed's AddPod) take .11,
// .12, ... of the same /24: the two never share an address while a node has
// fewer than 54 of those.
const podRangeStart = 64

// cniConfig is the node's CNI network (cniVersion 1.0.0, which
// containernetworking-plugins 1.1 speaks): a bridge cni0 holding the gateway
// address (.1 of the node's IPv4 pod CIDR) and every pod's veth, host-local
// addresses from the CIDR, no masquerade (the bed routes every node's pod
// CIDR to it, so pods, nodes and the API server reach pods at their own
// addresses), hairpin on (a pod reaching itself through a Service), and
// portmap for hostPort. IPv4 only: the suite picks the cluster's family from
// Service kubernetes (IPv4 first).
func cniConfig(podCIDR netip.Prefix, ipamDir string) ([]byte, error) {
	if !podCIDR.Addr().Is4() || podCIDR.Bits() > 24 {
		return nil, fmt.Errorf("pod CIDR %s: want an IPv4 /24 or larger", podCIDR)
	}
	base := podCIDR.Masked().Addr().As4()
	gateway, start := base, base
	gateway[3], start[3] = 1, podRangeStart
	cfg := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "nfp",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      "cni0",
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": ipamDir,
					"ranges": [][]map[string]string{{{
						"subnet":     podCIDR.Masked().String(),
						"rangeStart": netip.AddrFrom4(start).String(),
						"gateway":    netip.AddrFrom4(gateway).String(),
					}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// checkCNIPlugins fails when a plugin the node's network needs is missing.
func checkCNIPlugins() error {
	for _, p := range cniPlugins {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			return fmt.Errorf("CNI plugin %s: %w (Debian package containernetworking-plugins; e2e/tools/deps.sh installs it)", p, err)
		}
	}
	return nil
}

// mirroredRegistries are the registries whose pulls go to Options.Registry:
// Docker Hub (nftproxy:latest is docker.io/library/nftproxy:latest) and
// registry.k8s.io (every image of the suite and of kubeadm's addons).
var mirroredRegistries = []string{"docker.io", "registry.k8s.io"}

// registryHosts is containerd's hosts.toml for a registry served over plain
// HTTP at addr (host:port). `server` replaces the upstream registry: a pull
// never falls back to it.
func registryHosts(addr string) string {
	url := "http://" + addr
	return fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", url, url)
}

// writeRegistryHosts writes dir/REGISTRY/hosts.toml for each of
// mirroredRegistries (containerd's registry config_path).
func writeRegistryHosts(dir, addr string) error {
	for _, r := range mirroredRegistries {
		d := filepath.Join(dir, r)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(registryHosts(addr)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// resolvConf is the node's resolv.conf: the file the kubelet gives pods with
// dnsPolicy Default (CoreDNS among them: its forward plugin reads it) and
// uses for the host part of the others. With no name server, it is empty.
func resolvConf(nameserver string) []byte {
	if nameserver == "" {
		return nil
	}
	return []byte("nameserver " + strings.TrimSpace(nameserver) + "\n")
}
