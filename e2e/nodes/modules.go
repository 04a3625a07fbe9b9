package nodes

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// moduleDirs are the directories of a kernel's modules tree (under
// kernel/) whose every module a node loads: nftables and its expressions,
// conntrack and NAT, the xtables and IPVS modules other proxies use,
// SCTP, and the bridge with its netfilter hooks.
var moduleDirs = []string{"net/netfilter", "net/ipv4/netfilter", "net/ipv6/netfilter", "net/sctp", "net/bridge"}

// moduleNames are the other modules a node loads: the links tests create,
// the sock_diag family that ss and conntrack's tests read sockets with,
// and virtio's PCI transport and serial ports, which carry a job's output
// to the host (run.go). A name the kernel has built in is no error.
var moduleNames = []string{"veth", "dummy", "netlink_diag", "inet_diag", "tcp_diag", "udp_diag", "raw_diag",
	"virtio_pci", "virtio_console"}

// optionalModules are loaded by name at run time, so no depends= names
// them: the string-matching algorithms of textsearch (nf_conntrack_amanda
// does not load without ts_kmp; xt_string). A kernel may lack them.
var optionalModules = []string{"ts_kmp", "ts_bm", "ts_fsm"}

// preloadModules are loaded before all others, in this order, when the
// kernel has them as modules. libcrc32c (nf_conntrack and SCTP need it)
// finds its implementation through the crypto API at load time and fails
// with "unknown symbol" unless one is loaded already: its softdep on
// crc32c is for modprobe, which does not load everything in order. Kernels
// from 6.14 have crc32c in the library, built in.
var preloadModules = []string{"crc32c_generic", "crc32c_intel", "libcrc32c"}

// moduleSelection names the modules a node gets, for the cache: a kernel
// staged with another selection is staged again.
func moduleSelection() string {
	return strings.Join(slices.Concat(moduleDirs, moduleNames, preloadModules, optionalModules), " ")
}

// moduleName is the name the kernel knows a module file by.
func moduleName(file string) string {
	base := path.Base(file)
	for _, ext := range []string{".ko.xz", ".ko.zst", ".ko.gz", ".ko"} {
		if strings.HasSuffix(base, ext) {
			return strings.ReplaceAll(strings.TrimSuffix(base, ext), "-", "_")
		}
	}
	return ""
}

// kernelModule is a module staged for the initramfs.
type kernelModule struct {
	Name    string
	Path    string   // in the guest: usr/lib/modules/<abi>/kernel/…/x.ko
	Depends []string // names, from the module's modinfo
}

// stageModules decompresses the modules a node loads, and those they depend
// on, from the kernel package's tree under extracted (a merged root) into
// stage (a merged root too: stage/usr/lib/modules/<abi>), runs busybox's
// depmod there for modprobe, and returns the modules in the order to load
// them: every module after those it depends on.
func stageModules(ctx context.Context, extracted, abi, stage string, busybox []string) ([]kernelModule, error) {
	rel := path.Join("usr/lib/modules", abi)
	src := filepath.Join(extracted, rel)
	files := map[string]string{} // name → path under src
	err := filepath.WalkDir(filepath.Join(src, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name := moduleName(p); name != "" && !d.IsDir() {
			r, _ := filepath.Rel(src, p)
			files[name] = filepath.ToSlash(r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("modules of %s: %w", abi, err)
	}
	builtin, err := builtinModules(filepath.Join(src, "modules.builtin"))
	if err != nil {
		return nil, err
	}

	var queue []string
	for name, f := range files {
		for _, dir := range moduleDirs {
			if strings.HasPrefix(f, "kernel/"+dir+"/") {
				queue = append(queue, name)
			}
		}
	}
	for _, name := range moduleNames {
		if files[name] == "" && !builtin[name] {
			return nil, fmt.Errorf("kernel %s has no module %s, built in or not", abi, name)
		}
		queue = append(queue, name)
	}
	queue = append(queue, preloadModules...)
	queue = append(queue, optionalModules...)

	staged := map[string]*kernelModule{}
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		f := files[name]
		if staged[name] != nil || f == "" {
			continue // done, built in, or a preload module this kernel lacks
		}
		out := path.Join(rel, strings.TrimSuffix(f, path.Ext(f)))
		if path.Ext(f) == ".ko" {
			out = path.Join(rel, f)
		}
		data, err := decompressModule(ctx, filepath.Join(src, f))
		if err != nil {
			return nil, err
		}
		deps, err := moduleDepends(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if err := writeFile(filepath.Join(stage, out), bytes.NewReader(data), 0o644); err != nil {
			return nil, err
		}
		for _, d := range deps {
			if files[d] == "" && !builtin[d] {
				return nil, fmt.Errorf("%s depends on %s, which kernel %s does not have", name, d, abi)
			}
		}
		staged[name] = &kernelModule{Name: name, Path: out, Depends: deps}
		queue = append(queue, deps...)
	}
	for _, meta := range []string{"modules.builtin", "modules.builtin.modinfo", "modules.order"} {
		if data, err := os.ReadFile(filepath.Join(src, meta)); err == nil {
			if err := writeFile(filepath.Join(stage, rel, meta), bytes.NewReader(data), 0o644); err != nil {
				return nil, err
			}
		}
	}
	// busybox depmod -b BASE reads BASE/lib/modules/<abi>.
	cmd := exec.CommandContext(ctx, busybox[0], append(busybox[1:], "depmod", "-b", filepath.Join(stage, "usr"), abi)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("busybox depmod for %s: %w: %s", abi, err, out)
	}
	return loadOrder(staged)
}

// loadOrder sorts modules so that each comes after those it depends on:
// preloadModules first, then by name among those whose dependencies are in.
func loadOrder(mods map[string]*kernelModule) ([]kernelModule, error) {
	var order []kernelModule
	loaded := map[string]bool{}
	load := func(m *kernelModule) {
		order = append(order, *m)
		loaded[m.Name] = true
	}
	for _, name := range preloadModules {
		if m := mods[name]; m != nil {
			for _, d := range m.Depends {
				if mods[d] != nil && !loaded[d] {
					return nil, fmt.Errorf("preloaded module %s depends on %s", name, d)
				}
			}
			load(m)
		}
	}
	names := make([]string, 0, len(mods))
	for name := range mods {
		names = append(names, name)
	}
	slices.Sort(names)
	for len(order) < len(mods) {
		progress := false
		for _, name := range names {
			m := mods[name]
			waiting := slices.ContainsFunc(m.Depends, func(d string) bool { return mods[d] != nil && !loaded[d] })
			if loaded[name] || waiting {
				continue
			}
			load(m)
			progress = true
		}
		if !progress {
			var stuck []string
			for _, name := range names {
				if !loaded[name] {
					stuck = append(stuck, name)
				}
			}
			return nil, fmt.Errorf("modules depend on each other in a cycle: %v", stuck)
		}
	}
	return order, nil
}

// builtinModules reads modules.builtin: the modules compiled into the
// kernel, which modinfo's depends= never names but modprobe accepts.
func builtinModules(file string) (map[string]bool, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	builtin := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name := moduleName(sc.Text()); name != "" {
			builtin[name] = true
		}
	}
	return builtin, sc.Err()
}

// decompressModule reads a module file, decompressed (Debian's kernels
// ship modules uncompressed up to 6.1, xz-compressed since).
func decompressModule(ctx context.Context, file string) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(file, ".ko"):
		return os.ReadFile(file)
	case strings.HasSuffix(file, ".ko.gz"):
		f, err := os.Open(file)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(file, ".ko.xz"):
		tool = "xz"
	case strings.HasSuffix(file, ".ko.zst"):
		tool = "zstd"
	default:
		return nil, fmt.Errorf("%s: not a kernel module", file)
	}
	out, err := exec.CommandContext(ctx, tool, "-dc", file).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc %s: %w", tool, file, err)
	}
	return out, nil
}

// moduleDepends reads the depends= entry of a module's .modinfo section:
// the modules whose symbols it uses, comma-separated names.
func moduleDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	info, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, entry := range bytes.Split(info, []byte{0}) {
		if v, ok := bytes.CutPrefix(entry, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(strings.ReplaceAll(string(v), "-", "_"), ","), nil
		}
	}
	return nil, nil
}
