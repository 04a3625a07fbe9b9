package nodes

import (
	"strings"
	"testing"
)

func TestLookup(t *testing.T) {
	for _, r := range Releases {
		got, err := Lookup(r.Suite)
		if err != nil || got.Suite != r.Suite {
			t.Errorf("Lookup(%s) = %v, %v", r.Suite, got, err)
		}
	}
	if _, err := Lookup("potato"); err == nil || !strings.Contains(err.Error(), "bookworm") {
		t.Errorf("Lookup(potato): %v, want an error naming the releases", err)
	}
}
