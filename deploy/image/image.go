package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Keys of the OCI pre-defined annotations, used as labels too
// (https://github.com/opencontainers/image-spec/blob/main/annotations.md).
const (
	annotationVersion  = "org.opencontainers.image.version"
	annotationRevision = "org.opencontainers.image.revision"
	annotationSource   = "org.opencontainers.image.source"
	annotationCreated  = "org.opencontainers.image.created"
	// annotationRefName names an image in an OCI layout's index: the tag.
	annotationRefName = "org.opencontainers.image.ref.name"
	// annotationImageName is the full name containerd (ctr images import) and
	// Docker give an image of an OCI layout's index.
	annotationImageName = "io.containerd.image.name"
)

// BuildOptions say what goes into the image.
type BuildOptions struct {
	// Binaries are the static nftproxy binaries on disk, one per
	// architecture (read from each ELF header): the image index holds an
	// image of each.
	Binaries   []string
	Path       string // the binary's absolute path in each image
	Repository string // the image's name without a tag ("nftproxy")
	Version    string // tag, label and annotation
	Revision   string // the git commit
	Source     string // the source repository's URL
	Created    time.Time
}

// Ref is one name of the image: its tag and the two spellings archives use.
type Ref struct {
	Tag string // "v1.2.3": the OCI index's ref.name
	// Short is the name `docker save` writes into manifest.json ("nftproxy:v1.2.3").
	Short string
	// Full is the normalized name containerd gives the image
	// ("docker.io/library/nftproxy:v1.2.3").
	Full string
}

// Refs are the image's names: Repository tagged with Version, then with latest.
func (o BuildOptions) Refs() ([]Ref, error) {
	var refs []Ref
	for _, tag := range []string{o.Version, "latest"} {
		t, err := name.NewTag(o.Repository + ":" + tag)
		if err != nil {
			return nil, fmt.Errorf("image name %s:%s: %w", o.Repository, tag, err)
		}
		registry := t.RegistryStr()
		if registry == name.DefaultRegistry {
			registry = "docker.io" // how containerd spells Docker Hub
		}
		refs = append(refs, Ref{
			Tag:   t.TagStr(),
			Short: o.Repository + ":" + t.TagStr(),
			Full:  registry + "/" + t.RepositoryStr() + ":" + t.TagStr(),
		})
	}
	return refs, nil
}

// Build makes the image index: an image per binary (buildImage), for
// linux/<its architecture>, in the order of their platforms, the index
// carrying the version annotations too. Nodes pull the image of their
// platform; an architecture without a binary has none.
func Build(o BuildOptions) (v1.ImageIndex, error) {
	if len(o.Binaries) == 0 {
		return nil, fmt.Errorf("no binary")
	}
	var imgs []v1.Image
	seen := map[string]string{}
	for _, bin := range o.Binaries {
		img, err := buildImage(o, bin)
		if err != nil {
			return nil, err
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		if other, ok := seen[cfg.Architecture]; ok {
			return nil, fmt.Errorf("%s and %s are both %s binaries", other, bin, cfg.Architecture)
		}
		seen[cfg.Architecture] = bin
		imgs = append(imgs, img)
	}
	return NewIndex(imgs, o.labels())
}

// labels are the labels and annotations of the image and its index.
func (o BuildOptions) labels() map[string]string {
	return map[string]string{
		annotationVersion:  o.Version,
		annotationRevision: o.Revision,
		annotationSource:   o.Source,
		annotationCreated:  o.Created.UTC().Format(time.RFC3339),
	}
}

// NewIndex is an OCI image index of imgs, each described with its
// platform (os/architecture of its configuration), sorted by platform so
// that the same images give the same index. Its manifest is written the
// way the OCI image spec's Go types and skopeo write one (fields in their
// order, no artifactType, which is for artifacts, not images), so that
// `skopeo copy --all` to a registry keeps its bytes and digest.
func NewIndex(imgs []v1.Image, annotations map[string]string) (v1.ImageIndex, error) {
	idx := &index{images: map[v1.Hash]v1.Image{}}
	m := ociIndex{SchemaVersion: 2, MediaType: string(types.OCIImageIndex), Annotations: annotations}
	for _, img := range imgs {
		cfg, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		d, err := partial.Descriptor(img)
		if err != nil {
			return nil, err
		}
		idx.images[d.Digest] = img
		m.Manifests = append(m.Manifests, ociDescriptor{MediaType: string(d.MediaType), Digest: d.Digest.String(),
			Size: d.Size, Platform: &ociPlatform{Architecture: cfg.Architecture, OS: cfg.OS, Variant: cfg.Variant}})
	}
	slices.SortFunc(m.Manifests, func(a, b ociDescriptor) int { return strings.Compare(a.Platform.String(), b.Platform.String()) })
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	idx.raw = raw
	return idx, nil
}

// ociIndex, ociDescriptor and ociPlatform are the OCI image spec's types
// (specs-go/v1), field for field in their order.
type ociIndex struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType,omitempty"`
	Manifests     []ociDescriptor   `json:"manifests"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

type ociDescriptor struct {
	MediaType string       `json:"mediaType"`
	Digest    string       `json:"digest"`
	Size      int64        `json:"size"`
	Platform  *ociPlatform `json:"platform,omitempty"`
}

type ociPlatform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Variant      string `json:"variant,omitempty"`
}

func (p *ociPlatform) String() string { return p.OS + "/" + p.Architecture + "/" + p.Variant }

// index is an image index of images in memory, with its manifest's bytes.
type index struct {
	raw    []byte
	images map[v1.Hash]v1.Image
}

func (i *index) MediaType() (types.MediaType, error) { return types.OCIImageIndex, nil }
func (i *index) Size() (int64, error)                { return int64(len(i.raw)), nil }
func (i *index) RawManifest() ([]byte, error)        { return i.raw, nil }
func (i *index) Digest() (v1.Hash, error)            { return digestOf(i.raw), nil }

func (i *index) IndexManifest() (*v1.IndexManifest, error) {
	return v1.ParseIndexManifest(bytes.NewReader(i.raw))
}

func (i *index) Image(h v1.Hash) (v1.Image, error) {
	if img, ok := i.images[h]; ok {
		return img, nil
	}
	return nil, fmt.Errorf("no image %s in the index", h)
}

func (i *index) ImageIndex(h v1.Hash) (v1.ImageIndex, error) {
	return nil, fmt.Errorf("no image index %s in the index", h)
}

// buildImage makes the image of one binary: one layer holding it, an OCI manifest
// and config carrying the version labels and annotations, every timestamp o.Created.
func buildImage(o BuildOptions, binary string) (v1.Image, error) {
	if !path.IsAbs(o.Path) || path.Clean(o.Path) != o.Path {
		return nil, fmt.Errorf("path %q in the image must be absolute and clean", o.Path)
	}
	arch, err := staticBinaryArch(binary)
	if err != nil {
		return nil, err
	}
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	layerTar, err := binaryLayer(o.Path, bin, o.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	labels := o.labels()
	img, err := ociImage(arch, o.Created, v1.Config{Entrypoint: []string{o.Path}, Labels: labels})
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History: v1.History{
			Created:   v1.Time{Time: o.Created.UTC()},
			CreatedBy: fmt.Sprintf("deploy/image: %s at %s", path.Base(binary), o.Path),
			Comment:   "static nftproxy " + o.Version,
		},
	})
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels).(v1.Image), nil
}

// ociImage is an image without layers yet, in OCI media types, whose
// configuration is c for linux/arch, created at created: what Build and
// Pack append their layers to.
func ociImage(arch string, created time.Time, c v1.Config) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	return mutate.ConfigFile(img, &v1.ConfigFile{
		Architecture: arch,
		OS:           "linux",
		Created:      v1.Time{Time: created.UTC()},
		Config:       c,
		RootFS:       v1.RootFS{Type: "layers"},
	})
}

// elfArch maps ELF machines to GOARCH (the image config's architecture).
var elfArch = map[elf.Machine]string{
	elf.EM_X86_64:  "amd64",
	elf.EM_AARCH64: "arm64",
	elf.EM_386:     "386",
	elf.EM_ARM:     "arm",
	elf.EM_S390:    "s390x",
	elf.EM_RISCV:   "riscv64",
}

// staticBinaryArch checks that file is a statically linked ELF executable (no
// interpreter, no shared libraries: the image has no libc) and returns its
// architecture.
func staticBinaryArch(file string) (string, error) {
	f, err := elf.Open(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked (build it with CGO_ENABLED=0)", file)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return "", fmt.Errorf("%s needs shared libraries %v (build it with CGO_ENABLED=0)", file, libs)
	}
	arch, ok := elfArch[f.Machine]
	if f.Machine == elf.EM_PPC64 && f.ByteOrder == binary.LittleEndian {
		arch, ok = "ppc64le", true
	}
	if !ok {
		return "", fmt.Errorf("%s: no GOARCH known for ELF machine %v", file, f.Machine)
	}
	return arch, nil
}

// binaryLayer is a gzipped tar holding bin at file and its parent directories, owned
// by root, every time mtime. The gzip header carries no name and no time, so the bytes
// depend only on the inputs.
func binaryLayer(file string, bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	mtime = mtime.UTC().Truncate(time.Second)
	dirs := strings.Split(strings.TrimPrefix(path.Dir(file), "/"), "/")
	for i := range dirs {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.Join(dirs[:i+1], "/") + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatUSTAR}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(file, "/"), Mode: 0o755, Size: int64(len(bin)), ModTime: mtime, Format: tar.FormatUSTAR}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
