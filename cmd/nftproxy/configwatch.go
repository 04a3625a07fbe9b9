package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// errConfigChanged ends run when the --config file's content changes.
var errConfigChanged = errors.New("content of the configuration file changed on disk")

// configWatchMask is what may replace the file's content: a writer
// closing it, or an entry renamed into the directory (an editor's atomic
// save, or the swap of a ConfigMap volume's "..data" symlink). A write in
// progress is not looked at, so that rewriting the same content (or
// touching the file) does not read a truncated file as a change. (Another
// file of the directory closed in the middle of such a write would: the
// restart then reads the finished file.)
const configWatchMask = unix.IN_CLOSE_WRITE | unix.IN_MOVED_TO

// configWatcher makes nftproxy exit when its --config file changes, as
// upstream kube-proxy does, so that the pod restarts with the new
// configuration (kubeadm's ConfigMap is edited in place). It watches the
// directories of the file and of the file its symlinks lead to, and on
// each event compares the content with what was parsed.
type configWatcher struct {
	path    string
	content []byte
	// checked, when set (tests), is told the outcome of each comparison.
	checked func(changed bool)
}

// run returns errConfigChanged when the content changes, nil when ctx is
// done, or the error that stopped the watch.
func (w *configWatcher) run(ctx context.Context) error {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watch --config %s: inotify: %w", w.path, err)
	}
	// Non-blocking, so that the runtime poller serves Read and Close
	// interrupts it.
	events := os.NewFile(uintptr(fd), "inotify")
	defer events.Close()
	for _, dir := range w.dirs() {
		if _, err := unix.InotifyAddWatch(fd, dir, configWatchMask); err != nil {
			return fmt.Errorf("watch --config %s: directory %s: %w", w.path, dir, err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = events.Close() })
	defer stop()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	// A change between parsing and the watch is caught by a first look.
	for {
		if w.changed() {
			klog.InfoS("Configuration file changed on disk; exiting so that nftproxy restarts with it", "file", w.path)
			return errConfigChanged
		}
		if _, err := events.Read(buf); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch --config %s: %w", w.path, err)
		}
	}
}

// dirs returns the file's directory and that of its symlinks' target.
func (w *configWatcher) dirs() []string {
	dirs := []string{filepath.Dir(w.path)}
	if target, err := filepath.EvalSymlinks(w.path); err == nil && filepath.Dir(target) != dirs[0] {
		dirs = append(dirs, filepath.Dir(target))
	}
	return dirs
}

// changed compares the file's content with the parsed one. A file that
// cannot be read (gone in the middle of a replacement) is not a change
// yet: the replacement's own event follows.
func (w *configWatcher) changed() bool {
	data, err := os.ReadFile(w.path)
	changed := err == nil && !bytes.Equal(data, w.content)
	if err != nil {
		klog.InfoS("Cannot read the configuration file; watching on", "file", w.path, "err", err)
	}
	if w.checked != nil {
		w.checked(changed)
	}
	return changed
}
