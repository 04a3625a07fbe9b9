package nodes

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// mergedDirs are the top-level directories that are symbolic links into
// /usr on a merged-/usr system (every Debian release since bookworm, and
// bullseye installations that chose it). A Node's root is laid out so
// whatever the release's packages ship: a package's /sbin/ip lands in
// /usr/sbin/ip, reachable by both names, as on a merged-/usr machine.
var mergedDirs = []string{"bin", "sbin", "lib", "lib64"}

// mergedPath maps a path inside a root (without leading slash) to where it
// lives on a merged-/usr system.
func mergedPath(p string) string {
	first, _, _ := strings.Cut(p, "/")
	for _, d := range mergedDirs {
		if first == d {
			return "usr/" + p
		}
	}
	return p
}

// makeMergedRoot creates root with its usr/{bin,sbin,lib,lib64} and the
// top-level links to them.
func makeMergedRoot(root string) error {
	for _, d := range mergedDirs {
		if err := os.MkdirAll(filepath.Join(root, "usr", d), 0o755); err != nil {
			return err
		}
		if err := os.Symlink("usr/"+d, filepath.Join(root, d)); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	return nil
}

// unpackDeb extracts the files of the package deb into root, like dpkg-deb
// -x but onto a merged-/usr layout (mergedPath), and returns the paths of
// the files and links it holds (without leading slash, merged). keep, if
// not nil, picks which entries to extract.
func unpackDeb(ctx context.Context, deb, root string, keep func(name string) bool) ([]string, error) {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	names, err := untar(stdout, root, keep)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("unpack %s: %w", filepath.Base(deb), err)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, stderr.String())
	}
	return names, nil
}

// untar extracts a package's data archive (see unpackDeb).
func untar(r io.Reader, root string, keep func(name string) bool) ([]string, error) {
	var names []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." || name == ".." || strings.HasPrefix(name, "../") || path.IsAbs(name) {
			continue
		}
		// The links a package may ship for the merged layout itself
		// (base-files') exist already.
		if h.Typeflag == tar.TypeSymlink && mergedPath(name) != name && !strings.Contains(name, "/") {
			continue
		}
		name = mergedPath(name)
		if keep != nil && h.Typeflag != tar.TypeDir && !keep(name) {
			continue
		}
		dst := filepath.Join(root, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return nil, err
			}
			continue
		case tar.TypeReg:
			if err := writeFile(dst, tr, fs.FileMode(h.Mode).Perm()); err != nil {
				return nil, err
			}
		case tar.TypeSymlink:
			if err := replace(dst, func() error { return os.Symlink(h.Linkname, dst) }); err != nil {
				return nil, err
			}
		case tar.TypeLink:
			old := filepath.Join(root, mergedPath(path.Clean(strings.TrimPrefix(h.Linkname, "./"))))
			if err := replace(dst, func() error { return os.Link(old, dst) }); err != nil {
				return nil, err
			}
		default:
			continue // devices, fifos: none in the packages we unpack
		}
		names = append(names, name)
	}
}

// writeFile writes r's content to path with perm, replacing what is there.
func writeFile(dst string, r io.Reader, perm fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	os.Remove(dst)
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// replace removes dst (a file or link) and creates it anew with create.
func replace(dst string, create func() error) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return create()
}

// resolveIn follows p (a path inside root, without leading slash) through
// the symbolic links of any of its components, as the guest's kernel will,
// with absolute targets taken relative to root. It returns the links it
// passed, as paths whose directories are no links, and the final path.
func resolveIn(root, p string) (links []string, final string, err error) {
	orig := p
	for hops := 0; hops < 40; hops++ {
		parts := strings.Split(path.Clean(p), "/")
		cur := ""
		restarted := false
		for i, part := range parts {
			next := path.Join(cur, part)
			st, err := os.Lstat(filepath.Join(root, next))
			if err != nil {
				return nil, "", fmt.Errorf("%s: %w", orig, err)
			}
			if st.Mode()&fs.ModeSymlink == 0 {
				cur = next
				continue
			}
			target, err := os.Readlink(filepath.Join(root, next))
			if err != nil {
				return nil, "", err
			}
			links = append(links, next)
			rest := strings.Join(parts[i+1:], "/")
			if path.IsAbs(target) {
				p = path.Join(target[1:], rest)
			} else {
				p = path.Join(cur, target, rest)
			}
			if p == ".." || strings.HasPrefix(p, "../") {
				return nil, "", fmt.Errorf("%s: leads out of the root", orig)
			}
			restarted = true
			break
		}
		if !restarted {
			return links, cur, nil
		}
	}
	return nil, "", fmt.Errorf("%s: too many levels of symbolic links", orig)
}
