// Package kubebin says where tests find this checkout, the Kubernetes
// releases it is built and tested against (e2e/tools/versions, the one file
// that names them: docs/upgrading-kubernetes.md), and the binaries
// e2e/tools/build.sh builds for a release. The bed (e2e/testbed), the
// kubelet nodes and the comparisons with upstream kube-proxy in unit tests
// all read it, so that none of them needs e2e/ for a path.
package kubebin

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
)

// Versions are the Kubernetes releases the bed builds and runs, and the etcd
// each is tested with.
type Versions struct {
	// Kubernetes is the newest release: upstream kube-proxy, kubectl,
	// kubeadm, kubelet, and the API server unless
	// NFTPROXY_KUBE_APISERVER_VERSION names another. Etcd is the etcd it is
	// tested with.
	Kubernetes, Etcd string
	// SkewKubernetes is the oldest release nftproxy supports (make skew runs
	// the API scenarios against its kube-apiserver); SkewEtcd its etcd.
	SkewKubernetes, SkewEtcd string
}

// RepoRoot is the root of the nftproxy module, found from this source file
// so that tests in any package (and any working directory) find it.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..")
}

// VersionsFile is e2e/tools/versions.
func VersionsFile() string { return filepath.Join(RepoRoot(), "e2e", "tools", "versions") }

var pinned = sync.OnceValues(func() (Versions, error) { return ReadVersions(VersionsFile()) })

// Pinned returns e2e/tools/versions; a file that cannot be read or lacks a
// version is a bug of the checkout, so it panics.
func Pinned() Versions {
	v, err := pinned()
	if err != nil {
		panic(err)
	}
	return v
}

var semver = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)

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

// CacheDir is where build.sh puts binaries: $NFTPROXY_E2E_CACHE, or
// $HOME/.cache/nftproxy-e2e.
func CacheDir() string {
	if d := os.Getenv("NFTPROXY_E2E_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "nftproxy-e2e")
}

// Dir is where e2e/tools/build.sh puts the binaries of a Kubernetes release
// (and the etcd it is tested with): CacheDir()/bin/<version>. One directory
// per release, so that checkouts of different releases share the cache
// without rebuilding each other's binaries.
func Dir(kube string) string { return filepath.Join(CacheDir(), "bin", kube) }
