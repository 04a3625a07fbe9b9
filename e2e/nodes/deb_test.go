package nodes

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestMergedPath(t *testing.T) {
	for in, want := range map[string]string{
		"bin/ip":                       "usr/bin/ip",
		"sbin/ip":                      "usr/sbin/ip",
		"lib/x86_64-linux-gnu/libc.so": "usr/lib/x86_64-linux-gnu/libc.so",
		"lib64/ld-linux-x86-64.so.2":   "usr/lib64/ld-linux-x86-64.so.2",
		"lib":                          "usr/lib",
		"usr/sbin/nft":                 "usr/sbin/nft",
		"etc/protocols":                "etc/protocols",
		"library/x":                    "library/x",
		"binary":                       "binary",
	} {
		if got := mergedPath(in); got != want {
			t.Errorf("mergedPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	if err := makeMergedRoot(root); err != nil {
		t.Fatal(err)
	}
	write := func(p, content string) {
		if err := writeFile(filepath.Join(root, p), strings.NewReader(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(p, target string) {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	write("usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "loader")
	link("usr/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	write("usr/lib/x86_64-linux-gnu/libnftables.so.1.1.0", "lib")
	link("usr/lib/x86_64-linux-gnu/libnftables.so.1", "libnftables.so.1.1.0")
	link("usr/sbin/loop", "loop")
	link("usr/sbin/out", "../../..")

	for _, tc := range []struct {
		path, final string
		links       []string
	}{
		{"lib64/ld-linux-x86-64.so.2", "usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
			[]string{"lib64", "usr/lib64/ld-linux-x86-64.so.2", "lib"}},
		{"usr/lib/x86_64-linux-gnu/libnftables.so.1", "usr/lib/x86_64-linux-gnu/libnftables.so.1.1.0",
			[]string{"usr/lib/x86_64-linux-gnu/libnftables.so.1"}},
		{"usr/lib/x86_64-linux-gnu/libnftables.so.1.1.0", "usr/lib/x86_64-linux-gnu/libnftables.so.1.1.0", nil},
	} {
		links, final, err := resolveIn(root, tc.path)
		if err != nil {
			t.Errorf("%s: %v", tc.path, err)
			continue
		}
		if final != tc.final || !slices.Equal(links, tc.links) {
			t.Errorf("%s: links %v, final %s; want %v, %s", tc.path, links, final, tc.links, tc.final)
		}
	}
	for _, bad := range []string{"usr/sbin/loop", "usr/sbin/none", "usr/sbin/out/etc"} {
		if _, _, err := resolveIn(root, bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
