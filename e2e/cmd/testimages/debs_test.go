package main

import (
	"slices"
	"testing"
)

func TestParseSimulation(t *testing.T) {
	out := []byte(`NOTE: This is only a simulation!
Reading package lists...
The following NEW packages will be installed:
  bash busybox-static libc6
Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable, Debian-Security:12/oldstable-security [amd64])
Inst busybox-static (1:1.35.0-4+deb12u1+b1 Debian:12.15/oldstable [amd64])
Inst tzdata [2024a-0+deb12u1] (2025b-0+deb12u2 Debian:12.15/oldstable [all])
Inst bash (5.2.15-2+b13 Debian:12.15/oldstable [amd64])
Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])
`)
	got, err := parseSimulation(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []Package{
		{"bash", "5.2.15-2+b13", "amd64"},
		{"busybox-static", "1:1.35.0-4+deb12u1+b1", "amd64"},
		{"libc6", "2.36-9+deb12u14", "amd64"},
		{"tzdata", "2025b-0+deb12u2", "all"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("parseSimulation = %v, want %v", got, want)
	}
	if f := want[1].File(); f != "busybox-static_1%3a1.35.0-4+deb12u1+b1_amd64.deb" {
		t.Errorf("File = %s", f)
	}
	if _, err := parseSimulation([]byte("Inst garbage\n")); err == nil {
		t.Error("an unreadable Inst line was accepted")
	}
	if _, err := parseSimulation([]byte("0 upgraded, 0 newly installed\n")); err == nil {
		t.Error("an empty closure was accepted")
	}
}

func TestClosureKey(t *testing.T) {
	a := []Package{{"bash", "5.2", "amd64"}, {"libc6", "2.36", "amd64"}}
	b := []Package{{"bash", "5.2", "amd64"}, {"libc6", "2.36-1", "amd64"}}
	if closureKey("1", a) == closureKey("1", b) || closureKey("1", a) == closureKey("2", a) || closureKey("1", a) != closureKey("1", slices.Clone(a)) {
		t.Error("closureKey does not follow the versions and the format")
	}
}
