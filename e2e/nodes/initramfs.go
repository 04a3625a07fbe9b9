package nodes

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// initScript is the initramfs's /init (init.sh).
//
//go:embed init.sh
var initScript string

// nsswitch makes glibc read /etc's files only: a node has no other source
// of users, hosts, protocols or services.
const nsswitch = `passwd: files
group: files
shadow: files
hosts: files
networks: files
protocols: files
services: files
ethers: files
rpc: files
`

// etcFiles are the small files of /etc a node gets besides its packages'.
var etcFiles = map[string]string{
	"etc/nsswitch.conf": nsswitch,
	"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\n",
	"etc/group":         "root:x:0:\ntty:x:5:\n",
	"etc/hosts":         "127.0.0.1\tlocalhost node\n::1\tlocalhost ip6-localhost ip6-loopback\n",
}

// initramfsContent is what a Node's base archive holds.
type initramfsContent struct {
	UserRoot  string   // the merged root unpacked from the release's packages
	UserPaths []string // what of it to copy (userlandPaths)
	Applets   []string // busybox's applets, as links to it
	Stage     string   // the merged root holding the staged modules
	Modules   []kernelModule
}

// writeInitramfs writes the Node's base archive to dst: a merged-/usr root
// with the release's tools and their libraries, busybox, the modules and
// /init. Run appends a job's archive to a copy of it.
func writeInitramfs(dst string, c initramfsContent) error {
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	w := newCPIOWriter(f)
	for _, d := range []string{"/dev", "/proc", "/sys", "/run", "/root", "/etc", "/var", "/mnt", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib64"} {
		perm := os.FileMode(0o755)
		if d == "/root" {
			perm = 0o700
		}
		w.Dir(d, perm)
	}
	w.Dir("/tmp", 0o1777)
	// The kernel opens /dev/console for /init before /init mounts devtmpfs.
	w.CharDev("/dev/console", 0o600, 5, 1)
	for _, d := range mergedDirs {
		w.Symlink("/"+d, "usr/"+d)
	}
	w.Symlink("/var/run", "../run")
	for _, p := range c.UserPaths {
		if err := addFromRoot(w, c.UserRoot, p); err != nil {
			return err
		}
	}
	for _, p := range c.Applets {
		w.Symlink("/"+p, "/usr/bin/busybox")
	}
	for name, content := range etcFiles {
		if !slices.Contains(c.UserPaths, name) {
			w.Bytes("/"+name, 0o644, []byte(content))
		}
	}
	err = filepath.WalkDir(c.Stage, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(c.Stage, p)
		return addFromRoot(w, c.Stage, filepath.ToSlash(rel))
	})
	if err != nil {
		return err
	}
	var list strings.Builder
	for _, m := range c.Modules {
		fmt.Fprintf(&list, "%s /%s\n", m.Name, m.Path)
	}
	w.Bytes("/etc/nodes/modules", 0o644, []byte(list.String()))
	w.Bytes("/init", 0o755, []byte(initScript))
	if err := w.Close(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", dst, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// addFromRoot adds the file or link p of root at /p.
func addFromRoot(w *cpioWriter, root, p string) error {
	mode, err := statMode(root, p)
	if err != nil {
		return err
	}
	switch {
	case mode&os.ModeSymlink != 0:
		target, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			return err
		}
		w.Symlink("/"+p, target)
	case mode.IsRegular():
		w.HostFile("/"+p, filepath.Join(root, p))
	case mode.IsDir():
		w.Dir("/"+p, mode.Perm())
	default:
		return fmt.Errorf("%s: unexpected file type %v", p, mode.Type())
	}
	return nil
}
