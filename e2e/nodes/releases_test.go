package nodes

import (
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
