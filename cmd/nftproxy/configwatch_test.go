package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// watchTimeout bounds how long a test waits for an inotify event that
// should come at once; it never paces the test.
const watchTimeout = 10 * time.Second

// startWatcher runs a configWatcher on path (holding content) and returns
// the comparisons it makes and its result.
func startWatcher(t *testing.T, path, content string) (checks <-chan bool, done <-chan error) {
	t.Helper()
	checked := make(chan bool, 16)
	result := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w := &configWatcher{path: path, content: []byte(content), checked: func(c bool) { checked <- c }}
	go func() { result <- w.run(ctx) }()
	expectCheck(t, checked, false) // the first look, once the watch is set
	return checked, result
}

func expectCheck(t *testing.T, checks <-chan bool, want bool) {
	t.Helper()
	select {
	case got := <-checks:
		if got != want {
			t.Fatalf("comparison said changed=%v, want %v", got, want)
		}
	case <-time.After(watchTimeout):
		t.Fatal("no comparison after the file was written")
	}
}

func expectExit(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, errConfigChanged) {
			t.Fatalf("watcher = %v, want errConfigChanged", err)
		}
	case <-time.After(watchTimeout):
		t.Fatal("watcher did not stop after the content changed")
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestConfigWatcherWrite: rewriting the file in place with the same
// content (or touching it) is no change; other content ends the watch.
func TestConfigWatcherWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	writeFile(t, path, "mode: nftables\n")
	checks, done := startWatcher(t, path, "mode: nftables\n")
	writeFile(t, path, "mode: nftables\n")
	expectCheck(t, checks, false)
	writeFile(t, filepath.Join(filepath.Dir(path), "other.conf"), "x") // another file of the directory
	expectCheck(t, checks, false)
	writeFile(t, path, "mode: nftables\nclusterCIDR: 10.0.0.0/8\n")
	expectCheck(t, checks, true)
	expectExit(t, done)
}

// TestConfigWatcherConfigMapSwap: a ConfigMap volume is updated as kubelet
// does it: the new files go to a new timestamped directory, a "..data_tmp"
// symlink to it is renamed over "..data", and the old directory removed;
// the file itself is a symlink through "..data".
func TestConfigWatcherConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, name, "config.conf"), content)
	}
	swap := func(name string) {
		t.Helper()
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_11_24_01", "mode: nftables\n")
	swap("..2026_11_24_01")
	path := filepath.Join(dir, "config.conf")
	if err := os.Symlink(filepath.Join("..data", "config.conf"), path); err != nil {
		t.Fatal(err)
	}
	checks, done := startWatcher(t, path, "mode: nftables\n")

	version("..2026_11_24_02", "mode: nftables\n") // an update of another key: same content
	swap("..2026_11_24_02")
	expectCheck(t, checks, false)
	if err := os.RemoveAll(filepath.Join(dir, "..2026_11_24_01")); err != nil {
		t.Fatal(err)
	}

	version("..2026_11_24_03", "mode: nftables\nclusterCIDR: 10.0.0.0/8\n")
	swap("..2026_11_24_03")
	for changed := false; !changed; {
		select {
		case changed = <-checks: // the old version's directory going away may come first
		case <-time.After(watchTimeout):
			t.Fatal("no comparison after the swap")
		}
	}
	expectExit(t, done)
}

// TestConfigWatcherSymlinkElsewhere: when --config is a symlink to a file
// in another directory, a write of that file is seen too.
func TestConfigWatcherSymlinkElsewhere(t *testing.T) {
	target := filepath.Join(t.TempDir(), "kube-proxy.conf")
	writeFile(t, target, "a")
	path := filepath.Join(t.TempDir(), "config.conf")
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
	checks, done := startWatcher(t, path, "a")
	writeFile(t, target, "b")
	expectCheck(t, checks, true)
	expectExit(t, done)
}

// TestConfigWatcherStops: cancelling the context ends the watch cleanly.
func TestConfigWatcherStops(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	writeFile(t, path, "a")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&configWatcher{path: path, content: []byte("a")}).run(ctx) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("watcher after cancel = %v, want nil", err)
		}
	case <-time.After(watchTimeout):
		t.Fatal("watcher did not stop")
	}
}

// TestConfigWatcherChangedBeforeWatch: a change between parsing and the
// start of the watch is seen at once.
func TestConfigWatcherChangedBeforeWatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.conf")
	writeFile(t, path, "new")
	ctx, cancel := context.WithTimeout(context.Background(), watchTimeout)
	defer cancel()
	err := (&configWatcher{path: path, content: []byte("parsed")}).run(ctx)
	if !errors.Is(err, errConfigChanged) {
		t.Errorf("watcher = %v, want errConfigChanged", err)
	}
}
