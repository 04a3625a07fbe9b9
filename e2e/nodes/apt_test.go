package nodes

import (
	"slices"
	"testing"
)

func TestParseSimulation(t *testing.T) {
	out := `NOTE: This is only a simulation!
Reading package lists...
Inst libc6 (2.36-9+deb12u14 Debian:12.13/stable, Debian-Security:12/stable-security [amd64])
Inst netbase (6.4 Debian:12.13/stable [all])
Inst conntrack [1:1.4.6-2] (1:1.4.7-1+b2 Debian:12.13/stable [amd64])
Conf libc6 (2.36-9+deb12u14 Debian:12.13/stable, Debian-Security:12/stable-security [amd64])
`
	got, err := parseSimulation(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []debPackage{
		{"libc6", "2.36-9+deb12u14", "amd64"},
		{"netbase", "6.4", "all"},
		{"conntrack", "1:1.4.7-1+b2", "amd64"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if f := got[2].File(); f != "conntrack_1%3a1.4.7-1+b2_amd64.deb" {
		t.Errorf("file %s", f)
	}
	if _, err := parseSimulation("Inst broken line\n"); err == nil {
		t.Error("a line it cannot read: no error")
	}
	if _, err := parseSimulation("0 upgraded, 0 newly installed\n"); err == nil {
		t.Error("nothing to install: no error")
	}
}
