package testbed

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// requiredBinaries are the programs a Bed runs (kube-proxy is built too, for comparisons,
// but a Bed does not need it).
var requiredBinaries = []string{"etcd", "kube-apiserver"}

// EnsureBinaries returns the directory holding the newest release's etcd,
// kube-apiserver, kube-proxy, kubectl and kubeadm (BinDir of
// kubebin.Pinned().Kubernetes), running e2e/tools/build.sh first (a no-op when the
// binaries are up to date; about 5 minutes from cold caches). It fails the test with
// the build output when the build fails. A bed's own API server is EnsureAPIServer's.
func EnsureBinaries(t TB) string {
	t.Helper()
	dir := kubebin.Dir(kubebin.Pinned().Kubernetes)
	out := RunBuild(t)
	if err := checkBinaries(dir); err != nil {
		t.Fatalf("after e2e/tools/build.sh: %v\n%s", err, out)
	}
	return dir
}

// KubeProxyArgs starts the command line of upstream kube-proxy (binary kp)
// in mode ("nftables", "iptables") on a bed node; the caller adds the
// kubeconfig, node name and the rest.
func KubeProxyArgs(kp, mode string) []string {
	return []string{kp, "--proxy-mode", mode, "--nodeport-addresses", "primary",
		// In a netns kube-proxy cannot set conntrack sysctls (FACTS.md).
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0"}
}

// RunBuild runs e2e/tools/build.sh with flags (e.g. --cluster: what make
// cluster-bench runs besides) and returns its output; a failed build fails
// the test with it.
func RunBuild(t TB, flags ...string) string {
	t.Helper()
	script := filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "build.sh")
	out, err := exec.Command(script, flags...).CombinedOutput()
	if err != nil {
		t.Fatalf("building e2e binaries with %s %v failed (it needs the Go module proxy): %v\n%s", script, flags, err, out)
	}
	return string(out)
}

func checkBinaries(dir string) error {
	for _, name := range requiredBinaries {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("binary %s missing in %s (run e2e/tools/build.sh)", name, dir)
		}
	}
	return nil
}

// builds memoizes GoBuild per package path: one build per test process, even when
// parallel tests ask at the same time.
var builds sync.Map // package path → *goBuildResult

type goBuildResult struct {
	once sync.Once
	bin  string
	err  error
}

// GoBuild builds a main package of this module (e.g.
// "github.com/nftproxy/nftproxy/e2e/cmd/probe") once per test process and returns the
// binary's path under kubebin.CacheDir()/gobin. The binary is written to a temporary name and
// renamed, so test processes of other packages running the previous build are not
// disturbed.
func GoBuild(t TB, pkg string) string {
	t.Helper()
	v, _ := builds.LoadOrStore(pkg, new(goBuildResult))
	r := v.(*goBuildResult)
	r.once.Do(func() { r.bin, r.err = goBuild(pkg) })
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.bin
}

func goBuild(pkg string) (string, error) {
	// One directory per checkout: worktrees testing different code at once
	// must not run each other's nftproxy or probe.
	root := sha256.Sum256([]byte(kubebin.RepoRoot()))
	dir := filepath.Join(kubebin.CacheDir(), "gobin", hex.EncodeToString(root[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, path.Base(pkg))
	tmp := bin + ".tmp" + strconv.Itoa(os.Getpid())
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goTool, "build", "-o", tmp, pkg)
	cmd.Dir = kubebin.RepoRoot()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, out.String())
	}
	return bin, os.Rename(tmp, bin)
}

// ProbePath builds e2e/cmd/probe and returns its path; see that command for its output.
func ProbePath(t TB) string {
	t.Helper()
	return GoBuild(t, "github.com/nftproxy/nftproxy/e2e/cmd/probe")
}
