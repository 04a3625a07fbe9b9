package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// checkMode refuses the proxy modes nftproxy does not implement, instead of
// silently running nftables rules where iptables or IPVS ones were asked for.
// A --config file's "iptables" is the exception: kubeadm v1.37 writes it into
// the kube-proxy ConfigMap whenever the mode was left unset (its default,
// cmd/kubeadm/app/componentconfigs/kubeproxy.go), so refusing it would stop
// nftproxy on every default kubeadm cluster it is dropped into. Startup logs
// that nftables is programmed instead (logFlagNotes). --proxy-mode=iptables
// on the command line is someone's explicit choice, and IPVS never a default:
// both are refused.
func checkMode(c *kpconfig.KubeProxyConfiguration, fromFile bool) error {
	switch {
	case c.Mode == "", c.Mode == "nftables":
		return nil
	case c.Mode == "iptables" && fromFile:
		return nil
	}
	return fmt.Errorf("--proxy-mode / mode %q: nftproxy only implements the nftables mode (set it to \"nftables\" or leave it empty; "+
		"a --config file's \"iptables\", which kubeadm writes when the mode is unset, is read as \"nftables\")", c.Mode)
}

// checkDetectLocalMode accepts upstream's modes, each with what it needs.
func checkDetectLocalMode(c *kpconfig.KubeProxyConfiguration) error {
	switch c.DetectLocalMode {
	case "", "ClusterCIDR", "NodeCIDR":
		return nil
	case "BridgeInterface":
		if c.DetectLocal.BridgeInterface == "" {
			return errors.New("--detect-local-mode / detectLocalMode BridgeInterface needs --pod-bridge-interface / detectLocal.bridgeInterface")
		}
		return nil
	case "InterfaceNamePrefix":
		if c.DetectLocal.InterfaceNamePrefix == "" {
			return errors.New("--detect-local-mode / detectLocalMode InterfaceNamePrefix needs --pod-interface-name-prefix / detectLocal.interfaceNamePrefix")
		}
		return nil
	}
	return fmt.Errorf("--detect-local-mode / detectLocalMode %q: unknown mode (ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix)", c.DetectLocalMode)
}

// checkPeriods applies upstream's validation of the sync periods.
func checkPeriods(c *kpconfig.KubeProxyConfiguration) error {
	sync, minSync := c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	var errs []error
	if sync <= 0 {
		errs = append(errs, fmt.Errorf("--iptables-sync-period / nftables.syncPeriod %v: must be greater than 0", sync))
	}
	if minSync < 0 {
		errs = append(errs, fmt.Errorf("--iptables-min-sync-period / nftables.minSyncPeriod %v: must be greater than or equal to 0", minSync))
	}
	if sync > 0 && minSync > sync {
		errs = append(errs, fmt.Errorf("--iptables-min-sync-period / nftables.minSyncPeriod %v: must not exceed the sync period %v", minSync, sync))
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		errs = append(errs, fmt.Errorf("--config-sync-period / configSyncPeriod %v: must be greater than 0", c.ConfigSyncPeriod.Duration))
	}
	return errors.Join(errs...)
}

// checkClient applies upstream's validation of the client connection
// (negative QPS is refused too: client-go would read it as "no limit").
func checkClient(c *kpconfig.KubeProxyConfiguration) error {
	var errs []error
	if c.ClientConnection.QPS < 0 {
		errs = append(errs, fmt.Errorf("--kube-api-qps / clientConnection.qps %v: must not be negative", c.ClientConnection.QPS))
	}
	if c.ClientConnection.Burst < 0 {
		errs = append(errs, fmt.Errorf("--kube-api-burst / clientConnection.burst %d: must not be negative", c.ClientConnection.Burst))
	}
	return errors.Join(errs...)
}

// The keywords --nodeport-addresses takes besides CIDRs (kube-proxy 1.37):
// they mix with each other and with CIDRs, each at most once.
const (
	// nodePortPrimary: the node's primary IPs, from its Node object (the
	// default in nftables mode).
	nodePortPrimary = "primary"
	// nodePortLocalhost: 127.0.0.0/8 and ::1/128. With the gate
	// KubeProxyNFTablesLocalhostNodePorts, TCP NodePorts are then proxied
	// on 127.0.0.1 and ::1 (proxier/localnodeport).
	nodePortLocalhost = "localhost"
	// nodePortAll: 0.0.0.0/0 and ::/0, every local address.
	nodePortAll = "all"
)

// checkNodePortAddresses applies upstream's rule: every entry is a CIDR or
// a keyword, and no keyword is given twice (a CIDR may be).
func checkNodePortAddresses(addrs []string) error {
	var errs []error
	seen := map[string]bool{}
	for i, a := range addrs {
		switch a {
		case nodePortPrimary, nodePortLocalhost, nodePortAll:
			if seen[a] {
				errs = append(errs, fmt.Errorf("--nodeport-addresses / nodePortAddresses[%d] %q: keyword given twice", i, a))
			}
			seen[a] = true
			continue
		}
		if _, err := netip.ParsePrefix(a); err != nil {
			errs = append(errs, fmt.Errorf("--nodeport-addresses / nodePortAddresses[%d] %q: neither a CIDR nor one of the keywords primary, localhost, all", i, a))
		}
	}
	return errors.Join(errs...)
}

// expandNodePortAddresses returns what a valid --nodeport-addresses stands
// for: whether it names the node's primary IPs, and its CIDRs with
// "localhost" and "all" expanded into theirs, as upstream expands them.
// "primary" stays a flag: the primary IPs are read from the Node object
// as it changes (proxier.Config.NodePortPrimary).
func expandNodePortAddresses(addrs []string) (primary bool, cidrs []netip.Prefix) {
	for _, a := range addrs {
		switch a {
		case nodePortPrimary:
			primary = true
		case nodePortLocalhost:
			cidrs = append(cidrs, netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"))
		case nodePortAll:
			cidrs = append(cidrs, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"))
		default:
			// checkNodePortAddresses reports the unparsable ones.
			if p, err := netip.ParsePrefix(a); err == nil {
				cidrs = append(cidrs, p.Masked())
			}
		}
	}
	return primary, cidrs
}

// bindAddress validates a server address: "host:port", a bare IP (the
// default port is appended, as upstream's defaulting does), or empty
// (disabled).
func bindAddress(addr string, defaultPort int, what string) (string, error) {
	if addr == "" {
		return "", nil
	}
	if ip, err := netip.ParseAddr(addr); err == nil {
		return net.JoinHostPort(ip.String(), strconv.Itoa(defaultPort)), nil
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%s %q: want IP:port", what, addr)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return "", fmt.Errorf("%s %q: %q is not an IP address", what, addr, host)
	}
	if p, err := strconv.ParseUint(portText, 10, 16); err != nil || p == 0 {
		return "", fmt.Errorf("%s %q: port must be 1-65535", what, addr)
	}
	return addr, nil
}

// addressFromPortFlag is upstream's addressFromDeprecatedFlags: port 0
// disables the server; another port completes an address that is a bare
// IP, and leaves one that has a port alone (reported by ok=false).
func addressFromPortFlag(addr string, port int32) (string, bool) {
	if port == 0 {
		return "", true
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return addr, false
	}
	if ip, err := netip.ParseAddr(addr); err == nil {
		return net.JoinHostPort(ip.String(), strconv.Itoa(int(port))), true
	}
	return addr, true
}

// nodeName is upstream's GetHostname: the override, else the hostname,
// trimmed and lower-cased (Node names are lower case).
func nodeName(override string, hostname func() (string, error)) (string, error) {
	name := override
	if name == "" {
		h, err := hostname()
		if err != nil {
			return "", fmt.Errorf("node name: --hostname-override not set and no hostname: %w", err)
		}
		name = h
	}
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		return "", errors.New("--hostname-override / hostnameOverride: empty node name")
	}
	return name, nil
}

func masqueradeBit(bit *int32) (int, error) {
	if *bit < 0 || *bit > 31 {
		return 0, fmt.Errorf("--iptables-masquerade-bit / nftables.masqueradeBit %d: must be within [0, 31]", *bit)
	}
	return int(*bit), nil
}

// parseCIDRs parses a comma-separated list of at most one prefix per IP
// family (a dual-stack pair), as upstream validates --cluster-cidr.
func parseCIDRs(list, what string) ([]netip.Prefix, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var prefixes []netip.Prefix
	seen := map[bool]bool{} // Is4 → seen
	for _, s := range strings.Split(list, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", what, s, err)
		}
		p = p.Masked()
		if seen[p.Addr().Is4()] {
			return nil, fmt.Errorf("%s %q: at most one CIDR per IP family", what, list)
		}
		seen[p.Addr().Is4()] = true
		prefixes = append(prefixes, p)
	}
	return prefixes, nil
}

// parseIPFamilies parses --ip-families; empty means both.
func parseIPFamilies(list string) (ipv4, ipv6 bool, err error) {
	if strings.TrimSpace(list) == "" {
		return true, true, nil
	}
	for _, s := range strings.Split(list, ",") {
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "ipv4":
			ipv4 = true
		case "ipv6":
			ipv6 = true
		default:
			return false, false, fmt.Errorf("--ip-families %q: %q is not ipv4 or ipv6", list, s)
		}
	}
	return ipv4, ipv6, nil
}

// checkLinux applies upstream's validation of the bind address, the OOM
// score adjustment and the conntrack settings.
func checkLinux(c *kpconfig.KubeProxyConfiguration) error {
	var errs []error
	if _, err := netip.ParseAddr(c.BindAddress); err != nil {
		errs = append(errs, fmt.Errorf("--bind-address / bindAddress %q: not an IP address", c.BindAddress))
	}
	if a := c.OOMScoreAdj; a != nil && (*a < -1000 || *a > 1000) {
		errs = append(errs, fmt.Errorf("--oom-score-adj / oomScoreAdj %d: must be within [-1000, 1000]", *a))
	}
	ct := c.Conntrack
	for _, v := range []struct {
		what  string
		value int64
	}{
		{"--conntrack-max-per-core / conntrack.maxPerCore", int64(*ct.MaxPerCore)},
		{"--conntrack-min / conntrack.min", int64(*ct.Min)},
		{"--conntrack-tcp-timeout-established / conntrack.tcpEstablishedTimeout", int64(ct.TCPEstablishedTimeout.Duration)},
		{"--conntrack-tcp-timeout-close-wait / conntrack.tcpCloseWaitTimeout", int64(ct.TCPCloseWaitTimeout.Duration)},
		{"--conntrack-udp-timeout / conntrack.udpTimeout", int64(ct.UDPTimeout.Duration)},
		{"--conntrack-udp-timeout-stream / conntrack.udpStreamTimeout", int64(ct.UDPStreamTimeout.Duration)},
	} {
		if v.value < 0 {
			errs = append(errs, fmt.Errorf("%s: must be greater than or equal to 0", v.what))
		}
	}
	return errors.Join(errs...)
}
