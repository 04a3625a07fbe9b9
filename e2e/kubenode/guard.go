package kubenode

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/e2e/testbed/cgroupfs"
)

// machinePaths are where the kubelet, containerd, the CNI plugins
// (host-local's leases in /var/lib/cni) and the controller manager keep
// their files by default. A node must create none of them.
var machinePaths = []string{
	"/var/lib/kubelet",
	"/var/lib/containerd",
	"/etc/kubernetes",
	"/usr/libexec/kubernetes",
	"/var/log/pods",
	"/var/log/containers",
	"/etc/cni",
	"/opt/cni",
	"/var/lib/cni",
	"/opt/containerd",
	"/run/containerd",
	// skopeo's blob cache (make conformance pushes images with it).
	"/var/lib/containers",
}

// CheckMachineUntouched records what the nodes and controllers of the bed
// with the given prefix could change on the machine (machinePaths, the
// kubelet's kernel settings) and, when the test ends, fails it if any of it
// changed or a cgroup named after the bed is left. Call it after
// testbed.Start and before Start, so that it runs after the nodes have
// stopped.
func CheckMachineUntouched(t testing.TB, prefix string) {
	t.Helper()
	before := machineState()
	t.Cleanup(func() {
		after := machineState()
		for k, v := range before {
			if after[k] != v {
				t.Errorf("the machine changed during the test: %s was %q, is %q", k, v, after[k])
			}
		}
		if left := cgroupfs.Names(prefix + "-*"); len(left) > 0 {
			t.Errorf("cgroups left behind: %v", left)
		}
	})
}

// machineState maps each of machinePaths to whether it exists and each of
// the kubelet's sysctls to its value.
func machineState() map[string]string {
	state := map[string]string{}
	for _, p := range machinePaths {
		_, err := os.Lstat(p)
		switch {
		case err == nil:
			state[p] = "exists"
		case errors.Is(err, fs.ErrNotExist):
			state[p] = "absent"
		default:
			state[p] = err.Error()
		}
	}
	for _, sc := range kubeletSysctls {
		p := filepath.Join("/proc/sys", sc.path)
		v, err := os.ReadFile(p)
		if err != nil {
			state[p] = err.Error()
			continue
		}
		state[p] = strings.TrimSpace(string(v))
	}
	return state
}
