package kubenode

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

func TestCNIConfig(t *testing.T) {
	b, err := cniConfig([]netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:244:0:2::/64")}, "/d/ipam", 0)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		CNIVersion string `json:"cniVersion"`
		Plugins    []struct {
			Type         string          `json:"type"`
			Bridge       string          `json:"bridge"`
			IsGateway    bool            `json:"isGateway"`
			IPMasq       *bool           `json:"ipMasq"`
			HairpinMode  bool            `json:"hairpinMode"`
			Capabilities map[string]bool `json:"capabilities"`
			IPAM         struct {
				Type    string                `json:"type"`
				DataDir string                `json:"dataDir"`
				Ranges  [][]map[string]string `json:"ranges"`
				Routes  []map[string]string   `json:"routes"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.CNIVersion != "1.0.0" || len(cfg.Plugins) != 2 {
		t.Fatalf("config %s", b)
	}
	br, pm := cfg.Plugins[0], cfg.Plugins[1]
	r, routes := br.IPAM.Ranges, br.IPAM.Routes
	if br.Type != "bridge" || br.Bridge != "cni0" || !br.IsGateway || br.IPMasq == nil || *br.IPMasq || !br.HairpinMode ||
		br.IPAM.Type != "host-local" || br.IPAM.DataDir != "/d/ipam" || len(r) != 2 || len(r[0]) != 1 || len(r[1]) != 1 {
		t.Fatalf("bridge plugin: %s", b)
	}
	// One range set per family, IPv4 first (the pod's first address is
	// its status.podIP); the IPv6 range starts above the bed's pods too.
	for i, want := range []map[string]string{
		{"subnet": "10.244.2.0/24", "rangeStart": "10.244.2.64", "gateway": "10.244.2.1"},
		{"subnet": "fd00:244:0:2::/64", "rangeStart": "fd00:244:0:2::64", "gateway": "fd00:244:0:2::1"},
	} {
		for k, v := range want {
			if r[i][0][k] != v {
				t.Errorf("range %d: %s = %q, want %q", i, k, r[i][0][k], v)
			}
		}
	}
	if len(routes) != 2 || routes[0]["dst"] != "0.0.0.0/0" || routes[1]["dst"] != "::/0" {
		t.Errorf("routes %v, want a default route of each family", routes)
	}
	if pm.Type != "portmap" || !pm.Capabilities["portMappings"] {
		t.Errorf("portmap plugin: %s", b)
	}
	single, err := cniConfig([]netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, "/d", 0)
	if err != nil || strings.Contains(string(single), "::") {
		t.Errorf("IPv4 only: %v\n%s", err, single)
	}
	for _, bad := range [][]string{
		{"10.244.1.0/25"},
		{"fd00:244:1::/80"},
		{"10.244.1.0/24", "10.244.2.0/24"},
		{"10.244.1.0/24", "fd00:244:1::/64", "fd00:244:2::/64"},
		{},
	} {
		var cidrs []netip.Prefix
		for _, c := range bad {
			cidrs = append(cidrs, netip.MustParsePrefix(c))
		}
		if _, err := cniConfig(cidrs, "/d", 0); err == nil {
			t.Errorf("cniConfig accepted %v", bad)
		}
	}
}

func TestRegistryHosts(t *testing.T) {
	dir := t.TempDir()
	if err := writeRegistryHosts(dir, "10.10.0.1:5000"); err != nil {
		t.Fatal(err)
	}
	want := "server = \"http://10.10.0.1:5000\"\n\n[host.\"http://10.10.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
	for _, r := range []string{"docker.io", "registry.k8s.io"} {
		got, err := os.ReadFile(filepath.Join(dir, r, "hosts.toml"))
		if err != nil || string(got) != want {
			t.Errorf("%s/hosts.toml = %q (%v), want %q", r, got, err, want)
		}
	}
}

func TestResolvConf(t *testing.T) {
	if got := resolvConf(""); len(got) != 0 {
		t.Errorf("resolvConf(\"\") = %q", got)
	}
	if got := string(resolvConf("10.10.0.1")); got != "nameserver 10.10.0.1\n" {
		t.Errorf("resolvConf = %q", got)
	}
}

func TestKubeletConfigOptions(t *testing.T) {
	n := &Node{Node: &testbed.Node{}, Dir: "/d", CgroupParent: "nfp00000-node1", Socket: "/d/c.sock"}
	plain := n.kubeletConfig()
	if _, ok := plain["clusterDNS"]; ok {
		t.Error("clusterDNS without Options.ClusterDNS")
	}
	if _, ok := plain["authentication"].(map[string]any)["x509"]; ok {
		t.Error("a client CA without Options.ClientCAFile")
	}
	n.opts = Options{ClusterDNS: "10.96.0.10", ClientCAFile: "/d/ca.crt"}
	cfg := n.kubeletConfig()
	if dns, _ := cfg["clusterDNS"].([]string); len(dns) != 1 || dns[0] != "10.96.0.10" || cfg["clusterDomain"] != "cluster.local" {
		t.Errorf("cluster DNS: %v %v", cfg["clusterDNS"], cfg["clusterDomain"])
	}
	x509cfg, _ := cfg["authentication"].(map[string]any)["x509"].(map[string]string)
	if x509cfg["clientCAFile"] != "/d/ca.crt" {
		t.Errorf("authentication: %v", cfg["authentication"])
	}
}

// TestKubeletClientPKI checks that the API server's certificate is a client
// certificate the kubelet's CA verifies, and that its key matches.
func TestKubeletClientPKI(t *testing.T) {
	p, err := NewKubeletClientPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(p.CAFile)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate")
	}
	block, _ := pem.Decode(mustRead(t, p.CertFile))
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil || len(pair.Certificate) != 1 {
		t.Errorf("verify the client certificate: %v", err)
	}
	flags := strings.Join(p.APIServerFlags(), " ")
	if !strings.Contains(flags, "--kubelet-client-certificate="+p.CertFile) || !strings.Contains(flags, "--kubelet-client-key="+p.KeyFile) {
		t.Errorf("flags %s", flags)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestContainerdConfig(t *testing.T) {
	render := func(registry string) string {
		var b strings.Builder
		err := containerdConfig.Execute(&b, struct{ Dir, Socket, PauseImage, CNIBinDir, Registry string }{
			"/d", "/d/c.sock", PauseImage, cniBinDir, registry})
		if err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	plain, mirrored := render(""), render("10.10.0.1:5000")
	for _, want := range []string{`bin_dir = "/usr/lib/cni"`, `conf_dir = "/d/cni/net.d"`, `sandbox_image = "docker.io/nftproxy-e2e/pause:1"`} {
		if !strings.Contains(plain, want) {
			t.Errorf("config lacks %s:\n%s", want, plain)
		}
	}
	if strings.Contains(plain, "config_path") {
		t.Errorf("registry configuration without a registry:\n%s", plain)
	}
	if !strings.Contains(mirrored, "[plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"/d/certs.d\"\n") {
		t.Errorf("no registry config_path:\n%s", mirrored)
	}
}

// TestFlannelLease: subnet.env as flanneld v0.28 writes it, dual-stack,
// gives the plugin's subnets (IPv4 first, masked) and MTU, which the
// conflist carries; a lease without an MTU or a subnet is refused.
func TestFlannelLease(t *testing.T) {
	env := "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_IPV6_NETWORK=fd00:244::/48\nFLANNEL_IPV6_SUBNET=fd00:244:0:2::1/64\n" +
		"FLANNEL_SUBNET=10.244.2.1/24\nFLANNEL_MTU=1430\nFLANNEL_IPMASQ=true\n"
	l, err := parseSubnetEnv([]byte(env))
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("fd00:244:0:2::/64")}
	if l.mtu != 1430 || len(l.podCIDRs) != 2 || l.podCIDRs[0] != want[0] || l.podCIDRs[1] != want[1] {
		t.Fatalf("lease %+v, want %v and MTU 1430", l, want)
	}
	b, err := cniConfig(l.podCIDRs, "/d", l.mtu)
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Plugins []struct {
			MTU int `json:"mtu"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil || cfg.Plugins[0].MTU != 1430 {
		t.Errorf("conflist %s: want the bridge's mtu 1430", b)
	}
	for _, bad := range []string{"FLANNEL_SUBNET=10.244.2.1/24\n", "FLANNEL_MTU=1450\n", "FLANNEL_SUBNET=x\nFLANNEL_MTU=1450\n"} {
		if _, err := parseSubnetEnv([]byte(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}
