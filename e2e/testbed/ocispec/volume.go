package ocispec

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// WriteVolume lays files (name → content) out in dir the way kubelet writes configMap,
// secret and projected volumes: the files in a hidden directory, a "..data" symlink to
// it and, for each name, a symlink "name" → "..data/name". Programs that read a
// mounted config file thus see a symlink, as in a cluster, and kubelet's updates swap
// ..data atomically. Names must be plain file names.
func WriteVolume(dir string, files map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := os.MkdirTemp(dir, "..")
	if err != nil {
		return err
	}
	if err := os.Chmod(data, 0o755); err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if !filepath.IsLocal(name) || filepath.Base(name) != name || name[0] == '.' {
			return fmt.Errorf("volume file name %q: a plain name is needed", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(data, name), files[name], 0o644); err != nil {
			return err
		}
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for _, name := range names {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}
