package nodes

import (
	"slices"
	"testing"
)

func TestPickKernel(t *testing.T) {
	bookworm, _ := Lookup("bookworm")
	sid, _ := Lookup("sid")
	pkgs := func(names ...string) []debPackage {
		var ps []debPackage
		for _, n := range names {
			ps = append(ps, debPackage{Name: n, Version: "1", Arch: "amd64"})
		}
		return ps
	}
	for _, tc := range []struct {
		name    string
		r       Release
		pkgs    []debPackage
		abi     string
		kernel  []string
		wantErr bool
	}{
		{"bookworm", bookworm, pkgs("kmod", "linux-image-6.1.0-56-amd64", "initramfs-tools", "linux-image-amd64"),
			"6.1.0-56-amd64", []string{"linux-image-6.1.0-56-amd64"}, false},
		{"sid split", sid, pkgs("linux-base-7.2.13+deb14-amd64", "linux-binary-7.2.13+deb14-amd64", "kmod",
			"linux-modules-7.2.13+deb14-amd64", "linux-image-7.2.13+deb14-amd64", "linux-base-amd64", "linux-image-amd64"),
			"7.2.13+deb14-amd64", []string{"linux-base-7.2.13+deb14-amd64", "linux-binary-7.2.13+deb14-amd64",
				"linux-modules-7.2.13+deb14-amd64", "linux-image-7.2.13+deb14-amd64"}, false},
		{"another series", bookworm, pkgs("linux-image-6.12.117+deb12-amd64"), "", nil, true},
		{"no kernel", bookworm, pkgs("linux-image-amd64", "kmod"), "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			abi, kernel, err := pickKernel(tc.pkgs, tc.r)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
			var names []string
			for _, p := range kernel {
				names = append(names, p.Name)
			}
			if abi != tc.abi || !slices.Equal(names, tc.kernel) {
				t.Errorf("got %s %v, want %s %v", abi, names, tc.abi, tc.kernel)
			}
		})
	}
}
