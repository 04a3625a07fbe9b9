package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var (
	staticMu   sync.Mutex
	staticBins = map[string]string{} // GOARCH → binary
	staticDir  string
)

// staticBinary builds a small static Go program for goarch once for the tests in this
// package.
func staticBinary(t *testing.T, goarch string) string {
	t.Helper()
	staticMu.Lock()
	defer staticMu.Unlock()
	if bin, ok := staticBins[goarch]; ok {
		return bin
	}
	if staticDir == "" {
		dir, err := os.MkdirTemp("", "nftproxy-image-test-")
		if err != nil {
			t.Fatal(err)
		}
		src := "package main\n\nvar version = \"dev\"\n\nfunc main() { println(version) }\n"
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		staticDir = dir
	}
	bin := filepath.Join(staticDir, "hello-"+goarch)
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "main.go")
	cmd.Dir = staticDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build a static test binary for %s: %v\n%s", goarch, err, out)
	}
	staticBins[goarch] = bin
	return bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if staticDir != "" {
		os.RemoveAll(staticDir)
	}
	os.Exit(code)
}

// testArchs are the architectures of the test images, as `make image` builds them.
var testArchs = []string{"arm64", "amd64"}

func testOptions(t *testing.T) BuildOptions {
	var bins []string
	for _, arch := range testArchs {
		bins = append(bins, staticBinary(t, arch))
	}
	return BuildOptions{
		Binaries: bins, Path: "/usr/local/bin/nftproxy", Repository: "nftproxy",
		Version: "v1.2.3", Revision: "0123456789abcdef0123456789abcdef01234567",
		Source: "https://github.com/nftproxy/nftproxy", Created: time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC),
	}
}

// archive builds the image index of o and writes its archive to memory.
func archive(t *testing.T, o BuildOptions) []byte {
	t.Helper()
	idx, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	refs, err := o.Refs()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteArchive(&buf, idx, refs, o.Created, "amd64"); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestArchiveIsReproducible(t *testing.T) {
	o := testOptions(t)
	a, b := archive(t, o), archive(t, o)
	if !bytes.Equal(a, b) {
		t.Fatal("two builds from the same inputs differ")
	}
	o.Created = o.Created.Add(time.Second)
	if bytes.Equal(a, archive(t, o)) {
		t.Fatal("a different creation time gave the same archive")
	}
	// Every entry carries the creation time: nothing from the clock or the machine.
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		if !hdr.ModTime.Equal(testOptions(t).Created) || hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" {
			t.Errorf("%s: mtime %v, owner %d:%d %q", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid, hdr.Uname)
		}
	}
}

// TestArchiveReaders reads the archive through go-containerregistry's OCI layout
// reader (as ctr and skopeo's oci-archive do), for each platform, and its tarball reader
// (docker-archive: the amd64 image), validating every digest and size, and checks
// names, labels and annotations.
func TestArchiveReaders(t *testing.T) {
	o := testOptions(t)
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, archive(t, o), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, arch := range testArchs {
		var digests []v1.Hash
		for _, ref := range []string{"latest", o.Version} {
			a, err := OpenArchive(path, ref, "linux/"+arch)
			if err != nil {
				t.Fatalf("OpenArchive %s for %s: %v", ref, arch, err)
			}
			if err := validate.Image(a.Image); err != nil {
				t.Errorf("OCI view of %s for %s: %v", ref, arch, err)
			}
			d, _ := a.Image.Digest()
			digests = append(digests, d)
			checkImage(t, a.Image, o, arch)
			a.Close()
		}
		if digests[0] != digests[1] {
			t.Errorf("%s: latest is %s, %s is %s", arch, digests[0], o.Version, digests[1])
		}
	}
	if _, err := OpenArchive(path, "v9", "linux/amd64"); err == nil {
		t.Error("OpenArchive found a tag the archive does not have")
	}
	if _, err := OpenArchive(path, "latest", "linux/s390x"); err == nil {
		t.Error("OpenArchive found an image for a platform the archive does not have")
	}
	for _, ref := range []string{"nftproxy:latest", "nftproxy:" + o.Version} {
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		img, err := tarball.ImageFromPath(path, &tag)
		if err != nil {
			t.Fatalf("docker view of %s: %v", ref, err)
		}
		if err := validate.Image(img); err != nil {
			t.Errorf("docker view of %s: %v", ref, err)
		}
		checkImage(t, img, o, "amd64")
	}
	idx, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	digest, _ := idx.Digest()
	checkIndex(t, path, digest)
}

// TestIndex: the index holds an image per binary, for linux/<its architecture>, sorted
// by platform whatever the order of the binaries, each image's platform in its
// descriptor, and validates; one binary gives an index of one image, which the
// archive's index.json names directly.
func TestIndex(t *testing.T) {
	o := testOptions(t)
	idx, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	// As a reader of the archive sees it: the layout's index, the image index it
	// names, the images, every digest and size.
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, archive(t, o), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := extractLayout(path, dir); err != nil {
		t.Fatal(err)
	}
	lidx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(lidx); err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var platforms []string
	for _, m := range im.Manifests {
		platforms = append(platforms, m.Platform.String())
	}
	if want := []string{"linux/amd64", "linux/arm64"}; !slices.Equal(platforms, want) {
		t.Errorf("index platforms %q, want %q", platforms, want)
	}
	if im.Annotations[annotationVersion] != o.Version || im.MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Errorf("index %s, annotations %v", im.MediaType, im.Annotations)
	}
	slices.Reverse(o.Binaries)
	again, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustDigest(t, idx), mustDigest(t, again); a != b {
		t.Errorf("the binaries' order changed the index: %s, %s", a, b)
	}

	o.Binaries = o.Binaries[:1]
	one, err := Build(o)
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := indexImages(one)
	if err != nil || len(imgs) != 1 {
		t.Fatalf("%d images, %v", len(imgs), err)
	}
	if err := os.WriteFile(path, archive(t, o), 0o644); err != nil {
		t.Fatal(err)
	}
	checkIndex(t, path, mustDigest(t, imgs[0]))
}

func mustDigest(t *testing.T, d interface{ Digest() (v1.Hash, error) }) v1.Hash {
	t.Helper()
	h, err := d.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func checkImage(t *testing.T, img v1.Image, o BuildOptions, arch string) {
	t.Helper()
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{annotationVersion: o.Version, annotationRevision: o.Revision,
		annotationSource: o.Source, annotationCreated: "2026-11-24T10:00:00Z"}
	for k, v := range want {
		if cfg.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cfg.Config.Labels[k], v)
		}
	}
	if !slices.Equal(cfg.Config.Entrypoint, []string{o.Path}) || cfg.OS != "linux" || cfg.Architecture != arch || !cfg.Created.Equal(o.Created) {
		t.Errorf("config %+v", cfg)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
		names = append(names, hdr.Name)
	}
	if want := []string{"usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/nftproxy"}; !slices.Equal(names, want) {
		t.Errorf("layer holds %q, want %q", names, want)
	}
}

// checkIndex checks the names ctr, skopeo and docker give the image, and that every
// entry of index.json names digest.
func checkIndex(t *testing.T, path string, digest v1.Hash) {
	t.Helper()
	files := map[string][]byte{}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for hdr, err := tr.Next(); err == nil; hdr, err = tr.Next() {
		if hdr.Name == "index.json" || hdr.Name == "manifest.json" {
			var buf bytes.Buffer
			buf.ReadFrom(tr)
			files[hdr.Name] = buf.Bytes()
		}
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	var full []string
	for _, m := range index.Manifests {
		full = append(full, m.Annotations[annotationImageName])
		if m.Digest != digest || m.MediaType.IsIndex() == (m.Platform != nil) || m.ArtifactType != "" {
			t.Errorf("index entry %+v", m)
		}
	}
	if want := []string{"docker.io/library/nftproxy:v1.2.3", "docker.io/library/nftproxy:latest"}; !slices.Equal(full, want) {
		t.Errorf("index names %q, want %q", full, want)
	}
	var docker tarball.Manifest
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil {
		t.Fatal(err)
	}
	if len(docker) != 1 || !slices.Equal(docker[0].RepoTags, []string{"nftproxy:v1.2.3", "nftproxy:latest"}) {
		t.Errorf("manifest.json %+v", docker)
	}
}

func TestBuildRefuses(t *testing.T) {
	o := testOptions(t)
	o.Path = "usr/local/bin/nftproxy"
	if _, err := Build(o); err == nil {
		t.Error("a relative path in the image was accepted")
	}
	o = testOptions(t)
	o.Version = "has space"
	if _, err := o.Refs(); err == nil {
		t.Error("a version that is no valid tag was accepted")
	}
	o = testOptions(t)
	o.Binaries = []string{staticBinary(t, "amd64"), staticBinary(t, "amd64")}
	if _, err := Build(o); err == nil {
		t.Error("two binaries of one architecture were accepted")
	}
	// Debian's coreutils are linked dynamically.
	dynamic := "/bin/true"
	if f, err := elf.Open(dynamic); err != nil || !slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		t.Skipf("%s is no dynamically linked executable here (%v)", dynamic, err)
	}
	if _, err := staticBinaryArch(dynamic); err == nil {
		t.Errorf("%s accepted as a static binary", dynamic)
	}
	if _, err := staticBinaryArch(staticBinary(t, "amd64")); err != nil {
		t.Error(err)
	}
}
