package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"
)

// debTar is a package's data archive as dpkg-deb --fsys-tarfile writes it.
func debTar(t *testing.T, entries ...tar.Header) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		data := []byte(nil)
		if h.Typeflag == tar.TypeReg {
			data = []byte("content of " + h.Name)
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		tw.Write(data)
	}
	tw.Close()
	return &buf
}

func dir(name string) tar.Header { return tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755} }
func file(name string, mode int64) tar.Header {
	return tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uname: "root", Gname: "root"}
}

// layerEntries reads a layer WriteLayer wrote: "TYPE PATH MODE [-> LINK]" per entry.
func layerEntries(t *testing.T, layer []byte) []string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header carries name %q, time %v", zr.Name, zr.ModTime)
	}
	var out []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uname != "" || h.Gname != "" || !h.ModTime.Equal(time.Unix(946684800, 0)) {
			t.Errorf("%s: owner names %q %q, mtime %v", h.Name, h.Uname, h.Gname, h.ModTime)
		}
		s := fmt.Sprintf("%c %s %o", h.Typeflag, h.Name, h.Mode)
		if h.Linkname != "" {
			s += " -> " + h.Linkname
		}
		out = append(out, s)
	}
}

func TestTreeFromPackages(t *testing.T) {
	tree := NewTree()
	// libc6: files under /lib and /lib64 (moved under /usr), docs (dropped).
	err := tree.AddTar(debTar(t,
		dir("./"), dir("./lib/"), dir("./lib/x86_64-linux-gnu/"),
		file("./lib/x86_64-linux-gnu/libc.so.6", 0o755),
		dir("./lib64/"),
		tar.Header{Typeflag: tar.TypeSymlink, Name: "./lib64/ld-linux-x86-64.so.2", Linkname: "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		dir("./usr/"), dir("./usr/share/"), dir("./usr/share/doc/"), dir("./usr/share/doc/libc6/"),
		file("./usr/share/doc/libc6/copyright", 0o644),
	))
	if err != nil {
		t.Fatal(err)
	}
	// dash: /bin/sh; a setuid file owned by another group; a hard link; a
	// package repeating a directory with another mode; ../ stays inside.
	err = tree.AddTar(debTar(t,
		dir("./bin/"), file("./bin/dash", 0o755),
		tar.Header{Typeflag: tar.TypeSymlink, Name: "./bin/sh", Linkname: "dash"},
		tar.Header{Typeflag: tar.TypeReg, Name: "./usr/bin/wall", Mode: 0o2755, Gid: 5},
		tar.Header{Typeflag: tar.TypeLink, Name: "./usr/bin/a-dash", Linkname: "./bin/dash"},
		tar.Header{Typeflag: tar.TypeLink, Name: "./usr/bin/gone", Linkname: "./usr/share/doc/libc6/copyright"},
		tar.Header{Typeflag: tar.TypeDir, Name: "./usr/", Mode: 0o700},
		file("../../etc/escape", 0o644),
	))
	if err != nil {
		t.Fatal(err)
	}
	tree.AddFile("/etc/passwd", 0o644, []byte("root:x:0:0::/root:/bin/sh\n"))
	tree.AddDir("/tmp", 0o1777)
	tree.AddSymlink("/usr/bin/nc", "nc.openbsd")
	tree.AddSymlink("/bin/awk", "mawk")

	if !tree.Has("/bin/dash") || !tree.Has("usr/bin/dash") || tree.Has("usr/share/doc/libc6/copyright") {
		t.Errorf("Has: usrmerge or dropped directories not applied: %q", tree.Paths())
	}
	if data, ok := tree.File("/usr/bin/a-dash"); !ok || string(data) != "content of ./bin/dash" {
		t.Errorf("hard link: %q %v", data, ok)
	}
	var buf bytes.Buffer
	if err := tree.WriteLayer(&buf, time.Unix(946684800, 0)); err != nil {
		t.Fatal(err)
	}
	got := layerEntries(t, buf.Bytes())
	want := []string{
		"2 bin 777 -> usr/bin",
		"5 etc/ 755",
		"0 etc/passwd 644",
		"2 lib 777 -> usr/lib",
		"2 lib32 777 -> usr/lib32",
		"2 lib64 777 -> usr/lib64",
		"2 libx32 777 -> usr/libx32",
		"2 sbin 777 -> usr/sbin",
		"5 tmp/ 1777",
		"5 usr/ 755",
		"5 usr/bin/ 755",
		"0 usr/bin/a-dash 755",
		"2 usr/bin/awk 777 -> mawk",
		"0 usr/bin/dash 755",
		"2 usr/bin/nc 777 -> nc.openbsd",
		"2 usr/bin/sh 777 -> dash",
		"0 usr/bin/wall 2755",
		"5 usr/lib/ 755",
		"5 usr/lib/x86_64-linux-gnu/ 755",
		"0 usr/lib/x86_64-linux-gnu/libc.so.6 755",
		"5 usr/lib64/ 755",
		"2 usr/lib64/ld-linux-x86-64.so.2 777 -> /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
		"5 usr/share/ 755",
	}
	if !slices.Equal(got, want) {
		t.Errorf("layer:\n%s\nwant:\n%s", join(got), join(want))
	}
	var again bytes.Buffer
	tree.WriteLayer(&again, time.Unix(946684800, 0))
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("two layers of the same tree differ")
	}
}

func TestTreeRefusesDevices(t *testing.T) {
	err := NewTree().AddTar(debTar(t, tar.Header{Typeflag: tar.TypeChar, Name: "./dev/null", Mode: 0o666}))
	if err == nil {
		t.Error("a character device was accepted")
	}
}

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"./":                   "",
		"./bin":                "usr/bin",
		"./bin/ls":             "usr/bin/ls",
		"/lib64/ld.so":         "usr/lib64/ld.so",
		"./binary/x":           "binary/x",
		"./usr/lib/x":          "usr/lib/x",
		"etc//passwd":          "etc/passwd",
		"../etc/passwd":        "",
		"./a/../../etc/shadow": "",
	} {
		if got := clean(in); got != want {
			t.Errorf("clean(%q) = %q, want %q", in, got, want)
		}
	}
}

func join(lines []string) string {
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}
