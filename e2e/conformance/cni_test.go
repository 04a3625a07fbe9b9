package conformance

import "testing"

// TestParseCluster: a cluster's name and output directory from
// CONFORMANCE_CNI and CONFORMANCE_PRIMARY; the IPv4-first bridge keeps the
// top directory.
func TestParseCluster(t *testing.T) {
	for _, tc := range []struct {
		cni, primary, name, dir string
		flannel                 string
	}{
		{"bridge", "", "bridge", "", ""},
		{"bridge", "ipv4", "bridge", "", ""},
		{"bridge", "ipv6", "bridge-ipv6", "bridge-ipv6", ""},
		{"flannel-iptables", "ipv4", "flannel-iptables", "flannel-iptables", "iptables"},
		{"flannel-nftables", "ipv6", "flannel-nftables-ipv6", "flannel-nftables-ipv6", "nftables"},
	} {
		c, err := ParseCluster(tc.cni, tc.primary)
		if err != nil {
			t.Fatal(err)
		}
		mode, _ := c.CNI.Flannel()
		if c.Name() != tc.name || c.Dir() != tc.dir || mode != tc.flannel {
			t.Errorf("%s/%s: name %q dir %q flannel %q, want %q %q %q", tc.cni, tc.primary, c.Name(), c.Dir(), mode, tc.name, tc.dir, tc.flannel)
		}
	}
	for _, bad := range [][2]string{{"calico", "ipv4"}, {"bridge", "ipv5"}} {
		if _, err := ParseCluster(bad[0], bad[1]); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}
