// Package cgroupfs creates, empties and removes one cgroup in every cgroup
// hierarchy of the machine: the parent under which a test's kubelet puts its
// pods (e2e/kubenode), so that nothing a test runs lands in a cgroup it did
// not create, and what a test leaves there can be found and removed by name.
//
// It reads the hierarchies from /proc/self/mountinfo, and so works on the
// cgroup v1 layout of our test machines (one mount per controller under a
// tmpfs at /sys/fs/cgroup, plus name=systemd and an empty cgroup2 at
// /sys/fs/cgroup/unified) as well as on a cgroup2-only machine.
package cgroupfs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Mount is one mounted filesystem under /sys/fs/cgroup.
type Mount struct {
	// Point is where it is mounted ("/sys/fs/cgroup/memory").
	Point string
	// Type is "cgroup" (v1), "cgroup2" or "tmpfs" (the directory holding
	// the v1 hierarchies).
	Type string
	// Options are the superblock options that select a v1 hierarchy
	// ("memory", "cpu,cpuacct", "none,name=systemd"); empty for the others.
	Options string
}

// Root is where the machine mounts its cgroup filesystems.
const Root = "/sys/fs/cgroup"

// Mounts lists the filesystems mounted at and under Root, parents first.
func Mounts() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, ok := parseMountinfo(sc.Text())
		if ok && (m.Point == Root || strings.HasPrefix(m.Point, Root+"/")) {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(out, Mount.isHierarchy) {
		return nil, fmt.Errorf("no cgroup filesystem mounted under %s", Root)
	}
	// mountinfo lists mounts in mount order, so a parent precedes its
	// children; a stable sort by depth keeps that when entries are unusual.
	slices.SortStableFunc(out, func(a, b Mount) int {
		return strings.Count(a.Point, "/") - strings.Count(b.Point, "/")
	})
	return out, nil
}

// parseMountinfo reads one line of /proc/self/mountinfo:
//
//	36 25 0:31 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
func parseMountinfo(line string) (Mount, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	if !ok {
		return Mount{}, false
	}
	f, g := strings.Fields(pre), strings.Fields(post)
	if len(f) < 5 || len(g) < 3 {
		return Mount{}, false
	}
	m := Mount{Point: unescape(f[4]), Type: g[0]}
	if m.Type == "cgroup" {
		var opts []string
		for o := range strings.SplitSeq(g[2], ",") {
			if o != "rw" && o != "ro" {
				opts = append(opts, o)
			}
		}
		m.Options = strings.Join(opts, ",")
	}
	return m, true
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (m Mount) isHierarchy() bool { return m.Type == "cgroup" || m.Type == "cgroup2" }

// hierarchies are the cgroup mounts of Mounts.
func hierarchies() ([]Mount, error) {
	all, err := Mounts()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(m Mount) bool { return !m.isHierarchy() }), nil
}

// Create makes cgroup name ("nfp1a2b3-node1", a single path element) in every
// hierarchy. A v1 cpuset cgroup starts without CPUs and memory nodes, and no
// process can join it nor a child be made in it until they are set: Create
// gives it its parent's.
func Create(name string) error {
	if name == "" || strings.Contains(name, "/") || name == "." || name == ".." {
		return fmt.Errorf("cgroup name %q: one path element", name)
	}
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := filepath.Join(h.Point, name)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if h.Type == "cgroup" && slices.Contains(strings.Split(h.Options, ","), "cpuset") {
			for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h.Point, file))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, file), v, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(dir, file), err)
				}
			}
		}
	}
	return nil
}

// Procs lists the processes in cgroup name and its descendants, in any
// hierarchy.
func Procs(name string) []int {
	hs, err := hierarchies()
	if err != nil {
		return nil
	}
	seen := map[int]bool{}
	for _, h := range hs {
		filepath.WalkDir(filepath.Join(h.Point, name), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(path)
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for pid := range seen {
		pids = append(pids, pid)
	}
	slices.Sort(pids)
	return pids
}

// Remove kills every process left in cgroup name and its descendants and
// removes them all, in every hierarchy, children first. A cgroup can only be
// removed once its last process has exited, so Remove retries for up to
// timeout. A name that does not exist is not an error.
func Remove(name string, timeout time.Duration) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for {
		for _, pid := range Procs(name) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		var errs []error
		for _, h := range hs {
			errs = append(errs, removeTree(filepath.Join(h.Point, name)))
		}
		err := errors.Join(errs...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// removeTree removes the cgroup directory dir and its descendants, deepest
// first (a cgroup directory is removed with rmdir although it lists files).
// A directory that vanishes during the walk (runc removing a container's
// cgroup while the node stops) is skipped, not taken for the whole tree
// being gone: that left a node's blkio hierarchy behind once.
func removeTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range slices.Backward(dirs) {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Names lists the cgroups directly under the hierarchies' roots whose names
// match pattern (filepath.Match syntax), each once.
func Names(pattern string) []string {
	hs, err := hierarchies()
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	for _, h := range hs {
		matches, _ := filepath.Glob(filepath.Join(h.Point, pattern))
		for _, m := range matches {
			if st, err := os.Stat(m); err == nil && st.IsDir() {
				seen[filepath.Base(m)] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
