package testbed

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// Versions are the Kubernetes releases the bed builds and runs, and the etcd
// each is tested with, as e2e/tools/versions names them (the one place that
// does; docs/upgrading-kubernetes.md).
type Versions struct {
	// Kubernetes is the newest release: upstream kube-proxy, kubectl,
	// kubeadm, kubelet, and the API server unless NFTPROXY_KUBE_APISERVER_VERSION
	// names another. Etcd is the etcd it is tested with.
	Kubernetes, Etcd string
	// SkewKubernetes is the oldest release nftproxy supports (make skew runs
	// the API scenarios against its kube-apiserver); SkewEtcd its etcd.
	SkewKubernetes, SkewEtcd string
}

// APIServerVersionEnv names the kube-apiserver (and its etcd) a bed runs:
// Versions.Kubernetes (the default) or Versions.SkewKubernetes.
const APIServerVersionEnv = "NFTPROXY_KUBE_APISERVER_VERSION"

var semver = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)

// versionsFile is e2e/tools/versions.
func versionsFile() string { return filepath.Join(repoRoot(), "e2e", "tools", "versions") }

var versionsOnce = sync.OnceValues(func() (Versions, error) { return ReadVersions(versionsFile()) })

// KubeVersions returns e2e/tools/versions; a file that cannot be read or
// lacks a version is a bug of the checkout, so it panics.
func KubeVersions() Versions {
	v, err := versionsOnce()
	if err != nil {
		panic(err)
	}
	return v
}

// ReadVersions parses a versions file: "key vX.Y.Z" lines, # comments.
func ReadVersions(path string) (Versions, error) {
	f, err := os.Open(path)
	if err != nil {
		return Versions{}, err
	}
	defer f.Close()
	found := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 || !semver.MatchString(fields[1]) {
			return Versions{}, fmt.Errorf("%s: bad line %q (want \"key vX.Y.Z\")", path, line)
		}
		found[fields[0]] = fields[1]
	}
	if err := sc.Err(); err != nil {
		return Versions{}, err
	}
	v := Versions{Kubernetes: found["kubernetes"], Etcd: found["etcd"],
		SkewKubernetes: found["skew-kubernetes"], SkewEtcd: found["skew-etcd"]}
	for key, val := range map[string]string{"kubernetes": v.Kubernetes, "etcd": v.Etcd,
		"skew-kubernetes": v.SkewKubernetes, "skew-etcd": v.SkewEtcd} {
		if val == "" {
			return Versions{}, fmt.Errorf("%s: no %q line", path, key)
		}
	}
	return v, nil
}

// StagingVersion is the version of the k8s.io staging modules (client-go,
// api, …) published with a Kubernetes release: v1.37.2 → v0.37.2.
func StagingVersion(kube string) string { return "v0." + strings.TrimPrefix(kube, "v1.") }

// Minor is a release's minor version: v1.37.2 → "37".
func Minor(kube string) string {
	parts := strings.Split(kube, ".")
	if len(parts) < 2 {
		return ""
	}
	return parts[1]
}

// BinDir is where e2e/tools/build.sh puts the binaries of a Kubernetes
// release (and the etcd it is tested with): CacheDir()/bin/<version>. One
// directory per release, so that checkouts of different releases share
// the cache without rebuilding each other's binaries.
func BinDir(kube string) string { return filepath.Join(CacheDir(), "bin", kube) }

// APIServerVersion is the kube-apiserver release a bed runs: $NFTPROXY_KUBE_APISERVER_VERSION,
// which must be one e2e/tools/versions names, else the newest.
func APIServerVersion() (string, error) {
	v := KubeVersions()
	switch want := os.Getenv(APIServerVersionEnv); want {
	case "", v.Kubernetes:
		return v.Kubernetes, nil
	case v.SkewKubernetes:
		return v.SkewKubernetes, nil
	default:
		return "", fmt.Errorf("%s=%s: the bed builds %s and %s only (e2e/tools/versions)", APIServerVersionEnv, want, v.Kubernetes, v.SkewKubernetes)
	}
}

// EnsureAPIServer returns the directory holding the etcd and kube-apiserver
// of APIServerVersion, building them first (e2e/tools/build.sh, or
// build.sh --skew for the oldest supported release: a no-op when up to
// date).
func EnsureAPIServer(t TB) (dir, version string) {
	t.Helper()
	version, err := APIServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if version == KubeVersions().Kubernetes {
		return EnsureBinaries(t), version
	}
	script := filepath.Join(repoRoot(), "e2e", "tools", "build.sh")
	out, err := exec.Command(script, "--skew").CombinedOutput()
	if err != nil {
		t.Fatalf("building the %s API server with %s --skew failed (it needs the Go module proxy): %v\n%s", version, script, err, out)
	}
	dir = BinDir(version)
	if err := checkBinaries(dir); err != nil {
		t.Fatalf("after %s --skew: %v\n%s", script, err, out)
	}
	return dir, version
}
