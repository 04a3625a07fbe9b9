package nodes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// debianKeyring verifies the archives' Release files (debian-archive-keyring,
// on every Debian machine).
const debianKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// listsMaxAge is how old a suite's package lists may get before Prepare
// refreshes them: stable suites change a few times a month, sid daily.
const listsMaxAge = 24 * time.Hour

// privateApt is an apt configuration of its own under dir (sources.list,
// lists, an empty status file, the package cache), so that resolving and
// downloading another release's packages never reads or writes the
// machine's apt state. Every apt-get and apt-cache it runs gets
// APT_CONFIG=dir/apt.conf.
type privateApt struct {
	dir string
}

// newPrivateApt writes the configuration for r's archives under dir.
func newPrivateApt(dir string, r Release) (*privateApt, error) {
	for _, d := range []string{"etc/apt.conf.d", "etc/preferences.d", "etc/sources.list.d",
		"etc/trusted.gpg.d", "lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	var sources strings.Builder
	for _, a := range r.Archives {
		fmt.Fprintf(&sources, "deb [signed-by=%s] %s %s main\n", debianKeyring, a.URI, a.Suite)
	}
	// An empty status file: apt resolves every dependency as if nothing
	// were installed, which is what an initramfs starts from.
	conf := fmt.Sprintf(`Dir::State "%[1]s";
Dir::State::Lists "%[1]s/lists";
Dir::State::status "%[1]s/status";
Dir::Cache "%[1]s/cache";
Dir::Etc "%[1]s/etc";
Dir::Etc::SourceList "%[1]s/etc/sources.list";
Dir::Etc::SourceParts "%[1]s/etc/sources.list.d";
Dir::Etc::Parts "%[1]s/etc/apt.conf.d";
Dir::Etc::Preferences "%[1]s/etc/preferences";
Dir::Etc::PreferencesParts "%[1]s/etc/preferences.d";
Dir::Etc::Trusted "%[1]s/etc/trusted.gpg";
Dir::Etc::TrustedParts "%[1]s/etc/trusted.gpg.d";
APT::Architecture "%[2]s";
APT::Architectures { "%[2]s"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
APT::Sandbox::User "root";
Acquire::Languages "none";
Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled "false";
// The archive this machine reaches may serve Release files a few weeks
// old (a snapshot): their signatures are still checked.
Acquire::Check-Valid-Until "false";
`, dir, r.arch().Debian)
	files := map[string]string{
		"apt.conf":         conf,
		"etc/sources.list": sources.String(),
	}
	for name, content := range files {
		if err := writeIfChanged(filepath.Join(dir, name), []byte(content)); err != nil {
			return nil, err
		}
	}
	status := filepath.Join(dir, "status")
	if err := os.WriteFile(status, nil, 0o644); err != nil {
		return nil, err
	}
	return &privateApt{dir: dir}, nil
}

// writeIfChanged writes content to path unless it holds it already, so that
// an unchanged sources.list keeps its modification time.
func writeIfChanged(path string, content []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, content) {
		return nil
	}
	return os.WriteFile(path, content, 0o644)
}

// run runs an apt command with the private configuration and returns its
// standard output.
func (a *privateApt) run(ctx context.Context, workDir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = append(os.Environ(), "APT_CONFIG="+filepath.Join(a.dir, "apt.conf"), "LC_ALL=C",
		"DEBIAN_FRONTEND=noninteractive")
	cmd.Dir = workDir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	// apt-get update exits 0 on some failed fetches and says so on stderr.
	if strings.Contains(stderr.String(), "\nE: ") || strings.HasPrefix(stderr.String(), "E: ") {
		return stdout.String(), fmt.Errorf("%s: %s", strings.Join(args, " "), stderr.String())
	}
	return stdout.String(), nil
}

// updated is the stamp apt-get update touches on success.
func (a *privateApt) updatedStamp() string { return filepath.Join(a.dir, "lists", ".updated") }

// update refreshes the package lists when they are older than maxAge (or
// missing, or older than the sources.list). It reports whether it did.
func (a *privateApt) update(ctx context.Context, maxAge time.Duration) (bool, error) {
	stamp, err := os.Stat(a.updatedStamp())
	if err == nil {
		sources, serr := os.Stat(filepath.Join(a.dir, "etc", "sources.list"))
		if serr == nil && time.Since(stamp.ModTime()) < maxAge && stamp.ModTime().After(sources.ModTime()) {
			return false, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	if _, err := a.run(ctx, a.dir, "apt-get", "-q", "update"); err != nil {
		return false, err
	}
	return true, os.WriteFile(a.updatedStamp(), nil, 0o644)
}

// debPackage is one binary package of a resolved installation.
type debPackage struct {
	Name, Version, Arch string
}

// File is the name apt-get download gives the package's file (an epoch's
// colon escaped as %3a).
func (p debPackage) File() string {
	return fmt.Sprintf("%s_%s_%s.deb", p.Name, strings.ReplaceAll(p.Version, ":", "%3a"), p.Arch)
}

// instLine is a line of apt-get -s install: "Inst libc6 (2.36-9+deb12u14
// Debian:12.13/stable, Debian-Security:12/stable-security [amd64])".
var instLine = regexp.MustCompile(`^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) [^\[]*\[([^\]]+)\]\)`)

// resolve asks apt which packages installing pkgs on an empty machine
// installs (their Depends and Pre-Depends, not their Recommends), with the
// versions it picks: the newest of the suite and its updates.
func (a *privateApt) resolve(ctx context.Context, pkgs ...string) ([]debPackage, error) {
	out, err := a.run(ctx, a.dir, append([]string{"apt-get", "-q", "-s", "install", "--no-install-recommends"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	resolved, err := parseSimulation(out)
	if err != nil {
		return nil, fmt.Errorf("apt-get -s install %s: %w", strings.Join(pkgs, " "), err)
	}
	return resolved, nil
}

// parseSimulation reads the packages of apt-get -s install's Inst lines.
func parseSimulation(out string) ([]debPackage, error) {
	var pkgs []debPackage
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "Inst ") {
			continue
		}
		m := instLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unexpected line %q", line)
		}
		pkgs = append(pkgs, debPackage{Name: m[1], Version: m[2], Arch: m[3]})
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("nothing to install in:\n%s", out)
	}
	return pkgs, nil
}

// download fetches the packages missing from dir with apt-get download
// (which checks them against the signed lists) and returns those it
// fetched.
func (a *privateApt) download(ctx context.Context, dir string, pkgs []debPackage) ([]debPackage, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var missing []debPackage
	args := []string{"apt-get", "-q", "download"}
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(dir, p.File())); err == nil {
			continue
		}
		missing = append(missing, p)
		args = append(args, p.Name+"="+p.Version)
	}
	if len(missing) == 0 {
		return nil, nil
	}
	if _, err := a.run(ctx, dir, args...); err != nil {
		return nil, err
	}
	for _, p := range missing {
		if _, err := os.Stat(filepath.Join(dir, p.File())); err != nil {
			return nil, fmt.Errorf("apt-get download %s=%s: %w", p.Name, p.Version, err)
		}
	}
	return missing, nil
}
