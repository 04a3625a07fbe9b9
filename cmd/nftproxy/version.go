package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	apiversion "k8s.io/apimachinery/pkg/version"
)

// Stamped at link time (make build):
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.gitCommit=<sha> -X main.buildDate=<RFC 3339>"
var (
	version   string
	gitCommit string
	buildDate string
)

// unstampedVersion is what a plain "go build" reports.
const unstampedVersion = "v0.0.0-dev"

// buildInfo describes this binary in the shape of upstream's version.Info
// (what kube-proxy --version=raw prints and kubernetes_build_info labels).
// reported, when set (--version=vX.Y.Z), replaces the version. Without
// -ldflags, the commit and tree state come from the VCS stamp the go
// command embeds when it builds inside a git checkout.
func buildInfo(reported string) apiversion.Info {
	info := apiversion.Info{
		GitVersion: version,
		GitCommit:  gitCommit,
		BuildDate:  buildDate,
		GoVersion:  runtime.Version(),
		Compiler:   runtime.Compiler,
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
	}
	if info.GitVersion == "" {
		info.GitVersion = unstampedVersion
	}
	if reported != "" {
		info.GitVersion = reported
	}
	info.GitTreeState = treeState(info.GitVersion, info.GitCommit != "")
	if info.GitCommit == "" {
		info.GitCommit, info.GitTreeState = vcsStamp()
	}
	info.Major, info.Minor = majorMinor(info.GitVersion)
	return info
}

// treeState follows git describe --dirty, which make build stamps.
func treeState(v string, stamped bool) string {
	switch {
	case strings.HasSuffix(v, "-dirty"):
		return "dirty"
	case stamped:
		return "clean"
	}
	return ""
}

// vcsStamp returns the commit and tree state the go command recorded.
func vcsStamp() (commit, state string) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", ""
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			state = map[string]string{"true": "dirty", "false": "clean"}[s.Value]
		}
	}
	return commit, state
}

// majorMinor parses "vMAJOR.MINOR…"; other versions (a bare commit from
// git describe --always) have none.
func majorMinor(v string) (major, minor string) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return "", ""
	}
	if _, err := strconv.Atoi(parts[0]); err != nil {
		return "", ""
	}
	minor = strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if minor == "" {
		return "", ""
	}
	return parts[0], minor
}

// versionFlag is --version as component-base's verflag reads it: true
// prints the version, raw prints the whole version.Info, and "vX.Y.Z…"
// sets the version nftproxy reports (logs, kubernetes_build_info) without
// printing it.
type versionFlag string

const (
	versionFalse versionFlag = "false"
	versionTrue  versionFlag = "true"
	versionRaw   versionFlag = "raw"
)

func (v *versionFlag) String() string {
	if *v == "" {
		return string(versionFalse)
	}
	return string(*v)
}

func (v *versionFlag) Type() string     { return "version" }
func (v *versionFlag) IsBoolFlag() bool { return true }

func (v *versionFlag) Set(s string) error {
	if s == string(versionRaw) || strings.HasPrefix(s, "v") {
		*v = versionFlag(s)
		return nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true, false, raw or a version vX.Y.Z: %w", err)
	}
	*v = versionFalse
	if b {
		*v = versionTrue
	}
	return nil
}

// print writes what --version asks for and reports whether it did.
func (v versionFlag) print(w io.Writer) bool {
	switch v {
	case versionTrue:
		fmt.Fprintf(w, "nftproxy %s\n", buildInfo("").GitVersion)
		return true
	case versionRaw:
		fmt.Fprintf(w, "%#v\n", buildInfo(""))
		return true
	}
	return false
}

// reported is the version --version=vX.Y.Z sets, else "".
func (v versionFlag) reported() string {
	if strings.HasPrefix(string(v), "v") {
		return string(v)
	}
	return ""
}
