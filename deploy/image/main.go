// Command image builds nftproxy's container image without a container engine, and
// unpacks such an image into a root filesystem (for the e2e test that runs it with runc).
//
//	image build  --binary bin/nftproxy-linux-amd64 --binary bin/nftproxy-linux-arm64 \
//	             --out bin/nftproxy-image.tar --version v1.2.3 --revision <commit> \
//	             --created 2026-11-24T10:00:00Z [--docker-arch amd64]
//	image unpack --archive bin/nftproxy-image.tar --rootfs DIR [--ref latest] [--platform linux/arm64]
//	image pack   --layer base.tar.gz --layer top.tar.gz --name registry.k8s.io/pause:3.10.2 \
//	             [--entrypoint '["/pause"]'] [--cmd '[]'] [--env K=V] [--workdir /] --out pause.tar
//
// The archive holds an image index with an image per binary, one per architecture (nodes
// pull the one of their platform). Each image holds one layer: the static binary at
// /usr/local/bin/nftproxy (the path deploy/daemonset.yaml runs) and its parent
// directories, nothing else. No shell, no
// nft, no iptables: nftproxy programs the kernel over netlink and runs no other program.
// It needs no CA bundle (the kubeconfig names the cluster's CA), no /etc/passwd (it runs
// as root), no time zone data (logs are in UTC without /etc/localtime) and no
// /etc/nsswitch.conf (Go then looks names up in /etc/hosts, then DNS); /proc, /sys, /dev,
// /etc/hosts and /etc/resolv.conf come from the container runtime.
//
// pack makes an image of prepared layers (tar files) instead: `make conformance`'s test
// images (e2e/cmd/testimages), which carry Debian's programs and libraries.
//
// The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/…) that also
// carries a Docker manifest.json pointing at the blobs of one of its images
// (--docker-arch), as `docker save` writes since Docker 25: `ctr images import` (which
// keeps the node's platform) and skopeo's oci-archive: transport read the former, `docker
// load` and skopeo's docker-archive: transport the latter. Every timestamp in it is
// --created, so the same binaries and flags give the same bytes and digests.
//
// This is a module of its own so that go-containerregistry stays out of nftproxy's
// module graph.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = buildCmd(os.Args[2:])
	case "unpack":
		err = unpackCmd(os.Args[2:])
	case "pack":
		err = packCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "image %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: image build|unpack|pack [flags] (image <command> -h lists the flags)")
	os.Exit(2)
}

func buildCmd(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	var o BuildOptions
	var binaries stringList
	var created, out, dockerArch string
	fs.Var(&binaries, "binary", "a static nftproxy binary (repeatable: one per architecture, read from its ELF header)")
	fs.StringVar(&o.Path, "path", "/usr/local/bin/nftproxy", "where the binary is in the image")
	fs.StringVar(&o.Repository, "repository", "nftproxy", "image name, tagged with --version and latest")
	fs.StringVar(&o.Version, "version", "", "version (label, annotation and tag)")
	fs.StringVar(&o.Revision, "revision", "", "source revision (git commit)")
	fs.StringVar(&o.Source, "source", "https://github.com/nftproxy/nftproxy", "source repository URL")
	fs.StringVar(&created, "created", "", "creation time, RFC 3339 (e.g. the commit's date): every timestamp in the image")
	fs.StringVar(&dockerArch, "docker-arch", "amd64", "the architecture whose image manifest.json (docker load) names")
	fs.StringVar(&out, "out", "", "the archive to write")
	fs.Parse(args)
	if len(binaries) == 0 || o.Version == "" || o.Revision == "" || created == "" || out == "" {
		return fmt.Errorf("--binary, --version, --revision, --created and --out are required")
	}
	t, err := time.Parse(time.RFC3339, created)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}
	o.Binaries, o.Created = binaries, t
	idx, err := Build(o)
	if err != nil {
		return err
	}
	refs, err := o.Refs()
	if err != nil {
		return err
	}
	if err := writeArchiveFile(out, idx, refs, o.Created, dockerArch); err != nil {
		return err
	}
	digest, err := idx.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s\n  %s %s\n  %s (index)\n", out, refs[0].Short, refs[1].Short, digest)
	imgs, err := indexImages(idx)
	if err != nil {
		return err
	}
	for _, img := range imgs {
		cfg, err := img.ConfigFile()
		if err != nil {
			return err
		}
		d, err := img.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("  %s %s/%s\n", d, cfg.OS, cfg.Architecture)
	}
	return nil
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// jsonList is a flag holding a JSON array of strings, as a Dockerfile's
// exec form: `--entrypoint '["/agnhost"]'`.
type jsonList struct{ list []string }

func (l *jsonList) String() string     { b, _ := json.Marshal(l.list); return string(b) }
func (l *jsonList) Set(v string) error { return json.Unmarshal([]byte(v), &l.list) }

func packCmd(args []string) error {
	fs := flag.NewFlagSet("pack", flag.ExitOnError)
	var o PackOptions
	var layers, names, env stringList
	var entrypoint, cmd jsonList
	var created, out string
	fs.Var(&layers, "layer", "a layer: tar file, gzip-compressed or not (repeatable, bottom first)")
	fs.Var(&names, "name", "a full image name, REPOSITORY:TAG (repeatable)")
	fs.Var(&entrypoint, "entrypoint", `entrypoint, a JSON array ("[\"/agnhost\"]")`)
	fs.Var(&cmd, "cmd", "command (arguments of the entrypoint), a JSON array")
	fs.Var(&env, "env", "an environment variable, K=V (repeatable)")
	fs.StringVar(&o.WorkingDir, "workdir", "", "working directory")
	fs.StringVar(&o.Arch, "arch", runtime.GOARCH, "architecture")
	fs.StringVar(&created, "created", "1970-01-01T00:00:00Z", "creation time, RFC 3339: every timestamp in the image")
	fs.StringVar(&out, "out", "", "the archive to write")
	fs.Parse(args)
	if len(layers) == 0 || len(names) == 0 || out == "" {
		return fmt.Errorf("--layer, --name and --out are required")
	}
	t, err := time.Parse(time.RFC3339, created)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}
	o.Layers, o.Names, o.Env, o.Created = layers, names, env, t
	o.Entrypoint, o.Cmd = entrypoint.list, cmd.list
	refs, err := RefsFromNames(o.Names)
	if err != nil {
		return err
	}
	img, err := Pack(o)
	if err != nil {
		return err
	}
	idx, err := NewIndex([]v1.Image{img}, nil)
	if err != nil {
		return err
	}
	if err := writeArchiveFile(out, idx, refs, o.Created, o.Arch); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s\n  %s\n  %s\n", out, strings.Join(o.Names, " "), digest)
	return nil
}

// writeArchiveFile writes the archive next to path and renames it, so that a reader
// never sees half an archive.
func writeArchiveFile(path string, idx v1.ImageIndex, refs []Ref, created time.Time, dockerArch string) error {
	tmp := fmt.Sprintf("%s.tmp%d", path, os.Getpid())
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	err = WriteArchive(f, idx, refs, created, dockerArch)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// unpackOutput is what unpack prints: enough for a runtime to run the image.
type unpackOutput struct {
	// Digest is the image manifest's digest.
	Digest string `json:"digest"`
	// Index is the digest of the image index the ref names, when it names one.
	Index string `json:"index,omitempty"`
	// Config is the image configuration (entrypoint, env, labels, …).
	Config json.RawMessage `json:"config"`
}

func unpackCmd(args []string) error {
	fs := flag.NewFlagSet("unpack", flag.ExitOnError)
	archive := fs.String("archive", "", "the image archive")
	ref := fs.String("ref", "latest", "which image of the archive: its org.opencontainers.image.ref.name")
	platform := fs.String("platform", "linux/"+runtime.GOARCH, "which platform's image of an image index")
	rootfs := fs.String("rootfs", "", "an empty directory to unpack the image's layers into")
	fs.Parse(args)
	if *archive == "" || *rootfs == "" {
		return fmt.Errorf("--archive and --rootfs are required")
	}
	a, err := OpenArchive(*archive, *ref, *platform)
	if err != nil {
		return err
	}
	defer a.Close()
	img := a.Image
	if err := Unpack(img, *rootfs); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	out := unpackOutput{Digest: digest.String(), Config: cfg}
	if a.Index != nil {
		d, err := a.Index.Digest()
		if err != nil {
			return err
		}
		out.Index = d.String()
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}
