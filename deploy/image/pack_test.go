package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// tarFile writes a tar of the given files (name → content) to dir/file,
// gzip-compressed if compress.
func tarFile(t *testing.T, dir, file string, compress bool, files ...string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f, Mode: 0o644, Size: int64(len(f))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f))
	}
	tw.Close()
	data := buf.Bytes()
	if compress {
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(data)
		zw.Close()
		data = gz.Bytes()
	}
	path := filepath.Join(dir, file)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func packOptions(t *testing.T) PackOptions {
	dir := t.TempDir()
	return PackOptions{
		Layers: []string{
			tarFile(t, dir, "base.tar.gz", true, "bin/sh", "etc/passwd"),
			tarFile(t, dir, "top.tar", false, "agnhost"),
		},
		Names:      []string{"registry.k8s.io/e2e-test-images/agnhost:2.66.1", "nftproxy-e2e/agnhost:1"},
		Entrypoint: []string{"/agnhost"},
		Cmd:        []string{"pause"},
		Env:        []string{"PATH=/usr/bin:/bin"},
		WorkingDir: "/",
		Arch:       "amd64",
		Created:    time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC),
	}
}

func packArchive(t *testing.T, o PackOptions) []byte {
	t.Helper()
	img, err := Pack(o)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := RefsFromNames(o.Names)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := NewIndex([]v1.Image{img}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, idx, refs, o.Created, o.Arch); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPack reads a packed image back through the OCI layout (each full name
// is a ref.name) and the docker archive's manifest.json, and checks its
// configuration and its layers, in order.
func TestPack(t *testing.T) {
	o := packOptions(t)
	data := packArchive(t, o)
	if !bytes.Equal(data, packArchive(t, o)) {
		t.Error("two packs of the same layers differ")
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ref := range o.Names {
		full := ref
		if ref == "nftproxy-e2e/agnhost:1" {
			full = "docker.io/" + ref
		}
		a, err := OpenArchive(path, full, "linux/"+o.Arch)
		if err != nil {
			t.Fatalf("OpenArchive %s: %v", full, err)
		}
		defer a.Close()
		if err := validate.Image(a.Image); err != nil {
			t.Errorf("%s: %v", full, err)
		}
		cfg, err := a.Image.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		c := cfg.Config
		if !slices.Equal(c.Entrypoint, o.Entrypoint) || !slices.Equal(c.Cmd, o.Cmd) || !slices.Equal(c.Env, o.Env) ||
			c.WorkingDir != "/" || cfg.Architecture != "amd64" || cfg.OS != "linux" || !cfg.Created.Equal(o.Created) {
			t.Errorf("%s: config %+v", full, cfg)
		}
		layers, err := a.Image.Layers()
		if err != nil {
			t.Fatal(err)
		}
		var got [][]string
		for _, l := range layers {
			rc, err := l.Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			tr := tar.NewReader(rc)
			for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
				names = append(names, hdr.Name)
			}
			rc.Close()
			got = append(got, names)
		}
		if len(got) != 2 || !slices.Equal(got[0], []string{"bin/sh", "etc/passwd"}) || !slices.Equal(got[1], []string{"agnhost"}) {
			t.Errorf("%s: layers hold %q", full, got)
		}
	}
	for _, short := range []string{"registry.k8s.io/e2e-test-images/agnhost:2.66.1", "nftproxy-e2e/agnhost:1"} {
		tag, err := name.NewTag(short)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tarball.ImageFromPath(path, &tag); err != nil {
			t.Errorf("docker view of %s: %v", short, err)
		}
	}
}

func TestRefsFromNames(t *testing.T) {
	refs, err := RefsFromNames([]string{"registry.k8s.io/pause:3.10.2", "nftproxy:latest", "nftproxy-e2e/probe:1", "10.10.0.1:5000/library/nftproxy:v1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Ref{
		{Tag: "registry.k8s.io/pause:3.10.2", Short: "registry.k8s.io/pause:3.10.2", Full: "registry.k8s.io/pause:3.10.2"},
		{Tag: "docker.io/library/nftproxy:latest", Short: "nftproxy:latest", Full: "docker.io/library/nftproxy:latest"},
		{Tag: "docker.io/nftproxy-e2e/probe:1", Short: "nftproxy-e2e/probe:1", Full: "docker.io/nftproxy-e2e/probe:1"},
		{Tag: "10.10.0.1:5000/library/nftproxy:v1", Short: "10.10.0.1:5000/library/nftproxy:v1", Full: "10.10.0.1:5000/library/nftproxy:v1"},
	}
	if !slices.Equal(refs, want) {
		t.Errorf("RefsFromNames =\n%+v\nwant\n%+v", refs, want)
	}
	for _, bad := range [][]string{nil, {"nftproxy"}, {"Upper:1"}, {"a:1", "docker.io/library/a:1"}} {
		if _, err := RefsFromNames(bad); err == nil {
			t.Errorf("RefsFromNames(%q) accepted", bad)
		}
	}
}

func TestPackRefuses(t *testing.T) {
	o := packOptions(t)
	o.Layers = nil
	if _, err := Pack(o); err == nil {
		t.Error("an image without layers was packed")
	}
	o = packOptions(t)
	o.Layers = append(o.Layers, filepath.Join(t.TempDir(), "missing.tar"))
	if _, err := Pack(o); err == nil {
		t.Error("a missing layer file was packed")
	}
}
