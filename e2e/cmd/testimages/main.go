// Command testimages builds the container images `make conformance` loads into
// its nodes (docs/conformance.md), without a container engine and without
// pulling anything: upstream's test images under the exact names of
// test/utils/image/manifest.go (agnhost, glibc-dns-testing, nginx, busybox,
// pause), kubeadm's kube-proxy and coredns images under the names kubeadm's
// addons use, and our probe (the disruption test's load generator).
//
//	go run ./e2e/cmd/testimages --out DIR \
//	    --e2e-images FILE      (e2e.test --list-images)
//	    --kubeadm-images FILE  (kubeadm config images list --config ...)
//	    --agnhost BIN --coredns BIN --kube-proxy BIN --porter DIR
//	    --regression-issue-74839 BIN
//	    [--flanneld BIN]       (e2e/tools/build.sh --flannel)
//
// Go programs are copied in as built (agnhost, coredns and kube-proxy by
// e2e/tools/build.sh --conformance; pause and probe here, static). Debian's
// programs come from one shared layer: the packages of basePackages and
// their dependencies as apt resolves them, fetched with apt-get download
// into the cache and unpacked with dpkg-deb (no chroot, no maintainer
// script), usrmerge applied by hand. That layer is cached under the hash of
// the resolved package list. Each image is packed by deploy/image pack.
//
// It writes DIR/KIND.tar per image, DIR/images.txt ("KIND ARCHIVE NAME..."
// per line) and DIR/docker-registry, the registry binary of Debian's
// docker-registry package (fetched and unpacked the same way: the package
// itself is never installed, so no service starts).
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// layerFormat changes when what goes into the cached Debian layers changes
// (Tree's rules, addBaseFiles): it is part of their cache key.
const layerFormat = "testimages-layer-2"

// created is every timestamp of the images: they are test fixtures, and the
// same inputs give the same digests.
var created = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

type options struct {
	out, cache, repo                    string
	e2eImages, kubeadmImages            string
	agnhost, coredns, kubeProxy, porter string
	issue74839                          string
	// flanneld, if set, adds the flannel image (flannelRepo, tagged with
	// its version) for the conformance cluster on flannel.
	flanneld string
}

func main() {
	var o options
	flag.StringVar(&o.out, "out", "", "directory for the image archives (required)")
	flag.StringVar(&o.cache, "cache", defaultCache(), "cache of .debs and Debian layers")
	flag.StringVar(&o.repo, "repo", ".", "nftproxy's checkout (e2e/cmd/pause, e2e/cmd/probe, deploy/image)")
	flag.StringVar(&o.e2eImages, "e2e-images", "", "file: the output of e2e.test --list-images (required)")
	flag.StringVar(&o.kubeadmImages, "kubeadm-images", "", "file: the output of kubeadm config images list (required)")
	flag.StringVar(&o.agnhost, "agnhost", "", "the agnhost binary (required)")
	flag.StringVar(&o.coredns, "coredns", "", "the coredns binary, kubeadm's version (required)")
	flag.StringVar(&o.kubeProxy, "kube-proxy", "", "the kube-proxy binary, kubeadm's version (required)")
	flag.StringVar(&o.issue74839, "regression-issue-74839", "", "the regression-issue-74839 binary (k8s.io/kubernetes' test/images; required)")
	flag.StringVar(&o.porter, "porter", "", "directory of localhost.crt and localhost.key (k8s.io/kubernetes' test/images/agnhost/porter; required)")
	flag.StringVar(&o.flanneld, "flanneld", "", "the flanneld binary: adds the flannel image")
	flag.Parse()
	if o.out == "" || o.e2eImages == "" || o.kubeadmImages == "" || o.agnhost == "" || o.coredns == "" || o.kubeProxy == "" || o.porter == "" || o.issue74839 == "" {
		flag.Usage()
		os.Exit(2)
	}
	start := time.Now()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "testimages:", err)
		os.Exit(1)
	}
	fmt.Printf("testimages: images in %s after %v\n", o.out, time.Since(start).Round(time.Second))
}

func defaultCache() string {
	if d := os.Getenv("NFTPROXY_E2E_CACHE"); d != "" {
		return filepath.Join(d, "testimages")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "nftproxy-e2e", "testimages")
}

// image is one image to pack.
type image struct {
	kind                 string
	layers               []string
	entrypoint, cmd, env []string
}

func run(o options) error {
	for _, d := range []string{o.out, filepath.Join(o.out, "layers"), filepath.Join(o.out, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	names, err := readNames(o)
	if err != nil {
		return err
	}
	if err := checkVersions(o, names); err != nil {
		return err
	}
	if o.flanneld != "" {
		// It prints its version on stderr.
		out, err := exec.Command(o.flanneld, "--version").CombinedOutput()
		version := strings.TrimSpace(string(out))
		if err != nil || version == "" || strings.ContainsAny(version, " \n:") {
			return fmt.Errorf("%s --version: %v: %q", o.flanneld, err, out)
		}
		names[kindFlannel] = []string{flannelRepo + ":" + version}
	}
	debs := filepath.Join(o.cache, "debs")

	base, closure, err := debianLayer(o, "base", basePackages, func(t *Tree) error {
		addBaseFiles(t)
		addAlternatives(t)
		return nil
	})
	if err != nil {
		return err
	}
	if err := writePackages(filepath.Join(o.out, "packages.txt"), closure); err != nil {
		return err
	}
	busybox, err := busyboxLayer(o)
	if err != nil {
		return err
	}
	if err := extractRegistry(o, debs); err != nil {
		return err
	}
	pause, err := goBuild(o, "./e2e/cmd/pause")
	if err != nil {
		return err
	}
	probe, err := goBuild(o, "./e2e/cmd/probe")
	if err != nil {
		return err
	}
	crt, err := os.ReadFile(filepath.Join(o.porter, "localhost.crt"))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(filepath.Join(o.porter, "localhost.key"))
	if err != nil {
		return err
	}

	tool, err := buildImageTool(o)
	if err != nil {
		return err
	}
	var list bytes.Buffer
	packImage := func(img image) error {
		img.env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
		archive := filepath.Join(o.out, img.kind+".tar")
		if err := pack(tool, img, names[img.kind], archive); err != nil {
			return fmt.Errorf("%s: %w", img.kind, err)
		}
		fmt.Fprintf(&list, "%s %s %s\n", img.kind, archive, strings.Join(names[img.kind], " "))
		return nil
	}
	// The pause image first: agnhost's fake registry serves it.
	pauseTop, err := topLayer(o, kindPause, func(t *Tree) error { return addBinary(t, "/pause", pause) })
	if err != nil {
		return err
	}
	if err := packImage(image{kind: kindPause, layers: []string{pauseTop}, entrypoint: []string{"/pause"}}); err != nil {
		return err
	}

	// The other images' own layers.
	tops := map[string]func(t *Tree) error{
		kindAgnhost: func(t *Tree) error {
			// As upstream's Dockerfile: /agnhost, /agnhost-2, porter's TLS
			// files read relative to /, /uploads; /coredns for the suite's
			// own DNS server pods; wget trying once, as in Alpine.
			if err := addBinary(t, "/agnhost", o.agnhost); err != nil {
				return err
			}
			t.AddSymlink("/agnhost-2", "agnhost")
			t.AddFile("/localhost.crt", 0o644, crt)
			t.AddFile("/localhost.key", 0o644, key)
			t.AddDir("/uploads", 0o777)
			t.AddFile("/usr/local/bin/wget", 0o755, []byte(wgetWrapper))
			if err := addRegistry(t, filepath.Join(o.out, kindPause+".tar"), registryImage, registryTag); err != nil {
				return fmt.Errorf("fake-registry-server's images: %w", err)
			}
			return addBinary(t, "/coredns", o.coredns)
		},
		kindNginx: func(t *Tree) error {
			t.AddFile("/etc/nginx/nginx.conf", 0o644, []byte(nginxConf))
			t.AddFile("/usr/share/nginx/html/index.html", 0o644, []byte("<html><body>nginx</body></html>\n"))
			return nil
		},
		kindKubeProxy: func(t *Tree) error { return addBinary(t, "/usr/local/bin/kube-proxy", o.kubeProxy) },
		kindCoreDNS:   func(t *Tree) error { return addBinary(t, "/coredns", o.coredns) },
		kindProbe:     func(t *Tree) error { return addBinary(t, "/probe", probe) },
		kindIssue74839: func(t *Tree) error {
			return addBinary(t, "/regression-issue-74839", o.issue74839)
		},
	}
	if o.flanneld != "" {
		// Where flannel's manifest runs it.
		tops[kindFlannel] = func(t *Tree) error { return addBinary(t, "/opt/bin/flanneld", o.flanneld) }
	}
	top := map[string]string{}
	for kind, fill := range tops {
		if top[kind], err = topLayer(o, kind, fill); err != nil {
			return err
		}
	}

	images := []image{
		{kind: kindAgnhost, layers: []string{base, top[kindAgnhost]}, entrypoint: []string{"/agnhost"}, cmd: []string{"pause"}},
		{kind: kindDNSTest, layers: []string{base}, cmd: []string{"bash"}},
		{kind: kindNginx, layers: []string{base, top[kindNginx]}, cmd: []string{"nginx", "-g", "daemon off;"}},
		{kind: kindBusybox, layers: []string{busybox}, cmd: []string{"sh"}},
		{kind: kindKubeProxy, layers: []string{base, top[kindKubeProxy]}, entrypoint: []string{"/usr/local/bin/kube-proxy"}},
		{kind: kindCoreDNS, layers: []string{top[kindCoreDNS]}, entrypoint: []string{"/coredns"}},
		{kind: kindProbe, layers: []string{top[kindProbe]}, entrypoint: []string{"/probe"}},
		// Upstream's is distroless with iptables, nft and conntrack; the
		// suite runs sh, sleep, grep, test, which and conntrack in it.
		{kind: kindIptables, layers: []string{base}},
		{kind: kindIssue74839, layers: []string{top[kindIssue74839]}, entrypoint: []string{"/regression-issue-74839"}},
	}
	if o.flanneld != "" {
		// Upstream's is Alpine with iptables, nft and its iptables
		// wrapper; flanneld runs nft (nftables mode) or iptables, and
		// the iptables cleanup at start in either.
		images = append(images, image{kind: kindFlannel, layers: []string{base, top[kindFlannel]}, entrypoint: []string{"/opt/bin/flanneld"}})
	}
	for _, img := range images {
		if err := packImage(img); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(o.out, "images.txt"), list.Bytes(), 0o644)
}

// topLayer writes the layer of an image's own files, as fill adds them, to
// DIR/layers/KIND.tar.gz.
func topLayer(o options, kind string, fill func(*Tree) error) (string, error) {
	t := &Tree{entries: map[string]*entry{}} // the image's own files only
	if err := fill(t); err != nil {
		return "", fmt.Errorf("%s: %w", kind, err)
	}
	path := filepath.Join(o.out, "layers", kind+".tar.gz")
	return path, writeLayerFile(t, path)
}

// readNames reads the two image lists and picks our images' names.
func readNames(o options) (map[string][]string, error) {
	read := func(file string) ([]string, error) {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		return strings.Split(string(b), "\n"), nil
	}
	e2e, err := read(o.e2eImages)
	if err != nil {
		return nil, err
	}
	kubeadm, err := read(o.kubeadmImages)
	if err != nil {
		return nil, err
	}
	return pickNames(e2e, kubeadm)
}

// checkVersions refuses a coredns or kube-proxy binary whose version is not
// the tag kubeadm gives its image: the cluster would run other code than it
// says.
func checkVersions(o options, names map[string][]string) error {
	for _, c := range []struct {
		bin, repo, flag, prefix string
		kind                    string
	}{
		{o.coredns, "registry.k8s.io/coredns/coredns", "-version", "CoreDNS-", kindCoreDNS},
		{o.kubeProxy, "registry.k8s.io/kube-proxy", "--version", "Kubernetes ", kindKubeProxy},
	} {
		tag := tagOf(names[c.kind], c.repo)
		out, err := exec.Command(c.bin, c.flag).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", c.bin, c.flag, err, out)
		}
		want := c.prefix + tag
		if c.kind == kindCoreDNS {
			want = c.prefix + strings.TrimPrefix(tag, "v")
		}
		first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		if first != want {
			return fmt.Errorf("%s reports %q; kubeadm's image %s:%s wants %q", c.bin, first, c.repo, tag, want)
		}
	}
	return nil
}

// debianLayer returns the cached layer of pkgs' closure plus what extra adds,
// making it if it is missing, and the closure.
func debianLayer(o options, name string, pkgs []string, extra func(*Tree) error) (string, []Package, error) {
	closure, err := Resolve(pkgs)
	if err != nil {
		return "", nil, err
	}
	path := filepath.Join(o.cache, "layers", name+"-"+closureKey(layerFormat, closure)+".tar.gz")
	if _, err := os.Stat(path); err == nil {
		fmt.Printf("testimages: %s layer up to date: %s (%d packages)\n", name, path, len(closure))
		return path, closure, nil
	}
	start := time.Now()
	files, err := Download(filepath.Join(o.cache, "debs"), closure)
	if err != nil {
		return "", nil, err
	}
	t := NewTree()
	if err := AddDebs(t, files); err != nil {
		return "", nil, err
	}
	if err := extra(t); err != nil {
		return "", nil, fmt.Errorf("%s layer: %w", name, err)
	}
	if err := writeLayerFile(t, path); err != nil {
		return "", nil, err
	}
	fmt.Printf("testimages: %s layer of %d packages made in %v: %s\n", name, len(closure), time.Since(start).Round(time.Second), path)
	return path, closure, nil
}

// writePackages writes the packages of a layer, "name version" a line: what
// the conformance run reads to know what the images hold (iperf's version).
func writePackages(path string, pkgs []Package) error {
	var b strings.Builder
	for _, p := range pkgs {
		fmt.Fprintf(&b, "%s %s\n", p.Name, p.Version)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// busyboxLayer is busybox-static alone, with a link per applet (busybox
// --install -s, done by reading the applet list of the static binary).
func busyboxLayer(o options) (string, error) {
	path, _, err := debianLayer(o, "busybox", []string{"busybox-static"}, func(t *Tree) error {
		addBaseFiles(t)
		bin, ok := t.File("/bin/busybox")
		if !ok {
			return fmt.Errorf("busybox-static holds no /bin/busybox")
		}
		applets, err := busyboxApplets(bin)
		if err != nil {
			return err
		}
		for _, a := range applets {
			if !t.Has(a) {
				t.AddSymlink(a, "/bin/busybox")
			}
		}
		return nil
	})
	return path, err
}

// busyboxApplets runs the static busybox binary with --list-full: one path
// per applet ("usr/bin/wget").
func busyboxApplets(bin []byte) ([]string, error) {
	f, err := os.CreateTemp("", "busybox-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(bin); err != nil {
		return nil, err
	}
	f.Chmod(0o755)
	f.Close()
	out, err := exec.Command(f.Name(), "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	var applets []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if a := strings.TrimSpace(sc.Text()); a != "" && !strings.HasSuffix(a, "/busybox") {
			applets = append(applets, "/"+a)
		}
	}
	return applets, nil
}

// extractRegistry writes DIR/docker-registry from Debian's docker-registry
// package, unpacked, not installed.
func extractRegistry(o options, debs string) error {
	closure, err := Resolve([]string{"docker-registry"})
	if err != nil {
		return err
	}
	i := slices.IndexFunc(closure, func(p Package) bool { return p.Name == "docker-registry" })
	if i < 0 {
		return fmt.Errorf("apt resolves no docker-registry package")
	}
	files, err := Download(debs, closure[i:i+1])
	if err != nil {
		return err
	}
	t := NewTree()
	if err := AddDebs(t, files); err != nil {
		return err
	}
	bin, ok := t.File("/usr/bin/docker-registry")
	if !ok {
		return fmt.Errorf("%s holds no /usr/bin/docker-registry", files[0])
	}
	return os.WriteFile(filepath.Join(o.out, "docker-registry"), bin, 0o755)
}

// addBinary adds the program at file as path.
func addBinary(t *Tree, path, file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	t.AddFile(path, 0o755, b)
	return nil
}

// writeLayerFile writes t's layer to path, through a temporary file.
func writeLayerFile(t *Tree, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	err = t.WriteLayer(f, created)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// goBuild builds a main package of the repository, static, into DIR/bin.
func goBuild(o options, pkg string) (string, error) {
	bin := filepath.Join(o.out, "bin", filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Dir = o.repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// buildImageTool builds deploy/image (a module of its own) into DIR/bin.
func buildImageTool(o options) (string, error) {
	bin, err := filepath.Abs(filepath.Join(o.out, "bin", "image"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join(o.repo, "deploy", "image")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build deploy/image: %w\n%s", err, out)
	}
	return bin, nil
}

// pack runs deploy/image pack, unless archive was packed from the same
// inputs already (its stamp file holds their hash).
func pack(tool string, img image, names []string, archive string) error {
	args := []string{"pack", "--out", archive, "--created", created.Format(time.RFC3339)}
	for _, l := range img.layers {
		args = append(args, "--layer", l)
	}
	for _, n := range names {
		args = append(args, "--name", n)
	}
	for _, e := range img.env {
		args = append(args, "--env", e)
	}
	for _, f := range []struct {
		flag string
		list []string
	}{{"--entrypoint", img.entrypoint}, {"--cmd", img.cmd}} {
		if f.list != nil {
			b, _ := json.Marshal(f.list)
			args = append(args, f.flag, string(b))
		}
	}
	stamp, err := inputsHash(args, img.layers)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(archive + ".stamp"); err == nil && string(old) == stamp {
		if _, err := os.Stat(archive); err == nil {
			return nil
		}
	}
	if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("image %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return os.WriteFile(archive+".stamp", []byte(stamp), 0o644)
}

// inputsHash hashes a command line and the content of files.
func inputsHash(args, files []string) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, strings.Join(args, "\x00"))
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
