package kubenode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// kubeletTimeout bounds the wait for the kubelet's health endpoint and its
// first status report in the Node object.
const kubeletTimeout = 2 * time.Minute

// kubeletHealthz is the kubelet's health endpoint, on the node's loopback.
const kubeletHealthz = "127.0.0.1:10248"

// kubeletConfig is the node's KubeletConfiguration (kubelet.config.k8s.io/v1beta1).
func (n *Node) kubeletConfig() map[string]any {
	authn := map[string]any{
		"anonymous": map[string]bool{"enabled": false},
		"webhook":   map[string]bool{"enabled": false},
	}
	if n.opts.ClientCAFile != "" {
		authn["x509"] = map[string]string{"clientCAFile": n.opts.ClientCAFile}
	}
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// Our test machines have cgroup v1, which kubelet 1.35 and later
		// refuse unless told otherwise.
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               "/" + n.CgroupParent,
		"containerRuntimeEndpoint": "unix://" + n.Socket,
		// The kubelet's defaults are machine paths.
		"podLogsDir":      filepath.Join(n.Dir, "pod-logs"),
		"volumePluginDir": filepath.Join(n.Dir, "volume-plugins"),
		"resolvConf":      filepath.Join(n.Dir, "resolv.conf"),
		// Fail rather than change a global kernel setting (see kubeletSysctls).
		"protectKernelDefaults": true,
		// The kubelet's own default (-999) needs CAP_SYS_RESOURCE to set.
		"oomScoreAdj": 0,
		"failSwapOn":  false,
		// The node shares the machine's disk and memory with other work:
		// evicting the pod over them would only make the test flaky.
		"evictionHard": map[string]string{
			"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
		},
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"authentication":     authn,
		"authorization":      map[string]string{"mode": "AlwaysAllow"},
	}
	if n.opts.ClusterDNS != "" {
		cfg["clusterDNS"] = []string{n.opts.ClusterDNS}
		cfg["clusterDomain"] = ClusterDomain
	}
	return cfg
}

// ClusterDomain is the cluster's DNS domain (kubeadm's default).
const ClusterDomain = "cluster.local"

// startKubelet writes the kubelet's configuration and starts it in the node's
// namespaces, as the bed's admin; it returns once the kubelet is healthy and
// has reported its status in the Node object.
func (n *Node) startKubelet() error {
	cfg, err := yaml.Marshal(n.kubeletConfig())
	if err != nil {
		return err
	}
	path := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "resolv.conf"), resolvConf(n.opts.Nameserver), 0o644); err != nil {
		return err
	}
	root := filepath.Join(n.Dir, "kubelet")
	n.kubeletArgs = []string{n.bins.Kubelet,
		"--config=" + path,
		"--kubeconfig=" + n.bed.AdminKubeconfig,
		"--root-dir=" + root,
		"--cert-dir=" + filepath.Join(root, "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.NodeIPs()[0].String() + "," + n.NodeIPs()[1].String(),
		"--v=2",
	}
	n.kubelet = n.startInside(n.kubeletArgs...)
	return n.waitKubelet()
}

// RestartKubelet stops the node's kubelet (SIGTERM, SIGKILL after 10 s) and
// starts it again with the same command line, as `systemctl restart
// kubelet` would; pods and their containers keep running meanwhile. It
// returns once the kubelet is healthy again and has reported its status.
func (n *Node) RestartKubelet() error {
	n.kubelet.Stop(stopTimeout)
	n.kubelet = n.startInside(n.kubeletArgs...)
	return n.waitKubelet()
}

// waitKubelet waits until the kubelet's /healthz answers ok and the Node
// object carries the kubelet's version, which it writes with its first
// status.
func (n *Node) waitKubelet() error {
	deadline := time.Now().Add(kubeletTimeout)
	for {
		err := n.kubeletReported()
		if err == nil {
			return nil
		}
		select {
		case <-n.kubelet.Done():
			return fmt.Errorf("kubelet exited (%v); see %s", n.kubelet.Err(), n.kubelet.LogPath)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubelet not ready after %v: %w", kubeletTimeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (n *Node) kubeletReported() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if body, err := n.HTTPGet(ctx, "http://"+kubeletHealthz+"/healthz"); err != nil {
		return fmt.Errorf("kubelet: %w: %s", err, body)
	}
	node, err := n.bed.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if node.Status.NodeInfo.KubeletVersion == "" {
		return fmt.Errorf("node %s: no status from the kubelet yet", n.Name)
	}
	return nil
}
