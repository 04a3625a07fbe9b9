package cgroupfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestParseMountinfo(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Mount
	}{
		{"36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory",
			Mount{Point: "/sys/fs/cgroup/memory", Type: "cgroup", Options: "memory"}},
		{"37 25 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct",
			Mount{Point: "/sys/fs/cgroup/cpu,cpuacct", Type: "cgroup", Options: "cpu,cpuacct"}},
		{"40 25 0:35 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd",
			Mount{Point: "/sys/fs/cgroup/systemd", Type: "cgroup", Options: "xattr,name=systemd"}},
		{"41 25 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate",
			Mount{Point: "/sys/fs/cgroup/unified", Type: "cgroup2"}},
		{"25 20 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755",
			Mount{Point: "/sys/fs/cgroup", Type: "tmpfs"}},
		{`50 1 8:1 / /mnt/a\040b rw - ext4 /dev/sda1 rw`,
			Mount{Point: "/mnt/a b", Type: "ext4"}},
	} {
		got, ok := parseMountinfo(tc.line)
		if !ok || got != tc.want {
			t.Errorf("parseMountinfo(%q) = %+v, %v; want %+v", tc.line, got, ok, tc.want)
		}
	}
	if _, ok := parseMountinfo("garbage"); ok {
		t.Error("parseMountinfo(garbage) succeeded")
	}
}

// TestCreateRemove makes a cgroup in every hierarchy of this machine, puts a
// process in a child of it and checks that Remove kills the process and
// removes both.
func TestCreateRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	hs, err := hierarchies()
	if err != nil {
		t.Skip(err)
	}
	name := fmt.Sprintf("nftproxy-cgroupfs-test-%d", os.Getpid())
	t.Cleanup(func() { Remove(name, 5*time.Second) })
	if err := Create(name); err != nil {
		t.Fatal(err)
	}
	// The first hierarchy receives the process (a v1 cgroup of one
	// controller is enough for Procs and Remove to find it).
	child := filepath.Join(hs[0].Point, name, "child")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer sleep.Process.Kill()
	if err := os.WriteFile(filepath.Join(child, "cgroup.procs"), fmt.Appendf(nil, "%d", sleep.Process.Pid), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Procs(name); !slices.Equal(got, []int{sleep.Process.Pid}) {
		t.Fatalf("Procs = %v, want [%d]", got, sleep.Process.Pid)
	}
	if got := Names("nftproxy-cgroupfs-test-*"); !slices.Contains(got, name) {
		t.Fatalf("Names = %v, want it to hold %s", got, name)
	}
	done := make(chan error, 1)
	go func() { done <- sleep.Wait() }()
	if err := Remove(name, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the process in the cgroup was not killed")
	}
	for _, h := range hs {
		if _, err := os.Stat(filepath.Join(h.Point, name)); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", filepath.Join(h.Point, name), err)
		}
	}
}
