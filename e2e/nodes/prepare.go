package nodes

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Node is a Debian release ready to boot: its kernel and an initramfs of
// its userland and modules, unpacked under the cache. Run boots it.
type Node struct {
	Release Release
	// Prepared says what Prepare did to get it.
	Prepared Preparation

	cache     string            // the cache Prepare was given
	abi       string            // the kernel's release, as uname -r prints it
	vmlinuz   string            // the kernel image
	initramfs string            // the base archive
	packages  map[string]string // name → version, of every package unpacked
	modules   int
}

// Preparation is what Prepare did for a Node and how long each step took.
type Preparation struct {
	// ListsUpdated says whether it refreshed the package lists (at most
	// once a day); ListsError why it could not (it went on with the lists
	// it had).
	ListsUpdated bool
	ListsError   error
	// Downloaded are the packages it fetched ("name_version"); none when
	// the cache has them.
	Downloaded []string
	// Built lists what it unpacked or built anew: "userland", "kernel",
	// "initramfs".
	Built []string
	// Update, Download, Unpack and Initramfs are the steps' durations;
	// Total is Prepare's.
	Update, Download, Unpack, Initramfs, Total time.Duration
}

// Kernel is the kernel's release, as uname -r prints it ("6.1.0-41-amd64").
func (n *Node) Kernel() string { return n.abi }

// Tool returns the Debian version of the package that ships a tool ("nft",
// "ip", "conntrack", "busybox"), e.g. "1.0.6-2+deb12u2" for bookworm's
// nft, or "" for a tool it does not know.
func (n *Node) Tool(name string) string { return n.packages[tools[name]] }

// Packages returns the versions of every package unpacked for the node,
// by name, the kernel's included.
func (n *Node) Packages() map[string]string {
	out := make(map[string]string, len(n.packages))
	for k, v := range n.packages {
		out[k] = v
	}
	return out
}

// Modules is the number of kernel modules /init loads.
func (n *Node) Modules() int { return n.modules }

// InitramfsPath is the node's base archive (Run appends the job's).
func (n *Node) InitramfsPath() string { return n.initramfs }

// String is e.g. "bookworm (12): kernel 6.1.0-41-amd64, nft 1.0.6-2+deb12u2".
func (n *Node) String() string {
	return fmt.Sprintf("%s: kernel %s, nft %s, ip %s, conntrack %s, iptables %s, busybox %s", n.Release,
		n.abi, n.Tool("nft"), n.Tool("ip"), n.Tool("conntrack"), n.Tool("iptables"), n.Tool("busybox"))
}

// Dir is where Prepare keeps a release's files: cache/nodes/<suite>.
func Dir(cache string, r Release) string { return filepath.Join(cache, "nodes", r.Name()) }

// Prepare fetches a release's kernel and userland with apt-get (a private
// configuration under the cache: the machine's apt state is never read nor
// written), unpacks them and builds the node's initramfs, all under
// Dir(cache, r). What the cache holds already is reused: a second Prepare
// downloads nothing unless the suite's packages changed, and refreshes the
// package lists at most once a day. Processes preparing the same release
// (a Node or its Userland) wait for each other.
func Prepare(ctx context.Context, r Release, cache string) (*Node, error) {
	start := time.Now()
	n := &Node{Release: r, cache: cache}
	p := &n.Prepared
	dir, apt, unlock, err := openRelease(ctx, r, cache, p)
	if err != nil {
		return nil, err
	}
	defer unlock()
	userland, err := apt.resolve(ctx, toolPackages...)
	if err != nil {
		return nil, err
	}
	kernelDeps, err := apt.resolve(ctx, "linux-image-"+r.arch().Debian)
	if err != nil {
		return nil, err
	}
	abi, kernel, err := pickKernel(kernelDeps, r)
	if err != nil {
		return nil, err
	}
	n.abi = abi
	n.packages = versions(append(slices.Clone(userland), kernel...))

	debs := filepath.Join(dir, "debs")
	if err := fetch(ctx, apt, debs, append(slices.Clone(userland), kernel...), p); err != nil {
		return nil, err
	}
	if err := pruneDir(debs, func(file string) bool {
		return slices.ContainsFunc(append(slices.Clone(userland), kernel...), func(p debPackage) bool { return p.File() == file })
	}); err != nil {
		return nil, err
	}

	t := time.Now()
	user, built, err := prepareUserland(ctx, dir, debs, userland)
	if err != nil {
		return nil, err
	}
	if built {
		p.Built = append(p.Built, "userland")
	}
	kern, built, err := prepareKernel(ctx, dir, debs, abi, kernel, r.arch().hostCommand(filepath.Join(user.Root, "usr/bin/busybox")))
	if err != nil {
		return nil, err
	}
	if built {
		p.Built = append(p.Built, "kernel")
	}
	n.vmlinuz = filepath.Join(kern.Dir, "vmlinuz")
	n.modules = len(kern.Modules)
	p.Unpack = time.Since(t)

	t = time.Now()
	n.initramfs, built, err = prepareInitramfs(ctx, dir, user, kern, r.arch())
	if err != nil {
		return nil, err
	}
	if built {
		p.Built = append(p.Built, "initramfs")
	}
	p.Initramfs = time.Since(t)
	p.Total = time.Since(start)
	return n, nil
}

// openApt writes the release's private apt configuration under dir and
// refreshes its package lists if they are a day old (Preparation.Update):
// a failed refresh goes on with the lists it has, if any.
func openApt(ctx context.Context, dir string, r Release, p *Preparation) (*privateApt, error) {
	apt, err := newPrivateApt(filepath.Join(dir, "apt"), r)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	p.ListsUpdated, err = apt.update(ctx, listsMaxAge)
	if err != nil {
		if _, serr := os.Stat(apt.updatedStamp()); serr != nil || ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", r.Suite, err)
		}
		p.ListsError = err
	}
	p.Update = time.Since(t)
	return apt, nil
}

// fetch downloads the packages debs lacks (Preparation.Download).
func fetch(ctx context.Context, apt *privateApt, debs string, pkgs []debPackage, p *Preparation) error {
	t := time.Now()
	fetched, err := apt.download(ctx, debs, pkgs)
	if err != nil {
		return err
	}
	for _, pkg := range fetched {
		p.Downloaded = append(p.Downloaded, pkg.Name+"_"+pkg.Version)
	}
	p.Download = time.Since(t)
	return nil
}

// versions maps the packages' names to their versions.
func versions(pkgs []debPackage) map[string]string {
	m := make(map[string]string, len(pkgs))
	for _, pkg := range pkgs {
		m[pkg.Name] = pkg.Version
	}
	return m
}

// openRelease opens a release's directory under the cache (Dir), taken
// for this process until unlock is called, and its private apt with lists
// at most a day old (noted in p).
func openRelease(ctx context.Context, r Release, cache string, p *Preparation) (dir string, apt *privateApt, unlock func(), err error) {
	dir = Dir(cache, r)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, nil, err
	}
	unlock, err = lockFile(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return "", nil, nil, err
	}
	if apt, err = openApt(ctx, dir, r, p); err != nil {
		unlock()
		return "", nil, nil, err
	}
	return dir, apt, unlock, nil
}

// pickKernel picks, of what installing linux-image-amd64 installs, the
// packages that hold the kernel and its modules: linux-image-<abi>, which
// holds them all up to trixie, and the packages sid (November 2026) split
// it into: linux-binary-<abi> (the image, as modules/<abi>/vmlinuz),
// linux-modules-<abi> and linux-base-<abi> (config, modules.builtin).
func pickKernel(pkgs []debPackage, r Release) (string, []debPackage, error) {
	var abi string
	for _, p := range pkgs {
		arch := r.arch().Debian
		if v, ok := strings.CutPrefix(p.Name, "linux-image-"); ok && v != arch && strings.HasSuffix(v, "-"+arch) {
			abi = v
		}
	}
	if abi == "" {
		return "", nil, fmt.Errorf("%s: linux-image-%s installs no linux-image-*-%s", r.Name(), r.arch().Debian, r.arch().Debian)
	}
	if r.KernelSeries != "" && !strings.HasPrefix(abi, r.KernelSeries+".") {
		return "", nil, fmt.Errorf("%s: linux-image-%s installs kernel %s, not of the %s series", r.Name(), r.arch().Debian, abi, r.KernelSeries)
	}
	var kernel []debPackage
	for _, p := range pkgs {
		for _, prefix := range []string{"linux-image-", "linux-binary-", "linux-modules-", "linux-base-"} {
			if p.Name == prefix+abi {
				kernel = append(kernel, p)
			}
		}
	}
	return abi, kernel, nil
}

// pruneDir removes the .deb files of dir that keep does not want: the
// cache holds the current packages only.
func pruneDir(dir string, keep func(file string) bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".deb") && !keep(e.Name()) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// unpackedUserland is a release's userland unpacked into a merged root.
type unpackedUserland struct {
	Root  string              `json:"-"`
	Debs  []string            // the package files unpacked, sorted
	Files map[string][]string // package → its files and links
}

// prepareUserland unpacks the userland packages into dir/userland, unless
// it holds those packages already, and says whether it unpacked.
func prepareUserland(ctx context.Context, dir, debs string, pkgs []debPackage) (*unpackedUserland, bool, error) {
	root := filepath.Join(dir, "userland")
	manifest := filepath.Join(dir, "userland.json")
	want := debFiles(pkgs)
	var have unpackedUserland
	if readJSON(manifest, &have) == nil && slices.Equal(have.Debs, want) {
		have.Root = root
		return &have, false, nil
	}
	u := &unpackedUserland{Root: root, Debs: want, Files: map[string][]string{}}
	os.Remove(manifest)
	if err := os.RemoveAll(root); err != nil {
		return nil, false, err
	}
	if err := makeMergedRoot(root); err != nil {
		return nil, false, err
	}
	for _, p := range pkgs {
		files, err := unpackDeb(ctx, filepath.Join(debs, p.File()), root, nil)
		if err != nil {
			return nil, false, err
		}
		u.Files[p.Name] = files
	}
	return u, true, writeJSON(manifest, u)
}

// stagedKernel is a kernel image with the modules a node loads.
type stagedKernel struct {
	Dir       string `json:"-"` // dir/kernel/<abi>: vmlinuz, config, stage/
	ABI       string
	Debs      []string
	Selection string         // moduleSelection() it was staged with
	Modules   []kernelModule // in load order
}

// prepareKernel unpacks the kernel's packages and stages its modules
// (stageModules) into dir/kernel/<abi>, unless it holds those packages'
// already, and says whether it did. Of the unpacked packages (400 MB and
// more) it keeps the image and the staged modules only.
func prepareKernel(ctx context.Context, dir, debs, abi string, pkgs []debPackage, busybox []string) (*stagedKernel, bool, error) {
	kdir := filepath.Join(dir, "kernel", abi)
	manifest := filepath.Join(kdir, "kernel.json")
	want := debFiles(pkgs)
	var have stagedKernel
	if readJSON(manifest, &have) == nil && slices.Equal(have.Debs, want) && have.Selection == moduleSelection() {
		have.Dir = kdir
		return &have, false, nil
	}
	// Other kernels of the release (superseded by a security update) go.
	if err := os.RemoveAll(filepath.Join(dir, "kernel")); err != nil {
		return nil, false, err
	}
	unpacked := kdir + ".unpacked"
	defer os.RemoveAll(unpacked)
	keep := func(name string) bool {
		return strings.HasPrefix(name, "boot/vmlinuz-") || strings.HasPrefix(name, "boot/config-") ||
			strings.HasPrefix(name, "usr/lib/modules/")
	}
	for _, p := range pkgs {
		if _, err := unpackDeb(ctx, filepath.Join(debs, p.File()), unpacked, keep); err != nil {
			return nil, false, err
		}
	}
	if _, err := os.Stat(filepath.Join(unpacked, "usr/lib/modules", abi)); err != nil {
		return nil, false, fmt.Errorf("kernel %s: its packages have no modules directory: %w", abi, err)
	}
	k := &stagedKernel{Dir: kdir, ABI: abi, Debs: want, Selection: moduleSelection()}
	var err error
	k.Modules, err = stageModules(ctx, unpacked, abi, filepath.Join(kdir, "stage"), busybox)
	if err != nil {
		return nil, false, err
	}
	for _, f := range []string{"vmlinuz", "config"} {
		err := os.Rename(filepath.Join(unpacked, "boot", f+"-"+abi), filepath.Join(kdir, f))
		if errors.Is(err, fs.ErrNotExist) {
			err = os.Rename(filepath.Join(unpacked, "usr/lib/modules", abi, f), filepath.Join(kdir, f))
		}
		if err != nil {
			return nil, false, fmt.Errorf("kernel %s: no %s in boot/ or modules/: %w", abi, f, err)
		}
	}
	return k, true, writeJSON(manifest, k)
}

// initramfsFormat changes when the archive's layout changes without its
// inputs changing (initramfs.go, userland.go), so that Prepare rebuilds.
const initramfsFormat = "1"

// prepareInitramfs builds the node's base archive, dir/initramfs-<key>.cpio
// (key: a hash of the packages, the modules and /init), unless it exists,
// and says whether it built it.
func prepareInitramfs(ctx context.Context, dir string, u *unpackedUserland, k *stagedKernel, a archSpec) (string, bool, error) {
	h := sha256.New()
	json.NewEncoder(h).Encode([]any{initramfsFormat, u.Debs, k.Debs, k.Modules, initScript, etcFiles})
	key := hex.EncodeToString(h.Sum(nil))[:16]
	dst := filepath.Join(dir, "initramfs-"+key+".cpio")
	if _, err := os.Stat(dst); err == nil {
		return dst, false, nil
	}
	paths, err := userlandPaths(u.Root, u.Files)
	if err != nil {
		return "", false, err
	}
	applets, err := busyboxApplets(ctx, u.Root, paths, a)
	if err != nil {
		return "", false, err
	}
	old, _ := filepath.Glob(filepath.Join(dir, "initramfs-*.cpio"))
	err = writeInitramfs(dst, initramfsContent{UserRoot: u.Root, UserPaths: paths, Applets: applets,
		Stage: filepath.Join(k.Dir, "stage"), Modules: k.Modules})
	if err != nil {
		return "", false, err
	}
	for _, f := range old {
		os.Remove(f)
	}
	return dst, true, nil
}

func debFiles(pkgs []debPackage) []string {
	files := make([]string, len(pkgs))
	for i, p := range pkgs {
		files[i] = p.File()
	}
	slices.Sort(files)
	return files
}

func readJSON(file string, v any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

// writeJSON writes v to file through a temporary file, so that a manifest
// exists only once what it describes is complete.
func writeJSON(file string, v any) error {
	data, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// lockFile takes an exclusive lock on file (flock), waiting for other
// processes until ctx ends, and returns its release.
func lockFile(ctx context.Context, file string) (func(), error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", file, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the lock %s: %w", file, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
