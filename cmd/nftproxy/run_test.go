package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftfake"
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

// TestRunInitOnly: --init-only applies the conntrack sysctls, as upstream
// does in nftables mode, then exits without opening netlink for nftables
// or contacting the API server (no kubeconfig: in-cluster config would
// fail here).
func TestRunInitOnly(t *testing.T) {
	proc := fakeSysctls(t, map[string]string{
		"nf_conntrack_max": "1000", "nf_conntrack_tcp_timeout_established": "432000", "nf_conntrack_udp_timeout": "30",
	})
	oldOpen := openNFTBackends
	openNFTBackends = func(proxier.Config, bool) (map[nft.Family]nft.Backend, func(), error) {
		t.Error("--init-only opened the nftables backends")
		return nil, nil, errors.New("not in this test")
	}
	defer func() { openNFTBackends = oldOpen }()
	o, err := parseOptions([]string{"--init-only", "--ip-families=ipv4", "--conntrack-max-per-core=1000",
		"--conntrack-min=0", "--conntrack-tcp-timeout-established=2h", "--conntrack-udp-timeout=45s"}, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), o); err != nil {
		t.Fatalf("run --init-only = %v", err)
	}
	for name, want := range map[string]string{
		"nf_conntrack_max": "4000", "nf_conntrack_tcp_timeout_established": "7200", "nf_conntrack_udp_timeout": "45",
	} {
		if got := proc.read(t, name); got != want {
			t.Errorf("%s = %s, want %s", name, got, want)
		}
	}
}

// procSys is a fake /proc/sys for the conntrack sysctls.
type procSys struct{ dir string }

// fakeSysctls points sysctlEnv at a temporary /proc/sys holding values
// (4 CPUs) for the test's duration.
func fakeSysctls(t *testing.T, values map[string]string) procSys {
	t.Helper()
	root := t.TempDir()
	p := procSys{dir: filepath.Join(root, "proc", "sys", "net", "netfilter")}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range values {
		if err := os.WriteFile(filepath.Join(p.dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old := sysctlEnv
	sysctlEnv = func() conntrack.SysctlEnv {
		return conntrack.SysctlEnv{ProcSys: filepath.Join(root, "proc", "sys"), SysModule: filepath.Join(root, "sys", "module"), NumCPU: 4}
	}
	t.Cleanup(func() { sysctlEnv = old })
	return p
}

func (p procSys) read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestRunAllStopsOnConfigChange: the --config watch ending with
// errConfigChanged ends runAll (and so run) with that error, while the
// other tasks are stopped.
func TestRunAllStopsOnConfigChange(t *testing.T) {
	stopped := make(chan struct{})
	blocking := func(ctx context.Context) error {
		<-ctx.Done()
		close(stopped)
		return nil
	}
	changed := func(context.Context) error { return errConfigChanged }
	if err := runAll(context.Background(), blocking, changed); !errors.Is(err, errConfigChanged) {
		t.Errorf("runAll = %v, want errConfigChanged", err)
	}
	<-stopped
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := runAll(ctx, func(context.Context) error { return errors.New("after SIGTERM") }); err != nil {
		t.Errorf("runAll after cancel = %v, want nil", err)
	}
}

func TestApplyOOMScoreAdj(t *testing.T) {
	old := oomScoreAdjPath
	oomScoreAdjPath = filepath.Join(t.TempDir(), "oom_score_adj")
	defer func() { oomScoreAdjPath = old }()
	if err := os.WriteFile(oomScoreAdjPath, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	applyOOMScoreAdj(-999)
	if b, _ := os.ReadFile(oomScoreAdjPath); string(b) != "-999" {
		t.Errorf("oom_score_adj = %q, want -999", b)
	}
	oomScoreAdjPath = filepath.Join(oomScoreAdjPath, "not-a-dir")
	applyOOMScoreAdj(-999) // logged, not fatal
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
	if l, p, ok := gcPercent(env("")); !ok || l != listingGCPercent || p != defaultGCPercent {
		t.Errorf("GOGC unset: %d then %d, %v; want %d then %d", l, p, ok, listingGCPercent, defaultGCPercent)
	}
	for _, v := range []string{"100", "off"} {
		if _, _, ok := gcPercent(env(v)); ok {
			t.Errorf("GOGC=%s: overridden", v)
		}
	}
}

// noFib is a backend whose kernel has no fib expression for IPv6.
type noFib struct{ *nftfake.Fake }

func (noFib) MissingExpressions(_ context.Context, f nft.Family) ([]string, error) {
	if f == nft.IPv6 {
		return []string{"the fib expression (Linux 4.10)"}, nil
	}
	return nil, nil
}

// TestRunRefusesAKernelWithoutAnExpression: on a kernel whose nf_tables
// lacks an expression type nftproxy's rules use, the proxy refuses to
// start, naming the expression and the family, before it contacts the API
// server; --cleanup still works there.
func TestRunRefusesAKernelWithoutAnExpression(t *testing.T) {
	fk := nftfake.New()
	oldOpen := openNFTBackends
	openNFTBackends = func(cfg proxier.Config, _ bool) (map[nft.Family]nft.Backend, func(), error) {
		return map[nft.Family]nft.Backend{nft.IPv4: noFib{fk}, nft.IPv6: noFib{fk}}, func() {}, nil
	}
	defer func() { openNFTBackends = oldOpen }()
	o, err := parseOptions([]string{"--hostname-override=n1", "--kubeconfig=" + filepath.Join(t.TempDir(), "none")}, testEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	o.Proxier.IPv6 = true // whatever this machine's kernel says
	err = run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "IPv6 rules: nf_tables lacks the fib expression (Linux 4.10)") ||
		strings.Contains(err.Error(), "IPv4") {
		t.Fatalf("run = %v, want a refusal naming IPv6's missing fib expression", err)
	}
	o.Cleanup = true
	if err := run(context.Background(), o); err != nil {
		t.Fatalf("run --cleanup = %v", err)
	}
}
