package kubenode

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/e2e/testbed/cgroupfs"
)

// Node is a bed node running containerd and a kubelet.
type Node struct {
	*testbed.Node
	// Dir holds everything the node writes: containerd's and the kubelet's
	// state, configurations and the containers' files. It is in the bed's
	// working directory and removed with it.
	Dir string
	// CgroupParent is the cgroup, in every hierarchy, under which the
	// kubelet puts its pods: the node's namespace name.
	CgroupParent string
	// Socket is containerd's (CRI and containerd API).
	Socket string
	// Images are the images imported at start, by name.
	Images map[string]Image

	bed                         *testbed.Bed
	bins                        Binaries
	opts                        Options
	holder, containerd, kubelet *testbed.Process
	kubeletArgs                 []string
	stopOnce                    sync.Once
}

// Options say what a node runs besides containerd and a kubelet for
// hostNetwork pods. The zero value is such a node.
type Options struct {
	// Images are image archives imported into containerd before the
	// kubelet starts.
	Images []string
	// CNI gives the node a dual-stack pod network: Debian's bridge,
	// host-local and portmap plugins on its IPv4 and IPv6 pod CIDRs
	// (cniConfig). Without it the node stays NotReady and runs only
	// hostNetwork pods.
	CNI bool
	// Flannel leaves the conflist of CNI to flanneld: InstallFlannelCNI
	// writes it once flanneld has written the node's lease.
	Flannel bool
	// ClusterDNS is the cluster's DNS Service IP for the kubelet
	// (clusterDNS, with clusterDomain ClusterDomain); "" for none.
	ClusterDNS string
	// Nameserver goes into the node's resolv.conf ("" leaves it empty):
	// what pods with dnsPolicy Default, CoreDNS's forward among them, ask.
	Nameserver string
	// ClientCAFile is the CA whose client certificates the kubelet
	// accepts (KubeletClientPKI): the API server's, for exec, logs and
	// port-forward. "" accepts none.
	ClientCAFile string
	// Registry is a plain-HTTP registry (host:port) that serves every
	// pull from docker.io and registry.k8s.io, in their place; "" pulls
	// nothing from anywhere the machine cannot reach.
	Registry string
}

// Start makes node a Kubernetes node: its mount namespace and cgroup parent,
// containerd with the image archives of opts imported, then the kubelet,
// registered as the node (which the bed created). The node is stopped and
// its cgroups removed when the test ends, before the bed, and also when the
// bed is cleaned up on SIGINT or SIGTERM. Start fails the test when any of it
// does not come up; the error says which part and where its log is.
func Start(t testbed.TB, bed *testbed.Bed, node *testbed.Node, bins Binaries, opts Options) *Node {
	t.Helper()
	n := &Node{
		Node:         node,
		Dir:          filepath.Join(bed.Dir, "kubenode-"+node.Name),
		CgroupParent: node.NS,
		bed:          bed,
		bins:         bins,
		opts:         opts,
	}
	n.Socket = filepath.Join(n.Dir, "containerd.sock")
	// Registered first, so that a start failing half way is undone too.
	t.Cleanup(n.stop)
	bed.OnCleanup(n.stop)
	if err := n.start(opts.Images); err != nil {
		t.Fatalf("kubenode %s: %v", node.Name, err)
	}
	return n
}

func (n *Node) start(images []string) error {
	for _, d := range []string{n.Dir, filepath.Join(n.Dir, "tmp")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := cgroupfs.Create(n.CgroupParent); err != nil {
		return fmt.Errorf("cgroup parent %s: %w", n.CgroupParent, err)
	}
	if err := n.startHolder(); err != nil {
		return err
	}
	if err := n.startContainerd(); err != nil {
		return err
	}
	n.Images = map[string]Image{}
	for _, archive := range images {
		refs, err := n.Import(archive)
		if err != nil {
			return err
		}
		maps.Copy(n.Images, refs)
	}
	return n.startKubelet()
}

// startHolder starts the process that sets up and holds the node's mount
// namespace, and waits until it is set up.
func (n *Node) startHolder() error {
	mounts, err := cgroupfs.Mounts()
	if err != nil {
		return err
	}
	if err := writeSysctlShadows(n.Dir); err != nil {
		return err
	}
	if err := writeHosts(n.Dir, n.Name); err != nil {
		return err
	}
	n.holder = n.Node.Start("sh", "-c", holderScript(n.Dir, mounts))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.holder.WaitForLog(ctx, holderReady); err != nil {
		return fmt.Errorf("set up the mount namespace: %w", err)
	}
	return nil
}

// startInside starts a program in the node's network and mount namespaces,
// with temporary files in the node's directory (the rest of the root
// filesystem is read-only there).
func (n *Node) startInside(args ...string) *testbed.Process {
	mnt := "--mount=/proc/" + strconv.Itoa(n.holder.Pid()) + "/ns/mnt"
	return n.Node.Start(append([]string{"nsenter", mnt, "--", "env", "TMPDIR=" + filepath.Join(n.Dir, "tmp")}, args...)...)
}

// stopTimeout bounds each step of stop.
const stopTimeout = 10 * time.Second

// stop stops the kubelet first, so that it restarts nothing, then kills
// every process in the node's cgroups (the containers) and removes the
// cgroups, then stops containerd and its shims (in the node's network
// namespace, not in its cgroups), then the mount namespace's holder.
func (n *Node) stop() {
	n.stopOnce.Do(n.stopNow)
}

func (n *Node) stopNow() {
	if n.kubelet != nil {
		n.kubelet.Stop(stopTimeout)
	}
	if err := cgroupfs.Remove(n.CgroupParent, stopTimeout); err != nil {
		// Logged, not fatal: the bed's cleanup kills what is left in the
		// node's network namespace, and a later Sweep removes the cgroups.
		fmt.Fprintf(os.Stderr, "kubenode %s: %v\n", n.Name, err)
	}
	if n.containerd != nil {
		n.containerd.Stop(stopTimeout)
	}
	for _, pid := range n.shims() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if n.holder != nil {
		n.holder.Kill()
	}
}

// shims lists the containerd shims still running for this node: those whose
// command line names its containerd's socket.
func (n *Node) shims() []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), "containerd-shim") && strings.Contains(string(cmdline), n.Socket) {
			pids = append(pids, pid)
		}
	}
	return pids
}
