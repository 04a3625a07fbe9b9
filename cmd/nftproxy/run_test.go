package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/proxier"
)

func TestServeForever(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		name     string
		addr     string
		hardFail bool
		cancelIn time.Duration
		wantErr  string
	}{
		{name: "disabled", addr: ""},
		{name: "hard fail on a busy port", addr: busy.Addr().String(), hardFail: true, wantErr: "metrics server: listen on"},
		{name: "retries on a busy port until cancelled", addr: busy.Addr().String(), cancelIn: 50 * time.Millisecond},
		{name: "serves until cancelled", addr: "127.0.0.1:0", cancelIn: 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancelIn > 0 {
				time.AfterFunc(tt.cancelIn, cancel)
			}
			err := serveForever(ctx, "metrics", tt.addr, http.NotFoundHandler(), tt.hardFail, 10*time.Millisecond)
			if tt.wantErr == "" && err != nil {
				t.Errorf("err = %v, want nil", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestSelectFamilies(t *testing.T) {
	present := t.TempDir()
	absent := filepath.Join(present, "missing")
	tests := []struct {
		name           string
		dir            string
		ipv4, ipv6     bool
		explicit       bool
		wantV4, wantV6 bool
		wantErr        bool
	}{
		{name: "IPv6 available", dir: present, ipv4: true, ipv6: true, wantV4: true, wantV6: true},
		{name: "IPv6 disabled, defaulted", dir: absent, ipv4: true, ipv6: true, wantV4: true},
		{name: "IPv6 disabled, asked for", dir: absent, ipv4: true, ipv6: true, explicit: true, wantErr: true},
		{name: "IPv6 only but disabled", dir: absent, ipv6: true, explicit: true, wantErr: true},
		{name: "IPv4 only", dir: absent, ipv4: true, explicit: true, wantV4: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := ipv6SysctlDir
			ipv6SysctlDir = tt.dir
			defer func() { ipv6SysctlDir = old }()
			o := &options{Proxier: proxier.Config{IPv4: tt.ipv4, IPv6: tt.ipv6}, IPFamiliesExplicit: tt.explicit}
			err := selectFamilies(o)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && (o.Proxier.IPv4 != tt.wantV4 || o.Proxier.IPv6 != tt.wantV6) {
				t.Errorf("IPv4, IPv6 = %v, %v; want %v, %v", o.Proxier.IPv4, o.Proxier.IPv6, tt.wantV4, tt.wantV6)
			}
		})
	}
}

const testKubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://10.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: secret}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestRestConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(testKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		master     string
		wantServer string
	}{
		{name: "kubeconfig", wantServer: "https://10.0.0.1:6443"},
		{name: "master overrides", master: "https://192.168.1.1:443", wantServer: "https://192.168.1.1:443"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := clientOptions{Kubeconfig: path, Master: tt.master, ContentType: "application/json", QPS: 7, Burst: 9}
			cfg, err := restConfig(c)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Host != tt.wantServer || cfg.QPS != 7 || cfg.Burst != 9 || cfg.ContentType != "application/json" {
				t.Errorf("rest.Config host %q qps %v burst %d content type %q", cfg.Host, cfg.QPS, cfg.Burst, cfg.ContentType)
			}
		})
	}
	if _, err := restConfig(clientOptions{Kubeconfig: filepath.Join(t.TempDir(), "none")}); err == nil {
		t.Error("missing kubeconfig: no error")
	}
}

func TestSetupLogging(t *testing.T) {
	if err := setupLogging(3, "watch=5"); err != nil {
		t.Fatal(err)
	}
	if err := setupLogging(0, "bad=pattern=x"); err == nil {
		t.Error("bad vmodule accepted")
	}
	_ = setupLogging(0, "")
}

func TestRunInitOnly(t *testing.T) {
	o, err := parseOptions([]string{"--init-only", "--ip-families=ipv4"}, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), o); err != nil {
		t.Errorf("run --init-only = %v", err)
	}
}

func TestGCPercent(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOGC" {
				return v
			}
			return ""
		}
	}
	if p, ok := gcPercent(env("")); !ok || p != defaultGCPercent {
		t.Errorf("GOGC unset: %d, %v; want %d", p, ok, defaultGCPercent)
	}
	for _, v := range []string{"100", "off"} {
		if _, ok := gcPercent(env(v)); ok {
			t.Errorf("GOGC=%s: overridden", v)
		}
	}
}
