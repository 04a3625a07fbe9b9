package conformance_test

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestAdaptFlannelManifest: flannel's own manifest keeps everything but the
// image, the init containers and their volumes, and net-conf.json, which
// names both pod CIDRs, vxlan and the mode.
func TestAdaptFlannelManifest(t *testing.T) {
	path, err := flannelManifestPath()
	if err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"iptables", "nftables"} {
		b, err := adaptFlannelManifest(orig, mode, "docker.io/nftproxy-e2e/flannel:v0")
		if err != nil {
			t.Fatal(err)
		}
		docs := strings.Split(string(b), "\n---\n")
		if n := len(strings.Split(strings.TrimPrefix(strings.TrimSpace(string(orig)), "---\n"), "\n---\n")); len(docs) != n {
			t.Fatalf("%s: %d documents, flannel's manifest has %d", mode, len(docs), n)
		}
		var ds appsv1.DaemonSet
		var cm v1.ConfigMap
		for _, d := range docs {
			switch {
			case strings.Contains(d, "kind: DaemonSet"):
				if err := yaml.Unmarshal([]byte(d), &ds); err != nil {
					t.Fatal(err)
				}
			case strings.Contains(d, "kind: ConfigMap"):
				if err := yaml.Unmarshal([]byte(d), &cm); err != nil {
					t.Fatal(err)
				}
			default:
				if !strings.Contains(string(orig), d) {
					t.Errorf("%s: a document changed:\n%s", mode, d)
				}
			}
		}
		spec := ds.Spec.Template.Spec
		var vols []string
		for _, v := range spec.Volumes {
			vols = append(vols, v.Name)
		}
		c := spec.Containers[0]
		if len(spec.InitContainers) != 0 || c.Image != "docker.io/nftproxy-e2e/flannel:v0" || !spec.HostNetwork ||
			!slices.Equal(c.Command, []string{"/opt/bin/flanneld"}) || !slices.Contains(c.Args, "--kube-subnet-mgr") ||
			!slices.Contains(c.Args, "--ip-masq") || !slices.Equal(vols, []string{"run", "flannel-cfg", "xtables-lock"}) {
			t.Errorf("%s: DaemonSet %s: init containers %d, image %s, command %v %v, volumes %v",
				mode, ds.Name, len(spec.InitContainers), c.Image, c.Command, c.Args, vols)
		}
		var conf struct {
			Network, IPv6Network string
			EnableIPv6           bool
			EnableNFTables       bool
			Backend              struct{ Type string }
		}
		if err := json.Unmarshal([]byte(cm.Data["net-conf.json"]), &conf); err != nil {
			t.Fatal(err)
		}
		if conf.Network != "10.244.0.0/16" || conf.IPv6Network != "fd00:244::/48" || !conf.EnableIPv6 ||
			conf.EnableNFTables != (mode == "nftables") || conf.Backend.Type != "vxlan" || cm.Data["cni-conf.json"] == "" {
			t.Errorf("%s: ConfigMap %s: %v", mode, cm.Name, cm.Data)
		}
	}
}
