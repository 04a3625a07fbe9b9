package nodes

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestLookup(t *testing.T) {
	for _, r := range Releases {
		got, err := Lookup(r.Name())
		if err != nil || got.Name() != r.Name() || got.Arch != r.Arch {
			t.Errorf("Lookup(%s) = %v, %v", r.Name(), got, err)
		}
	}
	if _, err := Lookup("potato"); err == nil || !strings.Contains(err.Error(), "bookworm") {
		t.Errorf("Lookup(potato): %v, want an error naming the releases", err)
	}
}

// TestHostReleasesLeavesReleases: filtering the releases for this
// machine's architecture, as every userland test does in turn, must not
// change Releases (a second test once got a zero Release, named "").
func TestHostReleasesLeavesReleases(t *testing.T) {
	t.Setenv("NFTPROXY_NODES_SUITES", "")
	before := slices.Clone(Releases)
	for range 2 {
		for _, r := range hostReleases(t) {
			if r.Suite == "" {
				t.Fatalf("hostReleases gave a release without a suite: %+v", r)
			}
		}
	}
	if !reflect.DeepEqual(before, Releases) {
		t.Errorf("Releases changed: %v, was %v", Releases, before)
	}
}
