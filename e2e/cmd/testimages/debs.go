package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Package is one Debian package of an image's closure.
type Package struct {
	Name, Version, Arch string
}

// File is the name apt-get download gives the package's .deb (an epoch's
// colon is written %3a).
func (p Package) File() string {
	return p.Name + "_" + strings.ReplaceAll(p.Version, ":", "%3a") + "_" + p.Arch + ".deb"
}

func (p Package) String() string { return p.Name + "=" + p.Version }

// instLine matches what `apt-get -s install` prints per package it would
// install: "Inst bash (5.2.15-2+b13 Debian:12.13/stable [amd64])", with
// "Inst pkg [old] (...)" when it would upgrade.
var instLine = regexp.MustCompile(`^Inst (\S+) (?:\[\S+\] )?\((\S+) .*\[(\S+)\]\)`)

// parseSimulation reads `apt-get -s install` output: the packages it would
// install, sorted by name.
func parseSimulation(out []byte) ([]Package, error) {
	var pkgs []Package
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "Inst ") {
			continue
		}
		m := instLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("apt-get -s: cannot read %q", line)
		}
		pkgs = append(pkgs, Package{Name: m[1], Version: m[2], Arch: m[3]})
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("apt-get -s installs nothing:\n%s", out)
	}
	slices.SortFunc(pkgs, func(a, b Package) int { return strings.Compare(a.Name, b.Name) })
	return pkgs, nil
}

// Resolve asks apt which packages a root file system holding names needs:
// their Depends and Pre-Depends, recursively, as apt would install them on
// a machine where nothing is installed yet (an empty dpkg status), without
// Recommends. It changes nothing on the machine.
func Resolve(names []string) ([]Package, error) {
	empty, err := os.CreateTemp("", "testimages-dpkg-status-")
	if err != nil {
		return nil, err
	}
	empty.Close()
	defer os.Remove(empty.Name())
	args := append([]string{"-s", "-o", "Dir::State::status=" + empty.Name(),
		"-o", "APT::Install-Recommends=false", "-o", "APT::Install-Suggests=false", "install"}, names...)
	out, err := exec.Command("apt-get", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("apt-get %s: %w (run apt-get update first?)\n%s", strings.Join(args, " "), err, out)
	}
	return parseSimulation(out)
}

// Download fetches the .debs of pkgs missing from dir with apt-get download
// (the versions Resolve named), and returns their paths, in pkgs' order.
func Download(dir string, pkgs []Package) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var missing []string
	paths := make([]string, len(pkgs))
	for i, p := range pkgs {
		paths[i] = filepath.Join(dir, p.File())
		if _, err := os.Stat(paths[i]); err != nil {
			missing = append(missing, p.Name+":"+p.Arch+"="+p.Version)
		}
	}
	if len(missing) > 0 {
		// Into a temporary directory first: a .deb in dir is always whole.
		tmp, err := os.MkdirTemp(dir, "download-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		cmd := exec.Command("apt-get", append([]string{"download", "-q"}, missing...)...)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("apt-get download (%d packages): %w\n%s", len(missing), err, out)
		}
		got, err := os.ReadDir(tmp)
		if err != nil {
			return nil, err
		}
		for _, f := range got {
			if err := os.Rename(filepath.Join(tmp, f.Name()), filepath.Join(dir, f.Name())); err != nil {
				return nil, err
			}
		}
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("after apt-get download: %w", err)
		}
	}
	return paths, nil
}

// AddDebs adds the data of each .deb to tree (`dpkg-deb --fsys-tarfile`: the
// files dpkg would unpack, with no maintainer script run).
func AddDebs(tree *Tree, debs []string) error {
	for _, deb := range debs {
		cmd := exec.Command("dpkg-deb", "--fsys-tarfile", deb)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		addErr := tree.AddTar(out)
		if err := cmd.Wait(); err != nil || addErr != nil {
			return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %v %v %s", filepath.Base(deb), addErr, err, stderr.Bytes())
		}
	}
	return nil
}

// closureKey identifies a layer made of pkgs (and the layer format, so that
// a change to Tree or to the files added to it makes a new one).
func closureKey(format string, pkgs []Package) string {
	h := sha256.New()
	fmt.Fprintln(h, format)
	for _, p := range pkgs {
		fmt.Fprintln(h, p.Name, p.Version, p.Arch)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}
