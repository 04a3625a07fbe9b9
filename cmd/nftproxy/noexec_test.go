package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// execImporters are the only packages linked into nftproxy that may import
// os/exec, and why they never run anything:
//   - client-go's exec credential plugin: restConfig refuses a kubeconfig
//     that asks for one (TestExecCredentialPluginRefused).
//   - gnostic's compiler, linked through client-go's OpenAPI support: it
//     runs plugins only for OpenAPI compiler extensions, which nftproxy
//     never asks for.
var execImporters = []string{
	"k8s.io/client-go/plugin/pkg/client/auth/exec",
	"github.com/google/gnostic-models/compiler",
}

// TestNoProgramExecuted: no package of nftproxy's binary imports os/exec
// but those above, and nftproxy's own code starts no process by other means
// (os.StartProcess, syscall.Exec/ForkExec). A new dependency that execs
// fails here.
func TestNoProgramExecuted(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var importers []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && slices.Contains(f[1:], "os/exec") {
			importers = append(importers, f[0])
		}
	}
	for _, p := range importers {
		if !slices.Contains(execImporters, p) {
			t.Errorf("%s imports os/exec and is linked into nftproxy", p)
		}
	}
	if len(importers) == 0 {
		t.Fatal("no importer of os/exec found: the listing is broken")
	}

	spawn := regexp.MustCompile(`\b(os\.StartProcess|syscall\.(Exec|ForkExec|StartProcess)|unix\.Exec)\(`)
	root := filepath.Join("..", "..")
	for _, dir := range []string{"cmd", "conntrack", "metrics", "nft", "proxier"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if spawn.Match(src) {
				t.Errorf("%s starts a process", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestExecCredentialPluginRefused: a kubeconfig that asks for an exec
// credential plugin is refused, naming the plugin.
func TestExecCredentialPluginRefused(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	const config = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: aws-iam-authenticator, interactiveMode: Never}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(kc, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := restConfig(clientOptions{Kubeconfig: kc})
	if err == nil || !strings.Contains(err.Error(), "aws-iam-authenticator") {
		t.Fatalf("restConfig with an exec plugin: %v, want a refusal naming the plugin", err)
	}
}
