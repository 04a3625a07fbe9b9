package ruleset

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestGolden pins the rulesets of testState and featureState, in the form `nft list table`
// prints it (nft.Dump, which the kernel tests compare with real listings).
// Review a change to it like a change to the data path; regenerate with
// go test ./proxier/ruleset -run Golden -update.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		file string
		rs   *nft.Ruleset
	}{
		{"basic.nft", Build(testConfig, nft.IPv4, testState())},
		{"features.nft", Build(featureConfig(), nft.IPv4, featureState())},
		{"counters.nft", Build(countersConfig(), nft.IPv4, testState())},
	} {
		t.Run(tc.file, func(t *testing.T) { checkGolden(t, tc.file, tc.rs) })
	}
}

// checkGolden compares rs with testdata/file (rewriting it with -update).
func checkGolden(t *testing.T, file string, rs *nft.Ruleset) {
	t.Helper()
	got := rs.Dump()
	path := filepath.Join("testdata", file)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if nft.Canonical(string(want)) != got {
		t.Errorf("ruleset differs from %s (run with -update to accept):\n%s", path, got)
	}
}

// countersConfig is testConfig with --service-traffic-metrics=endpoints.
func countersConfig() Config {
	cfg := testConfig
	cfg.Counters = CountEndpoints
	return cfg
}
