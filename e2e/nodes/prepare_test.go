package nodes

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

func TestPickKernel(t *testing.T) {
	bookworm, _ := Lookup("bookworm")
	sid, _ := Lookup("sid")
	pkgs := func(names ...string) []debPackage {
		var ps []debPackage
		for _, n := range names {
			ps = append(ps, debPackage{Name: n, Version: "1", Arch: "amd64"})
		}
		return ps
	}
	for _, tc := range []struct {
		name    string
		r       Release
		pkgs    []debPackage
		abi     string
		kernel  []string
		wantErr bool
	}{
		{"bookworm", bookworm, pkgs("kmod", "linux-image-6.1.0-56-amd64", "initramfs-tools", "linux-image-amd64"),
			"6.1.0-56-amd64", []string{"linux-image-6.1.0-56-amd64"}, false},
		{"sid split", sid, pkgs("linux-base-7.2.13+deb14-amd64", "linux-binary-7.2.13+deb14-amd64", "kmod",
			"linux-modules-7.2.13+deb14-amd64", "linux-image-7.2.13+deb14-amd64", "linux-base-amd64", "linux-image-amd64"),
			"7.2.13+deb14-amd64", []string{"linux-base-7.2.13+deb14-amd64", "linux-binary-7.2.13+deb14-amd64",
				"linux-modules-7.2.13+deb14-amd64", "linux-image-7.2.13+deb14-amd64"}, false},
		{"another series", bookworm, pkgs("linux-image-6.12.117+deb12-amd64"), "", nil, true},
		{"no kernel", bookworm, pkgs("linux-image-amd64", "kmod"), "", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			abi, kernel, err := pickKernel(tc.pkgs, tc.r)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
			var names []string
			for _, p := range kernel {
				names = append(names, p.Name)
			}
			if abi != tc.abi || !slices.Equal(names, tc.kernel) {
				t.Errorf("got %s %v, want %s %v", abi, names, tc.abi, tc.kernel)
			}
		})
	}
}

// TestPrepareReleases prepares every release (NFTPROXY_NODES_SUITES) twice
// and checks the node's initramfs: the second Prepare must download and
// build nothing.
func TestPrepareReleases(t *testing.T) {
	requireNodes(t)
	for _, r := range suitesFromEnv(t) {
		t.Run(r.Name(), func(t *testing.T) {
			n, err := Prepare(t.Context(), r, kubebin.CacheDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s, %d modules\nfirst Prepare: %s", n, n.Modules(), preparation(n.Prepared))
			checkInitramfs(t, n)
			again, err := Prepare(t.Context(), r, kubebin.CacheDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("second Prepare: %s", preparation(again.Prepared))
			if p := again.Prepared; len(p.Downloaded) > 0 || len(p.Built) > 0 {
				t.Errorf("second Prepare downloaded %v and built %v, want nothing", p.Downloaded, p.Built)
			}
		})
	}
}

// checkInitramfs reads a node's archive back and looks for what every job
// needs.
func checkInitramfs(t *testing.T, n *Node) {
	t.Helper()
	if s := n.Release.KernelSeries; s != "" && !strings.HasPrefix(n.Kernel(), s+".") {
		t.Errorf("kernel %s, want the %s series", n.Kernel(), s)
	}
	for _, tool := range []string{"nft", "ip", "conntrack", "iptables", "busybox", "sh"} {
		if n.Tool(tool) == "" {
			t.Errorf("no version for %s", tool)
		}
	}
	b, err := os.ReadFile(n.InitramfsPath())
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]cpioEntry{}
	for _, e := range readCPIO(t, b) {
		entries[e.name] = e
	}
	modules := "usr/lib/modules/" + n.Kernel()
	for name, mode := range map[string]uint32{
		"init":                     cpioRegular,
		"bin":                      cpioSymlink,
		"var/run":                  cpioSymlink,
		"usr/sbin/nft":             cpioRegular,
		"usr/sbin/conntrack":       cpioRegular,
		"usr/sbin/iptables-nft":    cpioSymlink, // to xtables-nft-multi
		"usr/bin/busybox":          cpioRegular,
		"usr/bin/sh":               cpioSymlink, // to dash
		"usr/sbin/modprobe":        cpioSymlink, // to busybox
		"etc/protocols":            cpioRegular,
		"etc/services":             cpioRegular,
		"etc/nodes/modules":        cpioRegular,
		modules + "/modules.dep":   cpioRegular,
		modules + "/modules.alias": cpioRegular,
		n.Release.arch().Loader:    0, // a file or a link, as the release ships it
	} {
		e, ok := entries[name]
		if !ok {
			t.Errorf("no /%s", name)
		} else if mode != 0 && e.mode&0o170000 != mode {
			t.Errorf("/%s: mode %o, want type %o", name, e.mode, mode)
		}
	}
	if e := entries["usr/bin/ip"]; e.mode&0o170000 != cpioRegular || strings.Contains(e.data, "BusyBox") {
		t.Errorf("/usr/bin/ip is not iproute2's")
	}
	list := strings.Split(strings.TrimSpace(entries["etc/nodes/modules"].data), "\n")
	if len(list) != n.Modules() {
		t.Errorf("/etc/nodes/modules lists %d modules, want %d", len(list), n.Modules())
	}
	var nfTables bool
	for _, line := range list {
		name, file, _ := strings.Cut(line, " ")
		if _, ok := entries[strings.TrimPrefix(file, "/")]; !ok {
			t.Errorf("/etc/nodes/modules: %s is not in the archive", file)
		}
		nfTables = nfTables || name == "nf_tables"
	}
	if !nfTables {
		t.Error("nf_tables is not among the modules")
	}
}

func preparation(p Preparation) string {
	return fmt.Sprintf("%v (lists %v%s, download %v of %d packages, unpack %v, initramfs %v; built %v)",
		p.Total.Round(time.Millisecond), p.Update.Round(time.Millisecond), listsNote(p), p.Download.Round(time.Millisecond),
		len(p.Downloaded), p.Unpack.Round(time.Millisecond), p.Initramfs.Round(time.Millisecond), p.Built)
}
