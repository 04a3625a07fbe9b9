package nodes

import (
	"bytes"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// cpioEntry is an entry read back by readCPIO.
type cpioEntry struct {
	name         string
	mode         uint32
	data         string
	major, minor uint32
}

// readCPIO parses a newc archive as the kernel does, checking the
// alignment of every header and the trailer.
func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var entries []cpioEntry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("header at %d: field %d: %v", off, i, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off%4 != 0 {
			t.Fatalf("header at %d: not aligned", off)
		}
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("header at %d: magic %q", off, b[off:off+6])
		}
		mode, size, major, minor, namesize := field(1), int(field(6)), field(9), field(10), int(field(11))
		name := string(b[off+110 : off+110+namesize-1])
		if b[off+110+namesize-1] != 0 {
			t.Fatalf("%s: name not NUL-terminated", name)
		}
		dataOff := align(off + 110 + namesize)
		if name == "TRAILER!!!" {
			if rest := b[dataOff:]; len(rest) != 0 {
				t.Fatalf("%d bytes after the trailer", len(rest))
			}
			return entries
		}
		entries = append(entries, cpioEntry{name, mode, string(b[dataOff : dataOff+size]), major, minor})
		off = align(dataOff + size)
	}
}

func TestCPIOWriter(t *testing.T) {
	var buf bytes.Buffer
	w := newCPIOWriter(&buf)
	w.Dir("/tmp", 0o1777)
	w.Bytes("/usr/sbin/tool", 0o755, []byte("abcde"))
	w.Symlink("/sbin", "usr/sbin")
	w.CharDev("/dev/console", 0o600, 5, 1)
	w.Bytes("/usr/lib/empty", 0o644, nil)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got := readCPIO(t, buf.Bytes())
	want := []cpioEntry{
		{"tmp", cpioDir | 0o1777, "", 0, 0},
		{"usr", cpioDir | 0o755, "", 0, 0},
		{"usr/sbin", cpioDir | 0o755, "", 0, 0},
		{"usr/sbin/tool", cpioRegular | 0o755, "abcde", 0, 0},
		{"sbin", cpioSymlink | 0o777, "usr/sbin", 0, 0},
		{"dev", cpioDir | 0o755, "", 0, 0},
		{"dev/console", cpioCharDev | 0o600, "", 5, 1},
		{"usr/lib", cpioDir | 0o755, "", 0, 0},
		{"usr/lib/empty", cpioRegular | 0o644, "", 0, 0},
	}
	if !slices.Equal(got, want) {
		t.Errorf("archive:\n%v\nwant\n%v", got, want)
	}
}

func TestCPIOWriterRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		write func(w *cpioWriter)
	}{
		{"relative path", func(w *cpioWriter) { w.Bytes("etc/x", 0o644, nil) }},
		{"unclean path", func(w *cpioWriter) { w.Bytes("/etc/../x", 0o644, nil) }},
		{"twice", func(w *cpioWriter) { w.Bytes("/x", 0o644, nil); w.Symlink("/x", "y") }},
		{"missing host file", func(w *cpioWriter) { w.HostFile("/x", filepath.Join(t.TempDir(), "none")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newCPIOWriter(&bytes.Buffer{})
			tc.write(w)
			if err := w.Close(); err == nil {
				t.Error("no error")
			}
		})
	}
}
