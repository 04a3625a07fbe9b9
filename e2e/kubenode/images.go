package kubenode

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// BuildPauseImage builds e2e/cmd/pause as a static binary and packs it into
// an image archive named PauseImage with deploy/image (the tool `make image`
// uses), in dir. It returns the archive's path.
func BuildPauseImage(t testbed.TB, dir string) string {
	t.Helper()
	root := kubebin.RepoRoot()
	bin := filepath.Join(dir, "pause")
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./e2e/cmd/pause")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build e2e/cmd/pause: %v\n%s", err, out)
	}
	repo, tag, _ := strings.Cut(strings.TrimPrefix(PauseImage, "docker.io/"), ":")
	archive := filepath.Join(dir, "pause.tar")
	pack := exec.Command("go", "run", ".", "build",
		"--binary", bin, "--path", "/pause", "--repository", repo, "--version", tag,
		"--revision", "e2e", "--created", "2000-01-01T00:00:00Z", "--out", archive)
	pack.Dir = filepath.Join(root, "deploy", "image")
	if out, err := pack.CombinedOutput(); err != nil {
		t.Fatalf("pack the pause image with deploy/image: %v\n%s", err, out)
	}
	return archive
}
