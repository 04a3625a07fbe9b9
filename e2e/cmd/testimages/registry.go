package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// registryDir is where agnhost's fake-registry-server reads the images it
// serves (test/images/agnhost/fakeregistryserver, v1.37).
const registryDir = "/var/registry"

// The image the suite's LocalhostNodePorts registry test pulls from
// fake-registry-server: upstream's Dockerfile stores registry.k8s.io's
// pause:3.10.2 as pause:testing (fakeregistryserver/images.txt); here it is
// our pause image.
const (
	registryImage = "pause"
	registryTag   = "testing"
)

// ociDescriptor is the part of an OCI descriptor, index or manifest that
// addRegistry follows.
type ociDescriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
}

type ociManifest struct {
	MediaType string          `json:"mediaType"`
	Manifests []ociDescriptor `json:"manifests"` // an index
	Config    *ociDescriptor  `json:"config"`    // an image
	Layers    []ociDescriptor `json:"layers"`
}

// addRegistry adds to t, under registryDir, the files fake-registry-server
// serves for the image of the OCI archive as name:tag, laid out as
// upstream's prepare_registry.sh lays them out: NAME/manifests/TAG holds the
// digest of the image's manifest (or index), each manifest is
// NAME/manifests/sha256/XX/HEX/data and each config and layer
// NAME/blobs/sha256/XX/HEX/data. The server sends a manifest with the
// Content-Type of its mediaType field, which every manifest must have.
func addRegistry(t *Tree, archive, name, tag string) error {
	blobs, index, err := readLayout(archive)
	if err != nil {
		return err
	}
	var idx ociManifest
	if err := json.Unmarshal(index, &idx); err != nil {
		return fmt.Errorf("%s: index.json: %w", archive, err)
	}
	if len(idx.Manifests) == 0 {
		return fmt.Errorf("%s: index.json names no image", archive)
	}
	top := idx.Manifests[0].Digest
	base := path.Join(registryDir, name)
	t.AddFile(path.Join(base, "manifests", tag), 0o644, []byte(top+"\n"))
	var addManifest func(digest string) error
	addManifest = func(digest string) error {
		raw, ok := blobs[digest]
		if !ok {
			return fmt.Errorf("%s: no blob %s", archive, digest)
		}
		var m ociManifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("%s: manifest %s: %w", archive, digest, err)
		}
		if m.MediaType == "" {
			return fmt.Errorf("%s: manifest %s has no mediaType", archive, digest)
		}
		t.AddFile(digestPath(path.Join(base, "manifests"), digest), 0o644, raw)
		for _, d := range m.Manifests {
			if err := addManifest(d.Digest); err != nil {
				return err
			}
		}
		if m.Config != nil {
			m.Layers = append(m.Layers, *m.Config)
		}
		for _, d := range m.Layers {
			b, ok := blobs[d.Digest]
			if !ok {
				return fmt.Errorf("%s: no blob %s", archive, d.Digest)
			}
			t.AddFile(digestPath(path.Join(base, "blobs"), d.Digest), 0o644, b)
		}
		return nil
	}
	return addManifest(top)
}

// digestPath is where fake-registry-server looks for a blob or manifest:
// DIR/sha256/XX/HEX/data.
func digestPath(dir, digest string) string {
	algo, hex, _ := strings.Cut(digest, ":")
	if len(hex) < 2 {
		return path.Join(dir, digest)
	}
	return path.Join(dir, algo, hex[:2], hex, "data")
}

// readLayout reads an OCI layout archive: its blobs by digest
// ("sha256:HEX") and its index.json.
func readLayout(archive string) (map[string][]byte, []byte, error) {
	f, err := os.Open(archive)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	blobs := map[string][]byte{}
	var index []byte
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", archive, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", archive, hdr.Name, err)
		}
		if hdr.Name == "index.json" {
			index = b
		} else if rest, ok := strings.CutPrefix(hdr.Name, "blobs/"); ok {
			if algo, hex, ok := strings.Cut(rest, "/"); ok {
				blobs[algo+":"+hex] = b
			}
		}
	}
	if index == nil {
		return nil, nil, fmt.Errorf("%s: no index.json", archive)
	}
	return blobs, index, nil
}
