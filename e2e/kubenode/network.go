package kubenode

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
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

// podRangeStartIPv6 is the same in the node's IPv6 pod CIDR: the bed's pod j
// has fd00:244:0:i::(10+j), its number written in decimal digits (::11, ::12,
// ...), which read as hexadecimal stay below ::64 while a node has fewer than
// 54 of them.
const podRangeStartIPv6 = 0x64

// cniConfig is the node's CNI network (cniVersion 1.0.0, which
// containernetworking-plugins 1.1 speaks): a bridge cni0 holding the gateway
// addresses (the first host of each of the node's pod CIDRs) and every pod's
// veth, host-local addresses from each CIDR (a pod gets one of each family,
// in the order of podCIDRs: IPv4 first, as the Node's spec.podCIDRs), no
// masquerade (the bed routes every node's pod CIDRs to it, so pods, nodes and
// the API server reach pods at their own addresses), hairpin on (a pod
// reaching itself through a Service), and portmap for hostPort. mtu, if not
// 0, is the bridge's and the pods' MTU.
func cniConfig(podCIDRs []netip.Prefix, ipamDir string, mtu int) ([]byte, error) {
	if len(podCIDRs) == 0 || len(podCIDRs) > 2 || (len(podCIDRs) == 2 && podCIDRs[0].Addr().Is4() == podCIDRs[1].Addr().Is4()) {
		return nil, fmt.Errorf("pod CIDRs %v: want one, or one of each family", podCIDRs)
	}
	var ranges [][]map[string]string
	var routes []map[string]string
	for _, p := range podCIDRs {
		r, route, err := podRange(p)
		if err != nil {
			return nil, err
		}
		ranges = append(ranges, []map[string]string{r})
		routes = append(routes, map[string]string{"dst": route})
	}
	bridge := map[string]any{
		"type":        "bridge",
		"bridge":      "cni0",
		"isGateway":   true,
		"ipMasq":      false,
		"hairpinMode": true,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": ipamDir,
			"ranges":  ranges,
			"routes":  routes,
		},
	}
	if mtu != 0 {
		bridge["mtu"] = mtu
	}
	cfg := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "nfp",
		"plugins": []any{
			bridge,
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	return json.MarshalIndent(cfg, "", "  ")
}

// podRange is host-local's range of a pod CIDR (an IPv4 /24 or larger, an
// IPv6 /64 or larger): its subnet, first address (podRangeStart,
// podRangeStartIPv6) and gateway (the first host), and the default route of
// its family.
func podRange(p netip.Prefix) (r map[string]string, defaultRoute string, err error) {
	p = p.Masked()
	if (p.Addr().Is4() && p.Bits() > 24) || (p.Addr().Is6() && p.Bits() > 64) || !p.IsValid() {
		return nil, "", fmt.Errorf("pod CIDR %s: want an IPv4 /24 or an IPv6 /64, or larger", p)
	}
	if p.Addr().Is4() {
		base := p.Addr().As4()
		gateway, start := base, base
		gateway[3], start[3] = 1, podRangeStart
		return map[string]string{"subnet": p.String(), "rangeStart": netip.AddrFrom4(start).String(),
			"gateway": netip.AddrFrom4(gateway).String()}, "0.0.0.0/0", nil
	}
	base := p.Addr().As16()
	gateway, start := base, base
	gateway[15], start[15] = 1, podRangeStartIPv6
	return map[string]string{"subnet": p.String(), "rangeStart": netip.AddrFrom16(start).String(),
		"gateway": netip.AddrFrom16(gateway).String()}, "::/0", nil
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

// flannelSubnetEnv is where flanneld writes its node's lease (--subnet-file's
// default), in the node's mount namespace.
const flannelSubnetEnv = "/run/flannel/subnet.env"

// flannelLease is what the CNI plugin of flannel reads of subnet.env: the
// node's pod subnets (IPv4 first) and the MTU of its overlay.
type flannelLease struct {
	podCIDRs []netip.Prefix
	mtu      int
}

// parseSubnetEnv reads flanneld's subnet.env (FLANNEL_SUBNET,
// FLANNEL_IPV6_SUBNET, FLANNEL_MTU; its addresses are the gateways', the
// first host of each subnet).
func parseSubnetEnv(b []byte) (flannelLease, error) {
	var l flannelLease
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		switch k {
		case "FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET":
			p, err := netip.ParsePrefix(v)
			if err != nil {
				return l, fmt.Errorf("subnet.env: %s: %w", k, err)
			}
			l.podCIDRs = append(l.podCIDRs, p.Masked())
		case "FLANNEL_MTU":
			if _, err := fmt.Sscan(v, &l.mtu); err != nil || l.mtu <= 0 {
				return l, fmt.Errorf("subnet.env: FLANNEL_MTU %q", v)
			}
		}
	}
	if len(l.podCIDRs) == 0 || l.mtu == 0 {
		return l, fmt.Errorf("subnet.env: want FLANNEL_SUBNET or FLANNEL_IPV6_SUBNET, and FLANNEL_MTU:\n%s", b)
	}
	slices.SortStableFunc(l.podCIDRs, func(a, b netip.Prefix) int {
		return cmp.Compare(boolInt(a.Addr().Is6()), boolInt(b.Addr().Is6()))
	})
	return l, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
