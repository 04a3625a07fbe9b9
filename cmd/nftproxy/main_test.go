package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	logsapi "k8s.io/component-base/logs/api/v1"
)

// syncBuffer is a bytes.Buffer that the logger's goroutines may share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// executeForTest runs execute as main does, with the output captured, and
// resets the process's logging afterwards (component-base applies a logging
// configuration once per process).
func executeForTest(t *testing.T, files map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut syncBuffer
	env := testEnv(files)
	env.stdout, env.stderr = &out, &errOut
	code = execute(context.Background(), args, env)
	if err := logsapi.ResetForTest(nil); err != nil {
		t.Fatal(err)
	}
	return code, out.String(), errOut.String()
}

func TestExecuteVersion(t *testing.T) {
	oldVersion, oldCommit, oldDate := version, gitCommit, buildDate
	defer func() { version, gitCommit, buildDate = oldVersion, oldCommit, oldDate }()
	version, gitCommit, buildDate = "v1.4.2", "0123abcd", "2026-11-24T10:00:00Z"
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--version"}, "nftproxy v1.4.2\n"},
		{[]string{"--version=true"}, "nftproxy v1.4.2\n"},
		// Printed before the configuration is read, as upstream.
		{[]string{"--version", "--config=/nonexistent"}, "nftproxy v1.4.2\n"},
		{[]string{"--version=raw"}, `version.Info{Major:"1", Minor:"4", EmulationMajor:"", EmulationMinor:"", ` +
			`MinCompatibilityMajor:"", MinCompatibilityMinor:"", GitVersion:"v1.4.2", GitCommit:"0123abcd", ` +
			`GitTreeState:"clean", BuildDate:"2026-11-24T10:00:00Z", GoVersion:"` + buildInfo("").GoVersion +
			`", Compiler:"gc", Platform:"` + buildInfo("").Platform + `"}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := executeForTest(t, nil, tt.args...)
			if code != 0 || stdout != tt.want {
				t.Errorf("exit %d, stdout %q (stderr %q); want 0, %q", code, stdout, stderr, tt.want)
			}
		})
	}
}

func TestBuildInfo(t *testing.T) {
	oldVersion, oldCommit := version, gitCommit
	defer func() { version, gitCommit = oldVersion, oldCommit }()
	tests := []struct {
		version, commit, reported         string
		wantVersion, wantMajor, wantMinor string
		wantState                         string
	}{
		{"v1.36.0", "abc", "", "v1.36.0", "1", "36", "clean"},
		{"v0.3.1-4-g0123abc-dirty", "abc", "", "v0.3.1-4-g0123abc-dirty", "0", "3", "dirty"},
		{"0123abc", "abc", "", "0123abc", "", "", "clean"}, // git describe --always without tags
		{"v1.2.3", "abc", "v2.0.0", "v2.0.0", "2", "0", "clean"},
		{"v1.10+", "abc", "", "v1.10+", "1", "10", "clean"},
	}
	for _, tt := range tests {
		version, gitCommit = tt.version, tt.commit
		info := buildInfo(tt.reported)
		if info.GitVersion != tt.wantVersion || info.Major != tt.wantMajor || info.Minor != tt.wantMinor || info.GitTreeState != tt.wantState {
			t.Errorf("version %q reported %q: %+v", tt.version, tt.reported, info)
		}
	}
	version, gitCommit = "", ""
	if info := buildInfo(""); info.GitVersion != unstampedVersion {
		t.Errorf("unstamped: %+v", info)
	}
}

func TestVersionFlag(t *testing.T) {
	o, err := parseOptions([]string{"--version=v9.8.7"}, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if o.Version.print(&bytes.Buffer{}) || o.Version.reported() != "v9.8.7" || o.Config == nil {
		t.Errorf("--version=v9.8.7: prints, or reports %q", o.Version.reported())
	}
	if _, err := parseOptions([]string{"--version=maybe"}, testEnv(nil)); err == nil {
		t.Error("--version=maybe accepted")
	}
}

func TestExecuteExitCodes(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name string
		args []string
		code int
		out  string // in stdout or stderr
	}{
		{"help", []string{"--help"}, 0, "--write-config-to"},
		{"bad flag", []string{"--proxy-mode=ipvs"}, 2, `nftproxy: --proxy-mode / mode "ipvs"`},
		{"write config", []string{"--write-config-to=" + filepath.Join(dir, "c.yaml")}, 0, ""},
		{"write config to a missing directory", []string{"--write-config-to=" + filepath.Join(dir, "no", "c.yaml")}, 1, "--write-config-to"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := executeForTest(t, nil, tt.args...)
			if code != tt.code || !strings.Contains(stdout+stderr, tt.out) {
				t.Errorf("exit %d, output %q %q; want %d with %q", code, stdout, stderr, tt.code, tt.out)
			}
		})
	}
}

// TestExecuteJSONLogging: --logging-format=json (and logging.format: json
// in the file) makes every log line a JSON object.
func TestExecuteJSONLogging(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"config.yaml": "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging: {format: json}\n"}
	for _, args := range [][]string{
		{"--logging-format=json"},
		{"--config=config.yaml"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out := filepath.Join(dir, "written.yaml")
			code, stdout, stderr := executeForTest(t, files, append(args, "--write-config-to="+out)...)
			if code != 0 {
				t.Fatalf("exit %d: %s %s", code, stdout, stderr)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			for _, line := range lines {
				var entry map[string]any
				if err := json.Unmarshal([]byte(line), &entry); err != nil {
					t.Errorf("log line is not JSON: %q: %v", line, err)
				}
			}
			var last map[string]any
			_ = json.Unmarshal([]byte(lines[len(lines)-1]), &last)
			if last["msg"] != "Wrote configuration" || last["file"] != out {
				t.Errorf("last log line %v, want the written configuration", last)
			}
		})
	}
}
