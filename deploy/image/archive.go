package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// ociLayoutFile is the marker file of an OCI image layout.
const ociLayoutFile = `{"imageLayoutVersion":"1.0.0"}`

// archiveEntry is one file of an archive.
type archiveEntry struct {
	name string
	data func() (io.ReadCloser, error)
	size int64
}

// WriteArchive writes idx as an OCI image layout: its blobs, and an index.json holding
// one entry per ref for the image index, or, when it holds one image, for that image's
// manifest (as a single-platform archive always had it). Beside it a Docker
// manifest.json names the blobs of idx's image for dockerArch (linux), every ref's short
// name for it: `docker load` reads one image per name. Entries are in a fixed order with
// mtime created, owned by root.
func WriteArchive(w io.Writer, idx v1.ImageIndex, refs []Ref, created time.Time, dockerArch string) error {
	blobs, err := indexBlobs(idx)
	if err != nil {
		return err
	}
	index, err := indexJSON(idx, refs)
	if err != nil {
		return err
	}
	img, err := platformImage(idx, v1.Platform{OS: "linux", Architecture: dockerArch})
	if err != nil {
		return fmt.Errorf("manifest.json: %w", err)
	}
	docker, err := dockerManifest(img, refs)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	mtime := created.UTC().Truncate(time.Second)
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
			return err
		}
	}
	entries := append(blobs, bytesEntry("index.json", index), bytesEntry("manifest.json", docker), bytesEntry("oci-layout", []byte(ociLayoutFile)))
	for _, e := range entries {
		if err := writeEntry(tw, e, mtime); err != nil {
			return fmt.Errorf("archive %s: %w", e.name, err)
		}
	}
	return tw.Close()
}

func writeEntry(tw *tar.Writer, e archiveEntry, mtime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: e.size, ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
		return err
	}
	rc, err := e.data()
	if err != nil {
		return err
	}
	defer rc.Close()
	n, err := io.Copy(tw, rc)
	if err == nil && n != e.size {
		err = fmt.Errorf("wrote %d bytes, want %d", n, e.size)
	}
	return err
}

func bytesEntry(name string, b []byte) archiveEntry {
	return archiveEntry{name: name, size: int64(len(b)), data: func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}}
}

func blobPath(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }

// indexBlobs are the index's manifest (when it holds more than one image) and each
// image's manifest, config and compressed layers, sorted by name, each once.
func indexBlobs(idx v1.ImageIndex) ([]archiveEntry, error) {
	imgs, err := indexImages(idx)
	if err != nil {
		return nil, err
	}
	var entries []archiveEntry
	if len(imgs) > 1 {
		raw, err := idx.RawManifest()
		if err != nil {
			return nil, err
		}
		entries = append(entries, bytesEntry(blobPath(digestOf(raw)), raw))
	}
	for _, img := range imgs {
		e, err := imageBlobs(img)
		if err != nil {
			return nil, err
		}
		entries = append(entries, e...)
	}
	slices.SortFunc(entries, func(a, b archiveEntry) int { return cmpString(a.name, b.name) })
	return slices.CompactFunc(entries, func(a, b archiveEntry) bool { return a.name == b.name }), nil
}

// indexImages are the images of idx, in its order.
func indexImages(idx v1.ImageIndex) ([]v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var imgs []v1.Image
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	if len(imgs) == 0 {
		return nil, fmt.Errorf("the image index holds no image")
	}
	return imgs, nil
}

// platformImage is the image of idx for platform.
func platformImage(idx v1.ImageIndex, platform v1.Platform) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var have []string
	for _, m := range im.Manifests {
		if m.Platform != nil && m.Platform.OS == platform.OS && m.Platform.Architecture == platform.Architecture &&
			(platform.Variant == "" || m.Platform.Variant == platform.Variant) {
			return idx.Image(m.Digest)
		}
		if m.Platform != nil {
			have = append(have, m.Platform.String())
		}
	}
	return nil, fmt.Errorf("no image for %s (the index has %s)", platform.String(), strings.Join(have, ", "))
}

// imageBlobs are the image's manifest, config and compressed layers.
func imageBlobs(img v1.Image) ([]archiveEntry, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return nil, err
	}
	entries := []archiveEntry{bytesEntry(blobPath(digestOf(manifest)), manifest), bytesEntry(blobPath(digestOf(config)), config)}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		size, err := l.Size()
		if err != nil {
			return nil, err
		}
		entries = append(entries, archiveEntry{name: blobPath(d), size: size, data: l.Compressed})
	}
	return entries, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func digestOf(b []byte) v1.Hash {
	h, _, _ := v1.SHA256(bytes.NewReader(b)) // reading from memory cannot fail
	return h
}

// indexJSON is the OCI layout's index: once per ref, the image index (or its one
// image's manifest, with its platform), annotated with the ref's tag (skopeo's
// oci-archive:FILE:TAG) and full name (ctr images import).
func indexJSON(idx v1.ImageIndex, refs []Ref) ([]byte, error) {
	imgs, err := indexImages(idx)
	if err != nil {
		return nil, err
	}
	var desc v1.Descriptor
	if len(imgs) == 1 {
		d, err := partial.Descriptor(imgs[0])
		if err != nil {
			return nil, err
		}
		cfg, err := imgs[0].ConfigFile()
		if err != nil {
			return nil, err
		}
		desc = *d
		desc.Platform = &v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture}
	} else {
		d, err := partial.Descriptor(idx)
		if err != nil {
			return nil, err
		}
		desc = *d
	}
	desc.ArtifactType = "" // partial.Descriptor fills it in; it is for artifacts, not images
	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, r := range refs {
		d := desc
		d.Annotations = map[string]string{annotationRefName: r.Tag, annotationImageName: r.Full}
		index.Manifests = append(index.Manifests, d)
	}
	return json.Marshal(index)
}

// dockerManifest is `docker save`'s manifest.json for img, naming the OCI layout's blobs.
func dockerManifest(img v1.Image, refs []Ref) ([]byte, error) {
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	d := tarball.Descriptor{Config: blobPath(cfgName)}
	for _, r := range refs {
		d.RepoTags = append(d.RepoTags, r.Short)
	}
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return nil, err
		}
		d.Layers = append(d.Layers, blobPath(h))
	}
	return json.Marshal(tarball.Manifest{d})
}

// Archive is an image read from an archive WriteArchive wrote.
type Archive struct {
	Image v1.Image
	// Index is the image index the ref names, nil when it names Image.
	Index v1.ImageIndex
	dir   string // the OCI layout, extracted
}

// Close removes the extracted layout; Image cannot be read afterwards.
func (a *Archive) Close() error { return os.RemoveAll(a.dir) }

// OpenArchive reads the image tagged ref for platform ("linux/arm64") from an archive
// WriteArchive wrote, through its OCI layout, and checks that the Docker manifest.json
// describes the image of the same ref for its own platform (config and layers), read
// by go-containerregistry's tarball reader.
func OpenArchive(archive, ref, platform string) (*Archive, error) {
	p, err := v1.ParsePlatform(platform)
	if err != nil {
		return nil, fmt.Errorf("platform %q: %w", platform, err)
	}
	dir, err := os.MkdirTemp("", "nftproxy-image-layout-")
	if err != nil {
		return nil, err
	}
	a := &Archive{dir: dir}
	if a.Image, a.Index, err = openArchive(archive, ref, *p, dir); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func openArchive(archive, ref string, platform v1.Platform, dir string) (v1.Image, v1.ImageIndex, error) {
	if err := extractLayout(archive, dir); err != nil {
		return nil, nil, err
	}
	docker, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("%s as a docker archive: %w", archive, err)
	}
	dcfg, err := docker.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	same, _, err := layoutImage(dir, ref, v1.Platform{OS: dcfg.OS, Architecture: dcfg.Architecture})
	if err != nil {
		return nil, nil, err
	}
	if err := sameImage(same, docker); err != nil {
		return nil, nil, fmt.Errorf("%s: the OCI index and manifest.json differ: %w", archive, err)
	}
	return layoutImage(dir, ref, platform)
}

// sameImage checks that two images have the same config and layers. Their manifests
// differ: go-containerregistry's tarball reader makes a Docker one.
func sameImage(a, b v1.Image) error {
	ca, err := a.ConfigName()
	if err != nil {
		return err
	}
	cb, err := b.ConfigName()
	if err != nil {
		return err
	}
	if ca != cb {
		return fmt.Errorf("config %s vs %s", ca, cb)
	}
	la, err := layerIDs(a)
	if err != nil {
		return err
	}
	lb, err := layerIDs(b)
	if err != nil {
		return err
	}
	if !slices.Equal(la, lb) {
		return fmt.Errorf("layers %v vs %v", la, lb)
	}
	return nil
}

// layerIDs are the digest and diff ID of each layer, in order.
func layerIDs(img v1.Image) ([]v1.Hash, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	var ids []v1.Hash
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return nil, err
		}
		diff, err := l.DiffID()
		if err != nil {
			return nil, err
		}
		ids = append(ids, d, diff)
	}
	return ids, nil
}

// layoutImage finds the image named ref for platform in the OCI layout at dir: the
// manifest the ref names, or the platform's of the image index it names (returned too).
func layoutImage(dir, ref string, platform v1.Platform) (v1.Image, v1.ImageIndex, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("OCI layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, err
	}
	for _, m := range im.Manifests {
		if m.Annotations[annotationRefName] != ref {
			continue
		}
		if m.MediaType.IsIndex() {
			nested, err := idx.ImageIndex(m.Digest)
			if err != nil {
				return nil, nil, err
			}
			img, err := platformImage(nested, platform)
			return img, nested, err
		}
		if m.Platform == nil || m.Platform.OS != platform.OS || m.Platform.Architecture != platform.Architecture {
			return nil, nil, fmt.Errorf("image %q is for %v, not %s", ref, m.Platform, platform.String())
		}
		img, err := idx.Image(m.Digest)
		return img, nil, err
	}
	return nil, nil, fmt.Errorf("no image %q in the OCI index", ref)
}

// extractLayout copies the archive's regular files below dir, refusing names that
// leave it.
func extractLayout(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", archive, err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if err := root.MkdirAll(filepath.Dir(hdr.Name), 0o755); err != nil {
			return err
		}
		out, err := root.Create(hdr.Name)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
}
