package kubenode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// PauseImage is the sandbox image containerd runs for every pod: built from
// e2e/cmd/pause by BuildPauseImage, since the bed has no registry to pull
// upstream's from.
const PauseImage = "docker.io/nftproxy-e2e/pause:1"

// containerdConfig is containerd 1.6's configuration (version 2 schema) for a
// node. Everything containerd keeps is under the node's directory: its root
// and state, its socket, the opt plugin's directory (default /opt/containerd),
// the CNI configuration (none without Options.CNI: pods then use the host
// network) and the registries' hosts.toml files (Options.Registry). The CNI
// plugins are Debian's, read-only (cniBinDir).
//
// restrict_oom_score_adj: the CRI plugin gives a sandbox oom_score_adj -998
// and the kubelet gives containers of critical pods -997. Lowering a score
// needs CAP_SYS_RESOURCE, which our test machines do not grant even to root,
// and runc then fails to start the container ("can't get final child's PID
// from pipe"). With the option, containerd raises such scores to its own.
var containerdConfig = template.Must(template.New("containerd").Parse(`version = 2
root = "{{.Dir}}/containerd/root"
state = "{{.Dir}}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "{{.Socket}}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{.PauseImage}}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{.CNIBinDir}}"
    conf_dir = "{{.Dir}}/cni/net.d"
{{- if .Registry}}
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{{.Dir}}/certs.d"
{{- end}}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = false
`))

// containerdTimeout bounds containerd's start.
const containerdTimeout = 30 * time.Second

// startContainerd writes containerd's configuration and starts it in the
// node's namespaces; it returns once containerd answers on its socket.
func (n *Node) startContainerd() error {
	var cfg bytes.Buffer
	err := containerdConfig.Execute(&cfg, struct{ Dir, Socket, PauseImage, CNIBinDir, Registry string }{
		n.Dir, n.Socket, PauseImage, cniBinDir, n.opts.Registry})
	if err != nil {
		return err
	}
	if err := n.writeNetworkConfig(); err != nil {
		return err
	}
	path := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(path, cfg.Bytes(), 0o644); err != nil {
		return err
	}
	n.containerd = n.startInside(n.bins.Containerd, "--config", path)
	deadline := time.Now().Add(containerdTimeout)
	for {
		_, err := n.ctr("version")
		if err == nil {
			return nil
		}
		select {
		case <-n.containerd.Done():
			return fmt.Errorf("containerd exited (%v); see %s", n.containerd.Err(), n.containerd.LogPath)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd not answering on %s after %v: %w", n.Socket, containerdTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// writeNetworkConfig writes what containerd reads of the node's network and
// registries (Options.CNI, Options.Registry).
func (n *Node) writeNetworkConfig() error {
	netd := filepath.Join(n.Dir, "cni", "net.d")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		return err
	}
	if n.opts.CNI {
		if err := checkCNIPlugins(); err != nil {
			return err
		}
	}
	if n.opts.CNI && !n.opts.Flannel {
		if err := n.writeCNIConfig(n.PodCIDRs, 0); err != nil {
			return err
		}
	}
	if n.opts.Registry != "" {
		return writeRegistryHosts(filepath.Join(n.Dir, "certs.d"), n.opts.Registry)
	}
	return nil
}

// writeCNIConfig writes the node's conflist (cniConfig), which containerd
// picks up when it next sets up a pod's network.
func (n *Node) writeCNIConfig(podCIDRs []netip.Prefix, mtu int) error {
	cfg, err := cniConfig(podCIDRs, filepath.Join(n.Dir, "cni", "ipam"), mtu)
	if err != nil {
		return err
	}
	// Written whole, then renamed: containerd watches the directory.
	netd := filepath.Join(n.Dir, "cni", "net.d")
	tmp := filepath.Join(netd, ".10-nfp.conflist")
	if err := os.WriteFile(tmp, cfg, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(netd, "10-nfp.conflist"))
}

// InstallFlannelCNI waits until flanneld (Options.Flannel) has written the
// node's lease, then writes the conflist flannel's CNI plugin would hand
// its delegate: the bed's bridge on the lease's subnets, with the overlay's
// MTU. The plugin itself cannot be fetched here (docs/cnis.md); flannel's
// manifest installs it and its conflist in init containers, which the
// conformance cluster leaves out for this.
func (n *Node) InstallFlannelCNI(ctx context.Context) error {
	path := filepath.Join("/proc", strconv.Itoa(n.holder.Pid()), "root", flannelSubnetEnv)
	for {
		b, err := os.ReadFile(path)
		if err == nil {
			lease, err := parseSubnetEnv(b)
			if err != nil {
				return fmt.Errorf("kubenode %s: %w", n.Name, err)
			}
			return n.writeCNIConfig(lease.podCIDRs, lease.mtu)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubenode %s: no %s from flanneld: %w", n.Name, flannelSubnetEnv, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// imported matches what `ctr images import` prints for each image:
// "unpacking docker.io/library/nftproxy:latest (sha256:…)...done".
var imported = regexp.MustCompile(`unpacking (\S+) \((sha256:[0-9a-f]{64})\)`)

// Image is an image imported into a node's containerd.
type Image struct {
	// Manifest is the digest of the image's manifest.
	Manifest string
	// Config is the digest of its configuration: the image ID containerd
	// reports to the kubelet (a pod's containerStatuses[].imageID).
	Config string
}

// Import imports an image archive (OCI layout or `docker save` format) into
// the namespace the kubelet's images live in (k8s.io) and returns the images
// it holds by name.
func (n *Node) Import(archive string) (map[string]Image, error) {
	out, err := n.ctr("images", "import", archive)
	if err != nil {
		return nil, err
	}
	images := map[string]Image{}
	for _, m := range imported.FindAllStringSubmatch(out, -1) {
		config, err := n.imageConfig(m[2])
		if err != nil {
			return nil, err
		}
		images[m[1]] = Image{Manifest: m[2], Config: config}
	}
	if len(images) == 0 {
		return nil, fmt.Errorf("ctr images import %s imported nothing:\n%s", archive, out)
	}
	return images, nil
}

// imageConfig reads the manifest with the given digest from containerd's
// content store and returns its configuration's digest.
func (n *Node) imageConfig(manifest string) (string, error) {
	out, err := n.ctr("content", "get", manifest)
	if err != nil {
		return "", err
	}
	var m struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil || m.Config.Digest == "" {
		return "", fmt.Errorf("manifest %s: no config digest (%v): %.200s", manifest, err, out)
	}
	return m.Config.Digest, nil
}

// ctr runs ctr against the node's containerd, in its k8s.io namespace. ctr
// only talks to containerd's socket, so it runs in the root namespaces.
func (n *Node) ctr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.bins.Ctr, append([]string{"--address", n.Socket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}
