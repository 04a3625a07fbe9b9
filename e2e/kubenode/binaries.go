package kubenode

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/e2e/testbed/cgroupfs"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// Binaries are the programs a kubenode runs.
type Binaries struct {
	// Kubelet, ControllerManager and Scheduler are upstream's newest release
	// (e2e/tools/versions), built by `e2e/tools/build.sh --kubelet` from the
	// module e2e/tools/kubenode.
	Kubelet, ControllerManager, Scheduler string
	// Kubectl and Kubeadm are built by e2e/tools/build.sh.
	Kubectl, Kubeadm string
	// Containerd, Ctr and Runc are the machine's (Debian's containerd and
	// runc packages; e2e/tools/deps.sh installs them). containerd finds
	// containerd-shim-runc-v2 and runc on the PATH.
	Containerd, Ctr, Runc string
}

// debianTools are the programs of Binaries that come from Debian packages,
// with their package, and the shim containerd starts.
var debianTools = map[string]string{
	"containerd":              "containerd",
	"ctr":                     "containerd",
	"containerd-shim-runc-v2": "containerd",
	"runc":                    "runc",
}

// EnsureBinaries builds what is missing (`e2e/tools/build.sh --kubelet`, a
// no-op when up to date) and returns every program's path. It fails the test
// when a build fails or a Debian package is missing.
func EnsureBinaries(t testbed.TB) Binaries {
	t.Helper()
	script := filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "build.sh")
	if out, err := exec.Command(script, "--kubelet").CombinedOutput(); err != nil {
		t.Fatalf("%s --kubelet: %v\n%s", script, err, out)
	}
	bin := kubebin.Dir(kubebin.Pinned().Kubernetes)
	b := Binaries{
		Kubelet:           filepath.Join(bin, "kubelet"),
		ControllerManager: filepath.Join(bin, "kube-controller-manager"),
		Scheduler:         filepath.Join(bin, "kube-scheduler"),
		Kubectl:           filepath.Join(bin, "kubectl"),
		Kubeadm:           filepath.Join(bin, "kubeadm"),
	}
	for _, p := range []string{b.Kubelet, b.ControllerManager, b.Scheduler, b.Kubectl, b.Kubeadm} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v (built by %s --kubelet)", err, script)
		}
	}
	found := map[string]string{}
	for tool, pkg := range debianTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("needs %s (Debian package %s; e2e/tools/deps.sh installs it)", tool, pkg)
		}
		found[tool] = p
	}
	b.Containerd, b.Ctr, b.Runc = found["containerd"], found["ctr"], found["runc"]
	return b
}

// Versions describes the programs and the machine, for the test's log and
// for a report of what stopped a node.
func (b Binaries) Versions() string {
	var lines []string
	for _, c := range [][]string{
		{b.Kubelet, "--version"},
		{b.Containerd, "--version"},
		{b.Runc, "--version"},
		{"uname", "-sr"},
	} {
		out, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		first, _, _ := strings.Cut(string(bytes.TrimSpace(out)), "\n")
		if err != nil {
			first = fmt.Sprintf("%s: %v %s", c[0], err, first)
		}
		lines = append(lines, first)
	}
	lines = append(lines, "cgroups: "+cgroupLayout())
	return strings.Join(lines, "; ")
}

// cgroupLayout says which cgroup hierarchies the machine mounts.
func cgroupLayout() string {
	ms, err := cgroupfs.Mounts()
	if err != nil {
		return err.Error()
	}
	var v1 []string
	v2 := false
	for _, m := range ms {
		switch m.Type {
		case "cgroup":
			v1 = append(v1, m.Options)
		case "cgroup2":
			v2 = true
		}
	}
	switch {
	case len(v1) == 0:
		return "v2 only"
	case v2:
		return "v1 (" + strings.Join(v1, " ") + ") with an empty v2 hierarchy beside"
	default:
		return "v1 (" + strings.Join(v1, " ") + ")"
	}
}
