package monitoring

import (
	"os"
	"os/exec"
	"testing"
)

// RequireTool returns the path of a program the tests need (make deps
// installs it): without it the test is skipped, unless NFTPROXY_E2E=1
// makes that a failure.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv("NFTPROXY_E2E") == "1" {
		t.Fatalf("%s not found (make deps installs it): %v", name, err)
	}
	t.Skipf("%s not found (make deps installs it): %v", name, err)
	return ""
}
