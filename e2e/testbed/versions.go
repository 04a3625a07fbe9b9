package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// APIServerVersionEnv names the kube-apiserver (and its etcd) a bed runs:
// Versions.Kubernetes (the default) or Versions.SkewKubernetes.
const APIServerVersionEnv = "NFTPROXY_KUBE_APISERVER_VERSION"

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

// APIServerVersion is the kube-apiserver release a bed runs: $NFTPROXY_KUBE_APISERVER_VERSION,
// which must be one e2e/tools/versions names, else the newest.
func APIServerVersion() (string, error) {
	v := kubebin.Pinned()
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
	if version == kubebin.Pinned().Kubernetes {
		return EnsureBinaries(t), version
	}
	script := filepath.Join(kubebin.RepoRoot(), "e2e", "tools", "build.sh")
	out, err := exec.Command(script, "--skew").CombinedOutput()
	if err != nil {
		t.Fatalf("building the %s API server with %s --skew failed (it needs the Go module proxy): %v\n%s", version, script, err, out)
	}
	dir = kubebin.Dir(version)
	if err := checkBinaries(dir); err != nil {
		t.Fatalf("after %s --skew: %v\n%s", script, err, out)
	}
	return dir, version
}
