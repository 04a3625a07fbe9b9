package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PackOptions say what goes into an image made of prepared layers: the test
// images of `make conformance` (e2e/cmd/testimages writes their layers), which
// carry shared libraries and several programs, unlike nftproxy's own image
// (Build: one static binary).
type PackOptions struct {
	// Layers are tar files, gzip-compressed or not, bottom first.
	Layers []string
	// Names are the image's full names ("registry.k8s.io/pause:3.10.2",
	// "nftproxy:latest"); each becomes a Ref (RefsFromNames).
	Names []string
	// Entrypoint, Cmd, Env and WorkingDir are the image configuration's.
	Entrypoint, Cmd, Env []string
	WorkingDir           string
	// Arch is the configuration's architecture (GOARCH spelling).
	Arch    string
	Created time.Time
}

// Pack makes the image: the layers in order, an OCI manifest and config, every
// timestamp o.Created. The layers' bytes are taken as they are, so the same
// files give the same digests.
func Pack(o PackOptions) (v1.Image, error) {
	if len(o.Layers) == 0 {
		return nil, fmt.Errorf("no layer")
	}
	if o.Arch == "" {
		return nil, fmt.Errorf("no architecture")
	}
	img, err := ociImage(o.Arch, o.Created, v1.Config{Entrypoint: o.Entrypoint, Cmd: o.Cmd, Env: o.Env, WorkingDir: o.WorkingDir})
	if err != nil {
		return nil, err
	}
	for _, file := range o.Layers {
		layer, err := tarball.LayerFromFile(file, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", file, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     layer,
			MediaType: types.OCILayer,
			History: v1.History{
				Created:   v1.Time{Time: o.Created.UTC()},
				CreatedBy: "deploy/image pack: " + filepath.Base(file),
			},
		})
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", file, err)
		}
	}
	return img, nil
}

// RefsFromNames turns full image names into Refs. Tag, the OCI index's
// ref.name, is the whole name: a test image and the pause image may share a
// tag, and skopeo's oci-archive:FILE:REF then still picks one. Short is the
// name `docker save` writes (Docker Hub's without its registry), Full the
// one containerd gives the image.
func RefsFromNames(names []string) ([]Ref, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("no image name")
	}
	var refs []Ref
	seen := map[string]bool{}
	for _, n := range names {
		t, err := name.NewTag(n)
		if err == nil && !strings.Contains(n[strings.LastIndex(n, "/")+1:], ":") {
			err = fmt.Errorf("no tag")
		}
		if err != nil {
			return nil, fmt.Errorf("image name %q (want REPOSITORY:TAG): %w", n, err)
		}
		registry := t.RegistryStr()
		short := t.RepositoryStr() + ":" + t.TagStr()
		if registry == name.DefaultRegistry {
			registry = "docker.io" // how containerd spells Docker Hub
			if repo, ok := strings.CutPrefix(t.RepositoryStr(), "library/"); ok {
				short = repo + ":" + t.TagStr()
			}
		} else {
			short = registry + "/" + short
		}
		full := registry + "/" + t.RepositoryStr() + ":" + t.TagStr()
		if seen[full] {
			return nil, fmt.Errorf("image name %q given twice", full)
		}
		seen[full] = true
		refs = append(refs, Ref{Tag: full, Short: short, Full: full})
	}
	return refs, nil
}
