package kubenode

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/e2e/testbed/cgroupfs"
)

// TestHolderScript checks the order of the holder's set-up: cgroups mounted
// again while /sys is writable, the node's directory bound before the root
// turns read-only, then the emptied directories and the sysctl shadows, and
// the shell syntax of the whole.
func TestHolderScript(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mounts []cgroupfs.Mount
		want   []string
	}{
		{"v1", []cgroupfs.Mount{
			{Point: "/sys/fs/cgroup", Type: "tmpfs"},
			{Point: "/sys/fs/cgroup/cpu,cpuacct", Type: "cgroup", Options: "cpu,cpuacct"},
			{Point: "/sys/fs/cgroup/systemd", Type: "cgroup", Options: "none,name=systemd"},
			{Point: "/sys/fs/cgroup/unified", Type: "cgroup2"},
		}, []string{
			"mount -t tmpfs -o mode=755 cgroup '/sys/fs/cgroup'",
			"mkdir -p '/sys/fs/cgroup/cpu,cpuacct' && mount -t cgroup -o 'cpu,cpuacct' cgroup '/sys/fs/cgroup/cpu,cpuacct'",
			"mkdir -p '/sys/fs/cgroup/systemd' && mount -t cgroup -o 'none,name=systemd' cgroup '/sys/fs/cgroup/systemd'",
			"mkdir -p '/sys/fs/cgroup/unified' && mount -t cgroup2 cgroup2 '/sys/fs/cgroup/unified'",
			"mount --bind '/tmp/it'\\''s' '/tmp/it'\\''s'",
			"mount -o remount,bind,ro /",
			"mount -t tmpfs -o mode=755 kubenode '/var/lib'",
			"mount --bind '/tmp/it'\\''s/sysctl/kernel.panic' /proc/sys/kernel/panic",
			"mount --bind '/tmp/it'\\''s/hosts' /etc/hosts",
			"exec sleep infinity",
		}},
		{"v2", []cgroupfs.Mount{{Point: "/sys/fs/cgroup", Type: "cgroup2"}}, []string{
			"mkdir -p '/sys/fs/cgroup' && mount -t cgroup2 cgroup2 '/sys/fs/cgroup'",
			"mount -o remount,bind,ro /",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := holderScript("/tmp/it's", tc.mounts)
			lines := strings.Split(script, "\n")
			at := -1
			for _, w := range tc.want {
				i := indexFrom(lines, at+1, w)
				if i < 0 {
					t.Fatalf("want %q after line %d in:\n%s", w, at+1, script)
				}
				at = i
			}
			if out, err := exec.Command("sh", "-n", "-c", script).CombinedOutput(); err != nil {
				t.Fatalf("sh -n: %v: %s", err, out)
			}
		})
	}
}

func indexFrom(lines []string, from int, s string) int {
	for i := from; i < len(lines); i++ {
		if lines[i] == s {
			return i
		}
	}
	return -1
}

func TestWithReadOnlyRoot(t *testing.T) {
	got := withReadOnlyRoot("/d", "/bin/prog", "--flag=a b")
	want := []string{"sh", "-c",
		`mount --bind '/d' '/d' && mount -o remount,bind,ro / && TMPDIR='/d' exec "$@"`,
		"sh", "/bin/prog", "--flag=a b"}
	if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
		t.Fatalf("withReadOnlyRoot = %q, want %q", got, want)
	}
}

// TestHostsNamesBothLoopbacks: localhost is 127.0.0.1 and ::1 on the node,
// as on a Debian installation, whatever the machine's own hosts file says.
func TestHostsNamesBothLoopbacks(t *testing.T) {
	dir := t.TempDir()
	if err := writeHosts(dir, "node1"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(hostsFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	names := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		for _, name := range f[min(1, len(f)):] {
			names[name] = append(names[name], f[0])
		}
	}
	if got := strings.Join(names["localhost"], " "); got != "127.0.0.1 ::1" {
		t.Errorf("localhost is %q, want 127.0.0.1 and ::1", got)
	}
	if got := strings.Join(names["node1"], " "); got != "127.0.1.1" {
		t.Errorf("node1 is %q, want 127.0.1.1", got)
	}
}
