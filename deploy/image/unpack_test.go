package main

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// entry is one tar entry of a test layer; a Linkname makes it a symlink, or a hard
// link with hard set; a name ending in "/" is a directory.
type entry struct {
	name, body, link string
	hard             bool
	mode             int64
}

func layer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		switch {
		case e.name[len(e.name)-1] == '/':
			hdr.Typeflag, hdr.Size, hdr.Mode = tar.TypeDir, 0, 0o755
		case e.link != "" && e.hard:
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, e.link, 0
		case e.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, e.link, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func image(t *testing.T, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestUnpackAppliesWhiteouts(t *testing.T) {
	base := layer(t,
		entry{name: "a/"}, entry{name: "a/x", body: "x"}, entry{name: "a/y", body: "y"},
		entry{name: "b/"}, entry{name: "b/z", body: "z"}, entry{name: "b/sub/"}, entry{name: "b/sub/w", body: "w"},
		entry{name: "c/"}, entry{name: "c/keep", body: "old"}, entry{name: "gone/"}, entry{name: "gone/f", body: "f"},
	)
	middle := layer(t,
		entry{name: "a/.wh.x"},            // delete a/x
		entry{name: "b/.wh..wh..opq"},     // hide b's lower contents…
		entry{name: "b/new", body: "new"}, // …but not this layer's
		entry{name: ".wh.gone"},           // delete a whole directory
		entry{name: "setuid", body: "s", mode: 0o4755},
	)
	top := layer(t,
		entry{name: "c/keep", body: "new"},
		entry{name: "link", link: "c/keep"},
		entry{name: "hard", link: "c/keep", hard: true},
		entry{name: "ro/"}, entry{name: "ro/f", body: "f"},
	)
	dir := t.TempDir()
	if err := Unpack(image(t, base, middle, top), dir); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a/y": "y", "b/new": "new", "c/keep": "new", "link": "new", "hard": "new", "setuid": "s", "ro/f": "f"}
	for name, body := range want {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != body {
			t.Errorf("%s: %q, %v; want %q", name, got, err, body)
		}
	}
	for _, name := range []string{"a/x", "b/z", "b/sub", "gone", "a/.wh.x", "b/.wh..wh..opq", ".wh.gone"} {
		if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
			t.Errorf("%s exists", name)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "setuid")); err != nil || fi.Mode()&fs.ModeSetuid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("setuid: %v, %v", fi.Mode(), err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "link")); err != nil || target != "c/keep" {
		t.Errorf("link → %q, %v", target, err)
	}
}

// TestUnpackStaysInside: links in an image cannot make the unpacker write outside the
// root file system.
func TestUnpackStaysInside(t *testing.T) {
	outside := t.TempDir()
	up := "../../../../../../../.."
	for name, layers := range map[string][]v1.Layer{
		"absolute symlink": {layer(t, entry{name: "escape", link: outside}, entry{name: "escape/pwned", body: "x"})},
		"relative symlink": {layer(t, entry{name: "d/"}, entry{name: "d/escape", link: up + outside},
			entry{name: "d/escape/pwned", body: "x"})},
		"hard link": {layer(t, entry{name: "pwned", link: up + outside + "/target", hard: true})},
		// The flattened stream has the upper layer's entry before the lower layer's
		// link: it must not be followed.
		"symlink in a lower layer": {layer(t, entry{name: "escape", link: outside}), layer(t, entry{name: "escape/pwned", body: "x"})},
		"symlink in the same layer, later": {layer(t, entry{name: "e/"}, entry{name: "e/escape", link: outside}),
			layer(t, entry{name: "e/escape/pwned", body: "x"}, entry{name: "e/escape", link: outside})},
	} {
		if err := os.WriteFile(filepath.Join(outside, "target"), []byte("t"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := Unpack(image(t, layers...), t.TempDir())
		if _, statErr := os.Stat(filepath.Join(outside, "pwned")); statErr == nil {
			t.Errorf("%s: wrote outside the root file system (Unpack: %v)", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	// A hard link whose target's path runs through an absolute symlink: os.Link would
	// link the host's file into the root file system.
	dir := t.TempDir()
	err := Unpack(image(t, layer(t, entry{name: "escape", link: outside}, entry{name: "h", link: "escape/target", hard: true})), dir)
	t.Logf("hard link through a symlink: %v", err)
	host, _ := os.Stat(filepath.Join(outside, "target"))
	if fi, statErr := os.Stat(filepath.Join(dir, "h")); statErr == nil && os.SameFile(fi, host) {
		t.Errorf("hard link through a symlink: h is the host's %s/target", outside)
	}
}
