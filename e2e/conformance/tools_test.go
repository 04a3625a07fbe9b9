package conformance_test

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/conformance"
	"github.com/nftproxy/nftproxy/e2e/kubenode"
	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// Environment of TestConformance (make conformance sets the first three).
const (
	// enableEnv=1 runs it.
	enableEnv = "NFTPROXY_CONFORMANCE"
	// imageEnv names nftproxy's image archive (default bin/nftproxy-image.tar);
	// prevImageEnv the previous release's, for the upgrade case ("" skips it).
	imageEnv     = "NFTPROXY_IMAGE_TAR"
	prevImageEnv = "NFTPROXY_PREV_IMAGE_TAR"
	// setEnv picks the tests: conformance (default), sig-network (which
	// runs localhost-nodeports after it) or localhost-nodeports.
	setEnv = "NFTPROXY_CONFORMANCE_SET"
	// proxiesEnv lists the proxies to run the suite with, in order
	// (default "nftproxy,kube-proxy").
	proxiesEnv = "NFTPROXY_CONFORMANCE_PROXIES"
	// outEnv is where the JUnit reports and logs go (default bin/conformance).
	outEnv = "NFTPROXY_CONFORMANCE_OUT"
	// procsEnv is ginkgo's --procs (default 4).
	procsEnv = "NFTPROXY_CONFORMANCE_PROCS"
	// disruptionEnv=0 leaves the disruption measurements out.
	disruptionEnv = "NFTPROXY_CONFORMANCE_DISRUPTION"
	// focusEnv replaces the set's --focus by this regular expression
	// (debugging: one test, one area); its skips stay, and the sets that
	// would run after it do not.
	focusEnv = "NFTPROXY_CONFORMANCE_FOCUS"
	// registryEnv=0 imports nftproxy's image into containerd instead of
	// serving it from the local registry.
	registryEnv = "NFTPROXY_CONFORMANCE_REGISTRY"
	// cniEnv is the cluster's pod network (conformance.CNIs; default
	// bridge), primaryEnv its first family (ipv4, the default, or ipv6);
	// the reports go to bin/conformance/CNI[-ipv6] but the IPv4-first
	// bridge's.
	cniEnv     = "NFTPROXY_CONFORMANCE_CNI"
	primaryEnv = "NFTPROXY_CONFORMANCE_PRIMARY"
)

// Proxies a run can install.
const (
	proxyNftproxy  = "nftproxy"
	proxyKubeProxy = "kube-proxy"
	// proxyHelm starts with kube-proxy, which TestHelm replaces by the
	// chart's nftproxy.
	proxyHelm = "helm"
)

type config struct {
	cluster          conformance.Cluster
	set              conformance.Set
	sets             []conformance.Set // what the run runs: set.Runs()
	focus            string            // focusEnv, or ""
	proxies          []string
	out              string
	image, prevImage string
	procs            int
	disruption, reg  bool
	// suiteTimeout is ginkgo's --timeout for a set, networkTimeout for
	// SetNetwork.
	suiteTimeout, networkTimeout time.Duration
}

func readConfig(t *testing.T) config {
	t.Helper()
	root := kubebin.RepoRoot()
	c := config{
		proxies:    strings.Split(envOr(proxiesEnv, proxyNftproxy+","+proxyKubeProxy), ","),
		out:        envOr(outEnv, filepath.Join(root, "bin", "conformance")),
		image:      envOr(imageEnv, filepath.Join(root, "bin", "nftproxy-image.tar")),
		prevImage:  os.Getenv(prevImageEnv),
		focus:      os.Getenv(focusEnv),
		disruption: os.Getenv(disruptionEnv) != "0",
		reg:        os.Getenv(registryEnv) != "0",
	}
	var err error
	if c.procs, err = strconv.Atoi(envOr(procsEnv, "4")); err != nil || c.procs < 1 {
		t.Fatalf("%s: want a positive number", procsEnv)
	}
	if c.set, err = conformance.ParseSet(envOr(setEnv, string(conformance.SetConformance))); err != nil {
		t.Fatalf("%s: %v", setEnv, err)
	}
	if c.cluster, err = conformance.ParseCluster(envOr(cniEnv, string(conformance.CNIBridge)), os.Getenv(primaryEnv)); err != nil {
		t.Fatalf("%s, %s: %v", cniEnv, primaryEnv, err)
	}
	c.out = filepath.Join(c.out, c.cluster.Dir())
	c.sets = c.set.Runs()
	if c.focus != "" {
		c.sets = c.sets[:1]
	}
	c.suiteTimeout, c.networkTimeout = 60*time.Minute, 4*time.Hour
	for _, p := range c.proxies {
		if p != proxyNftproxy && p != proxyKubeProxy {
			t.Fatalf("%s: unknown proxy %q", proxiesEnv, p)
		}
	}
	if _, err := os.Stat(c.image); err != nil {
		t.Fatalf("nftproxy image: %v (run `make image`, or set %s)", err, imageEnv)
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		t.Fatal(err)
	}
	return c
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// tools are the programs and files the run needs besides the node's.
type tools struct {
	kubenode.Binaries
	// E2E is upstream's e2e.test, Ginkgo the CLI that runs it in parallel,
	// Agnhost, CoreDNS and KubeProxy the programs of their images.
	E2E, Ginkgo, Agnhost, CoreDNS, KubeProxy, Issue74839 string
	// Flanneld is flannel's program, for its image ("" on the bridge).
	Flanneld string
	// Porter holds agnhost's TLS test files (test/images/agnhost/porter).
	Porter string
}

// ensureTools builds what is missing (e2e/tools/build.sh --kubelet
// --conformance, and --flannel for flannel's network; a no-op when up to
// date) and finds everything.
func ensureTools(t *testing.T, cni conformance.CNI) tools {
	t.Helper()
	script := filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "build.sh")
	start := time.Now()
	args := []string{"--kubelet", "--conformance"}
	if _, ok := cni.Flannel(); ok {
		args = append(args, "--flannel")
	}
	if out, err := exec.Command(script, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", script, strings.Join(args, " "), err, out)
	}
	t.Logf("build.sh %s: %v", strings.Join(args, " "), time.Since(start).Round(time.Second))
	bins := kubenode.EnsureBinaries(t)
	dir := filepath.Dir(bins.Kubelet)
	tl := tools{Binaries: bins,
		E2E: filepath.Join(dir, "e2e.test"), Ginkgo: filepath.Join(dir, "ginkgo"), Agnhost: filepath.Join(dir, "agnhost"),
		CoreDNS: filepath.Join(dir, "coredns"), KubeProxy: filepath.Join(dir, "kube-proxy"),
		Issue74839: filepath.Join(dir, "regression-issue-74839"),
	}
	need := []string{tl.E2E, tl.Ginkgo, tl.Agnhost, tl.CoreDNS, tl.KubeProxy, tl.Issue74839}
	if _, ok := cni.Flannel(); ok {
		tl.Flanneld = filepath.Join(dir, "flanneld")
		need = append(need, tl.Flanneld)
	}
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v (built by %s --conformance)", err, script)
		}
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "conformance")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m k8s.io/kubernetes in e2e/tools/conformance: %v", err)
	}
	tl.Porter = filepath.Join(strings.TrimSpace(string(out)), "test", "images", "agnhost", "porter")
	return tl
}

// image is an archive of e2e/cmd/testimages and the names it holds.
type image struct {
	archive string
	names   []string
}

// buildImages makes the test images (e2e/cmd/testimages, which caches what
// it can) under the names this e2e.test and kubeadm use, into dir.
func buildImages(t *testing.T, tl tools, dir string) map[string]image {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command(tl.E2E, "--list-images").Output()
	if err != nil {
		t.Fatalf("e2e.test --list-images: %v", err)
	}
	e2eList := filepath.Join(dir, "e2e-images.txt")
	if err := os.WriteFile(e2eList, list, 0o644); err != nil {
		t.Fatal(err)
	}
	kubeadm, err := testbed.KubeadmImages(tl.Kubeadm, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	kubeadmList := filepath.Join(dir, "kubeadm-images.txt")
	if err := os.WriteFile(kubeadmList, []byte(strings.Join(kubeadm, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd := exec.Command("go", "run", "./e2e/cmd/testimages", "--out", dir, "--repo", kubebin.RepoRoot(),
		"--e2e-images", e2eList, "--kubeadm-images", kubeadmList,
		"--agnhost", tl.Agnhost, "--coredns", tl.CoreDNS, "--kube-proxy", tl.KubeProxy, "--porter", tl.Porter,
		"--regression-issue-74839", tl.Issue74839)
	if tl.Flanneld != "" {
		cmd.Args = append(cmd.Args, "--flanneld", tl.Flanneld)
	}
	cmd.Dir = kubebin.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("e2e/cmd/testimages: %v\n%s", err, out)
	} else {
		t.Logf("test images in %v:\n%s", time.Since(start).Round(time.Second), strings.TrimSpace(string(out)))
	}
	f, err := os.Open(filepath.Join(dir, "images.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	images := map[string]image{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 3 {
			images[fields[0]] = image{archive: fields[1], names: fields[2:]}
		}
	}
	return images
}

// archiveNames reads the full names ("docker.io/library/nftproxy:latest")
// and OCI ref names ("latest") of an image archive's index.
func archiveNames(path string) (full, refs []string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("%s: no index.json", path)
		}
		if err != nil {
			return nil, nil, err
		}
		if hdr.Name != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&index); err != nil {
			return nil, nil, fmt.Errorf("%s: index.json: %w", path, err)
		}
		for _, m := range index.Manifests {
			full = append(full, m.Annotations["io.containerd.image.name"])
			refs = append(refs, m.Annotations["org.opencontainers.image.ref.name"])
		}
		return full, refs, nil
	}
}

// versionTag is the tag of nftproxy's image archive that is not "latest":
// the version make image stamped.
func versionTag(t *testing.T, archive string) string {
	t.Helper()
	_, refs, err := archiveNames(archive)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range refs {
		if r != "latest" && r != "" {
			return r
		}
	}
	t.Fatalf("%s: no version tag among %q", archive, refs)
	return ""
}
