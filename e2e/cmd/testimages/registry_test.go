package main

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
)

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// TestAddRegistry lays out an image archive as fake-registry-server reads
// it: the tag's file names the manifest's digest, manifests and blobs sit
// at sha256/XX/HEX/data.
func TestAddRegistry(t *testing.T) {
	layer, config := []byte("layer"), []byte(`{"architecture":"amd64"}`)
	manifest := []byte(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",` +
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"` + sha(config) + `"},` +
		`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"` + sha(layer) + `"}]}`)
	index := []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"` + sha(manifest) + `"}]}`)
	archive := filepath.Join(t.TempDir(), "pause.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for name, b := range map[string][]byte{
		"index.json":                        index,
		"blobs/sha256/" + sha(manifest)[7:]: manifest,
		"blobs/sha256/" + sha(config)[7:]:   config,
		"blobs/sha256/" + sha(layer)[7:]:    layer,
	} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b))})
		tw.Write(b)
	}
	tw.Close()
	f.Close()

	tr := &Tree{entries: map[string]*entry{}}
	if err := addRegistry(tr, archive, "pause", "testing"); err != nil {
		t.Fatal(err)
	}
	at := func(kind string, b []byte) string {
		h := sha(b)[7:]
		return "/var/registry/pause/" + kind + "/sha256/" + h[:2] + "/" + h + "/data"
	}
	for p, want := range map[string][]byte{
		"/var/registry/pause/manifests/testing": []byte(sha(manifest) + "\n"),
		at("manifests", manifest):               manifest,
		at("blobs", config):                     config,
		at("blobs", layer):                      layer,
	} {
		if got, ok := tr.File(p); !ok || string(got) != string(want) {
			t.Errorf("%s = %q (%v), want %q", p, got, ok, want)
		}
	}
	if n := len(tr.Paths()); n < 4 {
		t.Errorf("%d paths: %v", n, tr.Paths())
	}

	// A manifest without a mediaType would be sent as text/plain.
	bad := filepath.Join(t.TempDir(), "bad.tar")
	f, _ = os.Create(bad)
	tw = tar.NewWriter(f)
	plain := []byte(`{"schemaVersion":2}`)
	idx := []byte(`{"manifests":[{"digest":"` + sha(plain) + `"}]}`)
	for name, b := range map[string][]byte{"index.json": idx, "blobs/sha256/" + sha(plain)[7:]: plain} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b))})
		tw.Write(b)
	}
	tw.Close()
	f.Close()
	if err := addRegistry(&Tree{entries: map[string]*entry{}}, bad, "pause", "testing"); err == nil {
		t.Error("a manifest without mediaType was accepted")
	}
}
