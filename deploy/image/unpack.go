package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Unpack writes the image's file system into dir, as a runtime's snapshotter would:
// go-containerregistry's mutate.Extract flattens the layers, applying whiteouts
// (.wh.NAME deletes NAME of lower layers, .wh..wh..opq hides a directory's lower
// contents), and every entry is created through an os.Root, so no name or symlink in
// the image can write outside dir. Modes (with setuid, setgid, sticky) and owners are
// kept; times are not. Device nodes and FIFOs are refused: images for nftproxy have
// none, and creating them needs more than a file system.
func Unpack(img v1.Image, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	flat := mutate.Extract(img)
	defer flat.Close()
	u := unpacker{root: root, chown: os.Geteuid() == 0}
	tr := tar.NewReader(flat)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("flatten layers: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("unpack %s: %w", hdr.Name, err)
		}
	}
	return u.finish()
}

// unpacker creates the entries of a flattened image. The flattened stream lists upper
// layers first, so an entry may come before its parent directory's entry and a hard
// link before its target: parents are created on demand, and directory modes and
// hard links are applied at the end.
type unpacker struct {
	root  *os.Root
	chown bool
	dirs  []*tar.Header
	links []*tar.Header
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	name := path.Clean(hdr.Name)
	if name == "." || name == "/" {
		return nil
	}
	if err := u.root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		u.dirs = append(u.dirs, hdr)
		return u.root.MkdirAll(name, 0o755)
	case tar.TypeReg:
		return u.file(name, hdr, r)
	case tar.TypeSymlink:
		if err := u.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := u.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return u.owner(name, hdr)
	case tar.TypeLink:
		u.links = append(u.links, hdr)
		return nil
	}
	return fmt.Errorf("entry type %q is not supported", hdr.Typeflag)
}

func (u *unpacker) file(name string, hdr *tar.Header, r io.Reader) error {
	f, err := u.root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := u.owner(name, hdr); err != nil {
		return err
	}
	// Chmod after chown: chown clears setuid and setgid.
	return u.root.Chmod(name, mode(hdr))
}

func (u *unpacker) owner(name string, hdr *tar.Header) error {
	if !u.chown {
		return nil
	}
	return u.root.Lchown(name, hdr.Uid, hdr.Gid)
}

// finish makes the hard links and gives directories their owners and modes (last, so
// that a read-only directory did not stop its entries from being created).
func (u *unpacker) finish() error {
	for _, hdr := range u.links {
		name, target := path.Clean(hdr.Name), path.Clean(hdr.Linkname)
		if err := u.root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := u.root.Link(target, name); err != nil {
			return fmt.Errorf("unpack %s: %w", hdr.Name, err)
		}
	}
	for _, hdr := range u.dirs {
		name := path.Clean(hdr.Name)
		if err := u.owner(name, hdr); err != nil {
			return err
		}
		if err := u.root.Chmod(name, mode(hdr)); err != nil {
			return err
		}
	}
	return nil
}

// mode is the entry's permission bits with setuid, setgid and sticky.
func mode(hdr *tar.Header) fs.FileMode {
	return hdr.FileInfo().Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}
