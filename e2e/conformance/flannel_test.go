package conformance_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// Flannel's objects, as its manifest names them.
const (
	flannelNamespace = "kube-flannel"
	flannelDaemonSet = "kube-flannel-ds"
	flannelConfigMap = "kube-flannel-cfg"
)

// flannelManifestPath is flannel's own manifest in the module that
// e2e/tools/flannel pins (the flanneld the image holds).
func flannelManifestPath() (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/flannel-io/flannel")
	cmd.Dir = filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "flannel")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/flannel-io/flannel in e2e/tools/flannel: %w", err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), "Documentation", "kube-flannel.yml"), nil
}

// adaptFlannelManifest changes flannel's manifest only where this machine
// forces it or the cluster differs from its defaults:
//   - net-conf.json: the cluster's pod CIDRs of both families (its default
//     is 10.244.0.0/16 alone) and the mode (EnableNFTables); vxlan as in
//     flannel's;
//   - the image: ours (e2e/cmd/testimages), for flannel's in ghcr.io;
//   - the init containers, which copy flannel's CNI plugin (not fetchable
//     here) and its conflist onto the node, and their two volumes: the
//     node's conflist is written by kubenode.InstallFlannelCNI instead.
//
// Everything else (RBAC, the DaemonSet's arguments, probes, capabilities,
// tolerations, the xtables lock) is flannel's.
func adaptFlannelManifest(manifest []byte, mode, image string) ([]byte, error) {
	v4, v6, _ := strings.Cut(testbed.PodCIDRs, ",")
	netConf, err := json.MarshalIndent(map[string]any{
		"Network": v4, "EnableIPv6": true, "IPv6Network": v6,
		"EnableNFTables": mode == "nftables",
		"Backend":        map[string]string{"Type": "vxlan"},
	}, "", "  ")
	if err != nil {
		return nil, err
	}
	var out []string
	var seenConfig, seenDaemonSet bool
	for _, doc := range strings.Split(string(manifest), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, err
		}
		var obj any
		switch meta.Kind {
		case "ConfigMap":
			var cm v1.ConfigMap
			if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
				return nil, err
			}
			if cm.Name != flannelConfigMap || cm.Data["net-conf.json"] == "" {
				return nil, fmt.Errorf("flannel's manifest: unexpected ConfigMap %s", cm.Name)
			}
			cm.Data["net-conf.json"] = string(netConf) + "\n"
			obj, seenConfig = &cm, true
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
				return nil, err
			}
			spec := &ds.Spec.Template.Spec
			if ds.Name != flannelDaemonSet || len(spec.Containers) != 1 || len(spec.InitContainers) != 2 {
				return nil, fmt.Errorf("flannel's manifest: unexpected DaemonSet %s (%d containers, %d init containers)",
					ds.Name, len(spec.Containers), len(spec.InitContainers))
			}
			var initVolumes []string
			for _, c := range spec.InitContainers {
				for _, m := range c.VolumeMounts {
					initVolumes = append(initVolumes, m.Name)
				}
			}
			spec.InitContainers = nil
			spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v v1.Volume) bool {
				return slices.Contains(initVolumes, v.Name) && !slices.ContainsFunc(spec.Containers[0].VolumeMounts,
					func(m v1.VolumeMount) bool { return m.Name == v.Name })
			})
			spec.Containers[0].Image = image
			obj, seenDaemonSet = &ds, true
		default:
			out = append(out, strings.TrimSpace(doc))
			continue
		}
		b, err := yaml.Marshal(obj)
		if err != nil {
			return nil, err
		}
		out = append(out, strings.TrimSpace(string(b)))
	}
	if !seenConfig || !seenDaemonSet {
		return nil, fmt.Errorf("flannel's manifest: no ConfigMap %s or DaemonSet %s", flannelConfigMap, flannelDaemonSet)
	}
	return []byte(strings.Join(out, "\n---\n") + "\n"), nil
}

// applyFlannel installs flannel from its adapted manifest (kubectl apply,
// as its README says), with our flannel image, in mode.
func (c *cluster) applyFlannel(mode string, images map[string]image) {
	c.t.Helper()
	img, ok := images["flannel"]
	if !ok || len(img.names) != 1 {
		c.t.Fatalf("no flannel image among the test images (e2e/cmd/testimages --flanneld): %v", img)
	}
	path, err := flannelManifestPath()
	if err != nil {
		c.t.Fatal(err)
	}
	manifest, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	adapted, err := adaptFlannelManifest(manifest, mode, img.names[0])
	if err != nil {
		c.t.Fatalf("%s: %v", path, err)
	}
	file := filepath.Join(c.dir, "kube-flannel.yml")
	if err := os.WriteFile(file, adapted, 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.kubectl("apply", "-f", file)
	c.t.Logf("flannel %s mode from %s, image %s", mode, path, img.names[0])
}

// installFlannelCNI writes each node's conflist once flanneld has leased
// it its subnets (kubenode.InstallFlannelCNI): until then the node's
// kubelet reports its network not ready, as with flannel's init
// containers and no flanneld yet.
func (c *cluster) installFlannelCNI() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, n := range c.nodes {
		if err := n.InstallFlannelCNI(ctx); err != nil {
			c.t.Fatalf("%v\n%s", err, c.describe(flannelNamespace))
		}
	}
}

// checkFlannel checks that flannel carries the pod network: its DaemonSet
// ready on every node; on each node its VXLAN devices, no route to another
// node's pods but through them, and its rules of the mode (nftables: its
// tables; iptables: its chains, and none of its tables).
func (c *cluster) checkFlannel(mode string) {
	c.t.Helper()
	c.poll("DaemonSet "+flannelDaemonSet+" ready on both nodes", readyTimeout, func(ctx context.Context) error {
		ds, err := c.bed.Client().AppsV1().DaemonSets(flannelNamespace).Get(ctx, flannelDaemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return daemonSetDone(ds, len(c.nodes))
	})
	for _, n := range c.nodes {
		// flanneld routes another node's pods once it has seen that
		// node's lease.
		c.poll(n.Name+": flannel's devices and routes", readyTimeout, func(ctx context.Context) error {
			links, err := n.Exec(ctx, "ip", "-br", "link")
			if err != nil {
				return err
			}
			for _, dev := range []string{"flannel.1", "flannel-v6.1"} {
				if !strings.Contains(links, dev+" ") && !strings.Contains(links, dev+"@") {
					return fmt.Errorf("no %s device:\n%s", dev, links)
				}
			}
			for _, other := range c.nodes {
				if other == n {
					continue
				}
				for i, family := range []string{"-4", "-6"} {
					within := strings.Split(testbed.PodCIDRs, ",")[i]
					routes, err := n.Exec(ctx, "ip", family, "route", "show", "root", within)
					if err != nil {
						return err
					}
					want := other.PodCIDRs[i].String()
					if !strings.Contains(lineOf(routes, want+" "), "dev flannel") {
						return fmt.Errorf("%s not routed through flannel's device:\n%s", want, routes)
					}
				}
			}
			return nil
		})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ruleset, err := n.Exec(ctx, "nft", "list", "ruleset")
		cancel()
		if err != nil {
			c.t.Fatalf("%s: nft list ruleset: %v", n.Name, err)
		}
		tables := strings.Contains(ruleset, "table ip flannel-ipv4") && strings.Contains(ruleset, "table ip6 flannel-ipv6")
		chains := strings.Contains(ruleset, "FLANNEL-POSTRTG")
		if mode == "nftables" && (!tables || chains) || mode == "iptables" && (tables || !chains) {
			c.t.Fatalf("%s: flannel's %s mode: tables %v, iptables chains %v:\n%s", n.Name, mode, tables, chains, ruleset)
		}
	}
	c.t.Logf("flannel (%s mode) routes the pods of both families between the nodes over VXLAN", mode)
}

// lineOf is the first line of s containing sub.
func lineOf(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
