package main

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
)

// mergedDirs are the top-level directories Debian 12 keeps under /usr
// (usrmerge): /bin is a symbolic link to usr/bin, and so on. Packages still
// ship files under /bin and /lib, which their maintainer scripts never
// move: Tree moves them itself, since no maintainer script runs here.
var mergedDirs = []string{"bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// droppedDirs hold nothing a test runs: documentation, manual pages,
// translations and Debian's packaging checks.
var droppedDirs = []string{
	"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
	"usr/share/lintian", "usr/share/bug", "usr/share/doc-base",
}

// entry is one file system object of a Tree.
type entry struct {
	typ      byte // tar.TypeReg, TypeDir or TypeSymlink
	mode     int64
	uid, gid int
	link     string // symbolic link target
	data     []byte
}

// Tree is a root file system being put together in memory: the files of
// Debian packages (AddTar of `dpkg-deb --fsys-tarfile`, the data a package
// would unpack; no maintainer script runs) and files an image adds. WriteLayer
// writes it as an image layer whose bytes depend only on its content and the
// given time.
type Tree struct {
	entries map[string]*entry
}

// NewTree returns a tree holding the usrmerge links (bin → usr/bin, …).
func NewTree() *Tree {
	t := &Tree{entries: map[string]*entry{}}
	for _, d := range mergedDirs {
		t.put(d, &entry{typ: tar.TypeSymlink, mode: 0o777, link: "usr/" + d})
	}
	return t
}

// clean turns an archive's name ("./bin/ls", "bin/", "/bin/ls") into the
// tree's path ("usr/bin/ls"), following usrmerge. It returns "" for the root
// and for names that leave it.
func clean(name string) string {
	p := path.Clean("/" + name)
	if p == "/" || strings.Contains(name, "/../") || strings.HasPrefix(name, "../") {
		return ""
	}
	p = p[1:]
	top, rest, _ := strings.Cut(p, "/")
	if slices.Contains(mergedDirs, top) {
		if rest == "" {
			return "usr/" + top
		}
		return "usr/" + top + "/" + rest
	}
	return p
}

// dropped reports whether p is in one of droppedDirs.
func dropped(p string) bool {
	for _, d := range droppedDirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// put adds e at p, creating missing parent directories (0755, root). A
// later entry replaces an earlier one, as a later package's file replaces an
// earlier one's, except that a directory stays a directory (packages repeat
// their parents).
func (t *Tree) put(p string, e *entry) {
	if old, ok := t.entries[p]; ok && old.typ == tar.TypeDir && e.typ == tar.TypeDir {
		return
	}
	for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
		if _, ok := t.entries[dir]; ok {
			break
		}
		t.entries[dir] = &entry{typ: tar.TypeDir, mode: 0o755}
	}
	t.entries[p] = e
}

// AddTar adds the files of a tar stream, as a package's data archive holds
// them: moved by usrmerge, without droppedDirs, owner IDs kept (names
// dropped), hard links made copies of their target. Other entry types
// (devices, FIFOs) are refused: no package of ours ships one.
func (t *Tree) AddTar(r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := clean(hdr.Name)
		if p == "" || dropped(p) {
			continue
		}
		e := &entry{typ: hdr.Typeflag, mode: hdr.Mode & 0o7777, uid: hdr.Uid, gid: hdr.Gid}
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeRegA:
			e.typ = tar.TypeReg
			if e.data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
		case tar.TypeDir:
		case tar.TypeSymlink:
			e.mode, e.link = 0o777, hdr.Linkname
		case tar.TypeLink:
			// A copy: the layer is sorted by path, and a hard link must
			// follow its target in a tar.
			target, ok := t.entries[clean(hdr.Linkname)]
			if !ok || target.typ != tar.TypeReg {
				continue // its target was dropped
			}
			copied := *target
			e = &copied
		default:
			return fmt.Errorf("%s: unsupported tar entry type %q", hdr.Name, hdr.Typeflag)
		}
		t.put(p, e)
	}
}

// AddFile adds a regular file owned by root.
func (t *Tree) AddFile(name string, mode int64, data []byte) {
	t.put(clean(name), &entry{typ: tar.TypeReg, mode: mode, data: data})
}

// AddDir adds a directory owned by root (or changes an existing one's mode).
func (t *Tree) AddDir(name string, mode int64) {
	p := clean(name)
	if old, ok := t.entries[p]; ok && old.typ == tar.TypeDir {
		old.mode = mode
		return
	}
	t.put(p, &entry{typ: tar.TypeDir, mode: mode})
}

// AddSymlink adds a symbolic link.
func (t *Tree) AddSymlink(name, target string) {
	t.put(clean(name), &entry{typ: tar.TypeSymlink, mode: 0o777, link: target})
}

// Has reports whether name (usrmerge applied) is in the tree.
func (t *Tree) Has(name string) bool {
	_, ok := t.entries[clean(name)]
	return ok
}

// File returns the content of the regular file name.
func (t *Tree) File(name string) ([]byte, bool) {
	e, ok := t.entries[clean(name)]
	if !ok || e.typ != tar.TypeReg {
		return nil, false
	}
	return e.data, true
}

// Paths lists the tree's paths, sorted.
func (t *Tree) Paths() []string {
	paths := make([]string, 0, len(t.entries))
	for p := range t.entries {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	return paths
}

// WriteLayer writes the tree as a gzip-compressed tar: entries sorted by path
// (a directory before its content), every time mtime, no owner names. The
// gzip header carries no name and no time.
func (t *Tree) WriteLayer(w io.Writer, mtime time.Time) error {
	zw, err := gzip.NewWriterLevel(w, gzip.BestSpeed)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	mtime = mtime.UTC().Truncate(time.Second)
	for _, p := range t.Paths() {
		e := t.entries[p]
		hdr := &tar.Header{Typeflag: e.typ, Name: p, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatPAX}
		switch e.typ {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeReg:
			hdr.Size = int64(len(e.data))
		case tar.TypeSymlink:
			hdr.Linkname = e.link
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write(e.data); err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}
