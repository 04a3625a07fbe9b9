package kubenode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/nftproxy/nftproxy/e2e/testbed/cgroupfs"
)

// kubeletSysctls are the kernel settings the kubelet checks when it starts,
// with the values it wants (setupKernelTunables in
// pkg/kubelet/cm/container_manager_linux.go, v1.36). All are global to the
// machine: inside the node's mount namespace each is shadowed by a file
// holding that value, so the kubelet finds nothing to change.
var kubeletSysctls = []struct{ path, value string }{
	{"vm/overcommit_memory", "1"},
	{"vm/panic_on_oom", "0"},
	{"kernel/panic", "10"},
	{"kernel/panic_on_oops", "1"},
	{"kernel/keys/root_maxkeys", "1000000"},
	{"kernel/keys/root_maxbytes", "25000000"},
}

// emptied are the directories the node sees as fresh, empty tmpfs: where
// containerd 1.6 and the kubelet write whatever their configuration says
// (shim sockets and runc state in /run/containerd, the device plugin socket in
// /var/lib/kubelet/device-plugins, links in /var/log/containers), and
// /dev/shm, which is the machine's.
var emptied = []string{"/run", "/var/lib", "/var/log", "/dev/shm"}

// holderReady is what the holder prints once the namespace is set up.
const holderReady = "mount namespace ready"

// holderScript is the shell script of the process that sets up and holds the
// node's mount namespace, the one `ip netns exec` made for it; containerd
// and the kubelet join it with nsenter. dir is the node's directory, mounts
// the machine's cgroup filesystems. The sysctl files and the hosts file are
// written beforehand (writeSysctlShadows, writeHosts).
func holderScript(dir string, mounts []cgroupfs.Mount) string {
	var s []string
	add := func(format string, args ...any) { s = append(s, fmt.Sprintf(format, args...)) }
	add("set -eu")
	// `ip netns exec` mounted a sysfs of the node's network namespace over
	// /sys, which hides the cgroup filesystems: mount them again.
	for _, m := range mounts {
		switch m.Type {
		case "tmpfs":
			add("mount -t tmpfs -o mode=755 cgroup %s", quote(m.Point))
		case "cgroup":
			add("mkdir -p %s && mount -t cgroup -o %s cgroup %s", quote(m.Point), quote(m.Options), quote(m.Point))
		case "cgroup2":
			add("mkdir -p %s && mount -t cgroup2 cgroup2 %s", quote(m.Point), quote(m.Point))
		}
	}
	s = append(s, readOnlyRoot(dir)...)
	for _, d := range emptied {
		add("mount -t tmpfs -o mode=755 kubenode %s", quote(d))
	}
	for _, sc := range kubeletSysctls {
		add("mount --bind %s /proc/sys/%s", quote(sysctlShadow(dir, sc.path)), sc.path)
	}
	add("mount --bind %s /etc/hosts", quote(hostsFile(dir)))
	add("echo %s", quote(holderReady))
	add("exec sleep infinity")
	return strings.Join(s, "\n") + "\n"
}

// readOnlyRoot are the commands that make the machine's root filesystem
// read-only in the current mount namespace, but for dir.
func readOnlyRoot(dir string) []string {
	return []string{
		fmt.Sprintf("mount --bind %s %s", quote(dir), quote(dir)),
		"mount -o remount,bind,ro /",
	}
}

// withReadOnlyRoot wraps a command line so that it runs with the machine's
// root filesystem read-only but for dir, which is also its TMPDIR. It is for
// programs started by `ip netns exec`, which gives each its own mount
// namespace.
func withReadOnlyRoot(dir string, args ...string) []string {
	script := strings.Join(readOnlyRoot(dir), " && ") + " && TMPDIR=" + quote(dir) + ` exec "$@"`
	return append([]string{"sh", "-c", script, "sh"}, args...)
}

// writeSysctlShadows writes the files holderScript mounts over the kubelet's
// sysctls.
func writeSysctlShadows(dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "sysctl"), 0o755); err != nil {
		return err
	}
	for _, sc := range kubeletSysctls {
		if err := os.WriteFile(sysctlShadow(dir, sc.path), []byte(sc.value+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func sysctlShadow(dir, path string) string {
	return filepath.Join(dir, "sysctl", strings.ReplaceAll(path, "/", "."))
}

// quote quotes s for sh.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// writeHosts writes the /etc/hosts the node sees: a Debian installation's,
// where localhost is both 127.0.0.1 and ::1. The machine's own may name only
// 127.0.0.1, and then a pull from "localhost:<NodePort>" (containerd
// resolving the name) never tries ::1, which is the only localhost a
// single-stack IPv6 NodePort answers on.
func writeHosts(dir, hostname string) error {
	hosts := "127.0.0.1\tlocalhost\n" +
		"127.0.1.1\t" + hostname + "\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"ff02::1\tip6-allnodes\n" +
		"ff02::2\tip6-allrouters\n"
	return os.WriteFile(hostsFile(dir), []byte(hosts), 0o644)
}

func hostsFile(dir string) string { return filepath.Join(dir, "hosts") }
