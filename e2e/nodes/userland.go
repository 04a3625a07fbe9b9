package nodes

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// toolPackages are the packages of a release whose programs a node runs,
// with every file they ship but documentation: nft, ip and conntrack read
// back what nftproxy programs; iptables-nft writes the chains of
// kube-proxy's iptables mode that proxier/leftovers finds. dash is
// /bin/sh, as on any Debian machine: Debian's busybox-static is built to
// prefer its own applets to the PATH (FEATURE_SH_STANDALONE), so its sh
// would run busybox's ip for "ip netns add" in a script; busybox provides
// the rest (mount, insmod, modprobe, stty, poweroff, sysctl, ...). apt
// resolves their dependencies; of those, a node holds the shared
// libraries the programs load (libraries), nothing else.
var toolPackages = []string{"nftables", "iproute2", "conntrack", "iptables", "busybox-static", "netbase", "dash"}

// tools maps the programs Node.Tool knows to the packages that ship them.
var tools = map[string]string{
	"nft":       "nftables",
	"ip":        "iproute2",
	"conntrack": "conntrack",
	"iptables":  "iptables",
	"busybox":   "busybox-static",
	"sh":        "dash",
}

// skippedDirs hold what a node does not need of a tool package.
var skippedDirs = []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/locale/",
	"usr/share/lintian/", "usr/share/bash-completion/", "usr/share/zsh/", "usr/share/fish/",
	"usr/lib/systemd/", "etc/init.d/", "etc/systemd/"}

// libraryDirs are where a Debian system's loader finds libraries without an
// ld.so.cache (glibc's built-in search path), merged, for each of archs: a
// root holds one architecture's.
var libraryDirs = []string{"usr/lib/" + archs["amd64"].Triplet, "usr/lib/" + archs["arm64"].Triplet, "usr/lib"}

// optionalLibraries are loaded with dlopen, so no program names them:
// glibc before 2.34 (bullseye) reads /etc/protocols and /etc/services, for
// nft's "tcp" and "http", through libnss_files.
var optionalLibraries = []string{"libnss_files.so.2"}

// userlandPaths returns the paths of root (merged, unpacked from the
// resolved packages; files lists each package's) a node holds: the tool
// packages' files and links, and every shared library their programs need
// (DT_NEEDED, transitively) with the loader (PT_INTERP) and the links that
// lead to them. A program whose library no package provides is an error:
// it would not run in the guest.
func userlandPaths(root string, files map[string][]string) ([]string, error) {
	selected := map[string]bool{}
	var elfs []string
	for _, pkg := range toolPackages {
		list, ok := files[pkg]
		if !ok {
			return nil, fmt.Errorf("package %s was not unpacked", pkg)
		}
		for _, p := range list {
			if slices.ContainsFunc(skippedDirs, func(d string) bool { return strings.HasPrefix(p, d) }) {
				continue
			}
			selected[p] = true
			// Programs, not plugins: tc's q_atm.so needs libatm, which
			// iproute2 only recommends; tc loads it for ATM qdiscs only.
			if strings.HasSuffix(path.Dir(p), "bin") && isELF(filepath.Join(root, p)) {
				elfs = append(elfs, p)
			}
		}
	}
	add := func(p string) (string, error) {
		links, final, err := resolveIn(root, p)
		if err != nil {
			return "", err
		}
		for _, l := range links {
			if !slices.Contains(mergedDirs, l) { // every node has those
				selected[l] = true
			}
		}
		selected[final] = true
		return final, nil
	}
	for _, lib := range optionalLibraries {
		if p := findLibrary(root, lib); p != "" {
			final, err := add(p)
			if err != nil {
				return nil, err
			}
			elfs = append(elfs, final)
		}
	}
	done := map[string]bool{}
	for len(elfs) > 0 {
		p := elfs[0]
		elfs = elfs[1:]
		if done[p] {
			continue
		}
		done[p] = true
		interp, needed, err := elfDeps(filepath.Join(root, p))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if interp != "" {
			final, err := add(strings.TrimPrefix(interp, "/"))
			if err != nil {
				return nil, fmt.Errorf("%s's loader: %w", p, err)
			}
			elfs = append(elfs, final)
		}
		for _, lib := range needed {
			found := findLibrary(root, lib)
			if found == "" {
				return nil, fmt.Errorf("/%s needs %s, which no unpacked package provides", p, lib)
			}
			final, err := add(found)
			if err != nil {
				return nil, err
			}
			elfs = append(elfs, final)
		}
	}
	paths := make([]string, 0, len(selected))
	for p := range selected {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths, nil
}

// findLibrary returns the path under root of the library named soname, or
// "" when no library directory has it.
func findLibrary(root, soname string) string {
	for _, dir := range libraryDirs {
		p := path.Join(dir, soname)
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			return p
		}
	}
	return ""
}

// isELF says whether file is a regular file starting with ELF's magic.
func isELF(file string) bool {
	st, err := os.Lstat(file)
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	magic := make([]byte, 4)
	n, _ := f.Read(magic)
	return n == 4 && bytes.Equal(magic, []byte(elf.ELFMAG))
}

// elfDeps returns an ELF file's program interpreter (empty for static
// programs and libraries) and the libraries it names (DT_NEEDED).
func elfDeps(file string) (interp string, needed []string, err error) {
	f, err := elf.Open(file)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", nil, err
			}
			interp = string(bytes.TrimRight(b, "\x00"))
		}
	}
	needed, err = f.ImportedLibraries()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return "", nil, err
	}
	return interp, needed, nil
}

// busyboxApplets returns the paths (merged, without leading slash) busybox
// installs its applets at, less those whose name a tool package's program
// has: a node's ip, nft and ss are the release's, never busybox's.
func busyboxApplets(ctx context.Context, root string, selected []string, a archSpec) ([]string, error) {
	busybox := a.hostCommand(filepath.Join(root, "usr/bin/busybox"))
	out, err := exec.CommandContext(ctx, busybox[0], append(busybox[1:], "--list-full")...).Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	programs := map[string]bool{}
	have := map[string]bool{}
	for _, p := range selected {
		have[p] = true
		if dir := path.Dir(p); strings.HasSuffix(dir, "bin") {
			programs[path.Base(p)] = true
		}
	}
	var applets []string
	for _, line := range strings.Fields(string(out)) {
		p := mergedPath(path.Clean(line))
		if programs[path.Base(p)] || have[p] || p == "usr/bin/busybox" {
			continue
		}
		applets = append(applets, p)
	}
	return applets, nil
}

// statMode returns the permissions of a file under root.
func statMode(root, p string) (fs.FileMode, error) {
	st, err := os.Lstat(filepath.Join(root, p))
	if err != nil {
		return 0, err
	}
	return st.Mode(), nil
}
