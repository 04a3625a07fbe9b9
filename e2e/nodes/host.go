package nodes

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Userland is a release's userland unpacked on this machine: the packages
// a node of the release holds (nftables, iproute2, conntrack, iptables,
// ...) with the libraries they need and the release's own loader and
// glibc. Command runs its tools here, on this machine's kernel, without
// installing anything: a release's nft against the kernel nftproxy's
// other tests run on.
type Userland struct {
	Release Release
	// Prepared says what PrepareUserland did to get it (no kernel, no
	// initramfs).
	Prepared Preparation

	root     string            // the merged root
	loader   string            // the release's ld-linux, under root
	packages map[string]string // name → version, of every package unpacked
}

// PrepareUserland fetches and unpacks a release's userland as Prepare
// does, and nothing else: no kernel, no initramfs. It shares Prepare's
// cache (Dir(cache, r)), lock and package lists, so that a Node prepared
// later finds the userland unpacked.
func PrepareUserland(ctx context.Context, r Release, cache string) (*Userland, error) {
	start := time.Now()
	u := &Userland{Release: r}
	p := &u.Prepared
	dir, apt, unlock, err := openRelease(ctx, r, cache, p)
	if err != nil {
		return nil, err
	}
	defer unlock()
	pkgs, err := apt.resolve(ctx, toolPackages...)
	if err != nil {
		return nil, err
	}
	u.packages = versions(pkgs)
	debs := filepath.Join(dir, "debs")
	if err := fetch(ctx, apt, debs, pkgs, p); err != nil {
		return nil, err
	}
	// The kernel's packages stay for Prepare, which prunes them.
	if err := pruneDir(debs, func(file string) bool {
		return strings.HasPrefix(file, "linux-") || slices.ContainsFunc(pkgs, func(p debPackage) bool { return p.File() == file })
	}); err != nil {
		return nil, err
	}
	t := time.Now()
	unpacked, built, err := prepareUserland(ctx, dir, debs, pkgs)
	if err != nil {
		return nil, err
	}
	if built {
		p.Built = append(p.Built, "userland")
	}
	p.Unpack = time.Since(t)
	u.root = unpacked.Root
	_, loader, err := resolveIn(u.root, r.arch().Loader)
	if err != nil {
		return nil, fmt.Errorf("%s: the loader: %w", r.Suite, err)
	}
	u.loader = filepath.Join(u.root, loader)
	p.Total = time.Since(start)
	return u, nil
}

// Root is the directory the userland is unpacked in, merged-/usr.
func (u *Userland) Root() string { return u.root }

// Tool returns the Debian version of the package that ships a tool, as
// Node.Tool does.
func (u *Userland) Tool(name string) string { return u.packages[tools[name]] }

// Command returns the command that runs one of the userland's programs
// ("nft", "ip", "iptables-nft", ...: a name in its /usr/sbin or /usr/bin)
// with args on this machine: the release's loader runs it with the
// release's libraries only (--library-path), so that its glibc and
// libnftables, not this machine's, serve it. A multi-call program keeps the
// name it was called by (the loader gets the path of its link). The
// command's Args can be given to another runner as they are, e.g. to run
// the tool inside a network namespace (`ip netns exec <name> Args...`).
func (u *Userland) Command(tool string, args ...string) (*exec.Cmd, error) {
	var program string
	for _, dir := range []string{"usr/sbin", "usr/bin"} {
		p := filepath.Join(dir, tool)
		if _, err := os.Lstat(filepath.Join(u.root, p)); err != nil {
			continue
		}
		// The loader follows the links on this machine: they must lead
		// inside the root (Debian's relative ones do; alternatives'
		// absolute ones, made by maintainer scripts, are not unpacked).
		links, final, err := resolveIn(u.root, p)
		if err != nil {
			return nil, fmt.Errorf("%s's %s: %w", u.Release.Suite, tool, err)
		}
		program = filepath.Join(u.root, p)
		for _, l := range links {
			if target, _ := os.Readlink(filepath.Join(u.root, l)); filepath.IsAbs(target) {
				program = filepath.Join(u.root, final)
			}
		}
		break
	}
	if program == "" {
		return nil, fmt.Errorf("%s's userland has no program %s", u.Release.Suite, tool)
	}
	if a := u.Release.arch(); a.GOARCH != runtime.GOARCH {
		return nil, fmt.Errorf("%s's %s is for %s: it runs in a node, not on this %s machine", u.Release.Name(), tool, a.Debian, runtime.GOARCH)
	}
	libs := make([]string, len(libraryDirs))
	for i, d := range libraryDirs {
		libs[i] = filepath.Join(u.root, d)
	}
	argv := append([]string{"--library-path", strings.Join(libs, ":"), program}, args...)
	cmd := exec.Command(u.loader, argv...)
	return cmd, nil
}
