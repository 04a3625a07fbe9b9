package nodes

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
)

// cpioWriter writes a cpio archive in the "newc" format, the one the
// kernel unpacks into its initramfs (Documentation/driver-api/early-userspace/
// buffer-format.rst): each entry a 110-byte ASCII header of hexadecimal
// fields, its NUL-terminated name and its data, both padded to four bytes;
// "TRAILER!!!" last. The kernel creates no missing directories, so the
// writer adds every entry's parents first (0755, root's), once.
//
// Archives may be concatenated: the kernel unpacks one after the other
// into the same root, which is how Run adds a job to a Node's archive.
type cpioWriter struct {
	w    *bufio.Writer
	ino  uint32
	seen map[string]bool // paths written, without the leading slash
	err  error
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), ino: 1, seen: map[string]bool{}}
}

// Unix file types of a cpio header's mode.
const (
	cpioDir     = 0o040000
	cpioRegular = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

// header writes one entry's header and name.
func (c *cpioWriter) header(name string, mode uint32, size int64) {
	c.headerDev(name, mode, size, 0, 0)
}

// headerDev is header with the device numbers of a device file.
func (c *cpioWriter) headerDev(name string, mode uint32, size int64, major, minor uint32) {
	if c.err != nil {
		return
	}
	if size > 0xffffffff {
		c.err = fmt.Errorf("cpio: %s: %d bytes is more than newc can hold", name, size)
		return
	}
	c.ino++
	nlink := 1
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check.
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, size, 0, 0, major, minor, len(name)+1, 0)
	if c.err != nil {
		return
	}
	c.write([]byte(name + "\x00"))
	c.pad(int64(110 + len(name) + 1))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad writes the NULs that bring n bytes to a multiple of four.
func (c *cpioWriter) pad(n int64) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

// clean checks a guest path and returns it without its leading slash.
func cleanGuestPath(p string) (string, error) {
	if !path.IsAbs(p) || path.Clean(p) != p || p == "/" {
		return "", fmt.Errorf("guest path %q: want an absolute, clean path", p)
	}
	return p[1:], nil
}

// parents writes the directories above name that are not in the archive yet.
func (c *cpioWriter) parents(name string) {
	dir := path.Dir(name)
	if dir == "." || c.seen[dir] {
		return
	}
	c.parents(dir)
	c.seen[dir] = true
	c.header(dir, cpioDir|0o755, 0)
}

// Dir adds a directory.
func (c *cpioWriter) Dir(guest string, perm fs.FileMode) {
	name, err := cleanGuestPath(guest)
	if err != nil {
		c.fail(err)
		return
	}
	c.parents(name)
	if c.seen[name] {
		return
	}
	c.seen[name] = true
	c.header(name, cpioDir|uint32(perm&0o7777), 0)
}

// CharDev adds a character device file.
func (c *cpioWriter) CharDev(guest string, perm fs.FileMode, major, minor uint32) {
	name, err := cleanGuestPath(guest)
	if err != nil {
		c.fail(err)
		return
	}
	c.parents(name)
	c.seen[name] = true
	c.headerDev(name, cpioCharDev|uint32(perm&0o7777), 0, major, minor)
}

// Symlink adds a symbolic link to target.
func (c *cpioWriter) Symlink(guest, target string) {
	name, err := cleanGuestPath(guest)
	if err != nil {
		c.fail(err)
		return
	}
	if c.seen[name] {
		c.fail(fmt.Errorf("cpio: %s added twice", guest))
		return
	}
	c.parents(name)
	c.seen[name] = true
	c.header(name, cpioSymlink|0o777, int64(len(target)))
	c.write([]byte(target))
	c.pad(int64(len(target)))
}

// Bytes adds a regular file holding data.
func (c *cpioWriter) Bytes(guest string, perm fs.FileMode, data []byte) {
	c.File(guest, perm, int64(len(data)), bytes.NewReader(data))
}

// File adds a regular file of size bytes read from r.
func (c *cpioWriter) File(guest string, perm fs.FileMode, size int64, r io.Reader) {
	name, err := cleanGuestPath(guest)
	if err != nil {
		c.fail(err)
		return
	}
	if c.seen[name] {
		c.fail(fmt.Errorf("cpio: %s added twice", guest))
		return
	}
	c.parents(name)
	c.seen[name] = true
	c.header(name, cpioRegular|uint32(perm&0o7777), size)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, io.LimitReader(r, size))
	if err == nil && n != size {
		err = fmt.Errorf("cpio: %s: read %d of %d bytes", guest, n, size)
	}
	if err != nil {
		c.fail(err)
		return
	}
	c.pad(size)
}

// HostFile adds the host's file src (following symlinks) as guest, with its
// permissions.
func (c *cpioWriter) HostFile(guest, src string) {
	if c.err != nil {
		return
	}
	f, err := os.Open(src)
	if err != nil {
		c.fail(err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		c.fail(err)
		return
	}
	if !st.Mode().IsRegular() {
		c.fail(fmt.Errorf("cpio: %s: not a regular file", src))
		return
	}
	c.File(guest, st.Mode().Perm(), st.Size(), f)
}

func (c *cpioWriter) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// Close writes the trailer and flushes; it returns the first error of any
// call.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0)
	if c.err != nil {
		return c.err
	}
	return c.w.Flush()
}
