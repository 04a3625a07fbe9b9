package scenarios

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/e2e/testbed/ocispec"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// requireCommands skips the test when a program it runs is missing (e2e/tools/deps.sh
// installs them), or fails it with NFTPROXY_E2E=1.
func requireCommands(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			if os.Getenv("NFTPROXY_E2E") == "1" {
				t.Fatalf("needs %s (run e2e/tools/deps.sh): %v", name, err)
			}
			t.Skipf("needs %s (run e2e/tools/deps.sh): %v", name, err)
		}
	}
}

// builtImage is an archive `make image` wrote, with what it was asked to stamp.
type builtImage struct {
	archive, version, revision string
	created                    time.Time
}

// buildImage runs `make image` into dir with a version of the test's own and a fixed
// date, so that the stamps can be checked (the revision is the real commit).
func buildImage(t *testing.T, dir string) builtImage {
	t.Helper()
	root := kubebin.RepoRoot()
	img := builtImage{archive: filepath.Join(dir, "nftproxy-image.tar"), version: "v0.0.0-e2e.image",
		revision: strings.Repeat("0", 40), created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		img.revision = strings.TrimSpace(string(out))
	}
	cmd := exec.Command("make", "-s", "--no-print-directory", "image", "BIN="+filepath.Join(dir, "bin"), "IMAGE_TAR="+img.archive,
		"VERSION="+img.version, "GIT_COMMIT="+img.revision, "BUILD_DATE="+img.created.Format(time.RFC3339))
	cmd.Dir = root
	// `make test` runs this test: its MAKEFLAGS (jobs, variables) are not for this make.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "MAKEFLAGS=") || strings.HasPrefix(kv, "MFLAGS=") || strings.HasPrefix(kv, "MAKELEVEL=")
	})
	started := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Logf("make image (%v):\n%s", time.Since(started).Round(time.Millisecond), strings.TrimSpace(string(out)))
	return img
}

// unpacked is what deploy/image's unpack printed.
type unpacked struct {
	Digest string `json:"digest"`
	Index  string `json:"index"`
	Config struct {
		Architecture string    `json:"architecture"`
		OS           string    `json:"os"`
		Created      time.Time `json:"created"`
		Config       struct {
			Entrypoint, Cmd, Env []string
			WorkingDir, User     string
			Labels               map[string]string
		} `json:"config"`
	} `json:"config"`
	rootfs string
}

func (u *unpacked) image() ocispec.Image {
	c := u.Config.Config
	return ocispec.Image{Entrypoint: c.Entrypoint, Cmd: c.Cmd, Env: c.Env, WorkingDir: c.WorkingDir, User: c.User}
}

// unpackImage unpacks the archive's "latest" image for linux/arch into rootfs with
// deploy/image, which reads it with go-containerregistry (through both the OCI index
// and manifest.json) and applies the layers' whiteouts.
func unpackImage(t *testing.T, img builtImage, rootfs, arch string) *unpacked {
	t.Helper()
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goTool(), "run", ".", "unpack", "--archive", img.archive, "--rootfs", rootfs, "--platform", "linux/"+arch)
	cmd.Dir = filepath.Join(kubebin.RepoRoot(), "deploy", "image")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("deploy/image unpack: %v\n%s", err, stderr.String())
	}
	u := &unpacked{rootfs: rootfs}
	if err := json.Unmarshal(out, u); err != nil {
		t.Fatalf("deploy/image unpack printed %q: %v", out, err)
	}
	return u
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// forbidden are programs the image must not have: no shell, no nftables or iptables
// tools.
var forbidden = []string{"sh", "bash", "dash", "ash", "busybox", "nft", "iptables", "ip6tables",
	"iptables-legacy", "iptables-nft", "xtables-nft-multi", "xtables-legacy-multi"}

// checkRootfs checks that the unpacked image holds the binary at entrypoint (a regular
// executable file) and its parent directories, nothing else.
func checkRootfs(t *testing.T, rootfs, entrypoint string) {
	t.Helper()
	var got []string
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(rootfs, path)
		if rel == "." {
			return nil
		}
		got = append(got, "/"+rel)
		if slices.Contains(forbidden, d.Name()) {
			t.Errorf("the image has %s", "/"+rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for p := entrypoint; p != "/"; p = filepath.Dir(p) {
		want = append([]string{p}, want...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("the image holds %q, want only %q", got, want)
	}
	fi, err := os.Stat(filepath.Join(rootfs, entrypoint))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o755 {
		t.Errorf("%s in the image: %v, %v; want a regular file with mode 0755", entrypoint, fi, err)
	}
}

// checkStamp checks the binary's build: static, CGO_ENABLED=0, -trimpath (from its
// build information), the values of main.version, main.gitCommit and
// main.buildDate, which `make image` sets with -ldflags -X (with -trimpath, Go does
// not record -ldflags; -X silently skips a variable the program does not declare),
// and what --version prints.
func checkStamp(t *testing.T, binary string, img builtImage) {
	t.Helper()
	info, err := buildinfo.ReadFile(binary)
	if err != nil {
		t.Fatalf("%s: %v", binary, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("%s built with CGO_ENABLED=%q -trimpath=%q, want 0 and true", binary, settings["CGO_ENABLED"], settings["-trimpath"])
	}
	f, err := elf.Open(binary)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		t.Errorf("%s is dynamically linked", binary)
	}
	for name, want := range map[string]string{"main.version": img.version, "main.gitCommit": img.revision,
		"main.buildDate": img.created.Format(time.RFC3339)} {
		got, declared, err := stringVar(f, name)
		switch {
		case err != nil:
			t.Errorf("%s: %s: %v", binary, name, err)
		case !declared:
			t.Errorf("%s declares no %s (cmd/nftproxy/version.go): -X stamped nothing", binary, name)
		case got != want:
			t.Errorf("%s: %s = %q, want %q", binary, name, got, want)
		}
	}
	run := []string{binary}
	if m := elfMachine[runtime.GOARCH]; f.Machine != m {
		// Another architecture's: run by qemu-user (e2e/tools/deps.sh installs it).
		emulator := "qemu-" + qemuArch[f.Machine] + "-static"
		if _, err := exec.LookPath(emulator); err != nil {
			t.Errorf("%s is a %v executable and %s is missing: %v", binary, f.Machine, emulator, err)
			return
		}
		run = []string{emulator, binary}
	}
	if out, err := exec.Command(run[0], append(run[1:], "--version")...).Output(); err != nil || !strings.Contains(string(out), img.version) {
		t.Errorf("%s --version: %q, %v; want %s", strings.Join(run, " "), out, err, img.version)
	}
}

// elfMachine is the ELF machine of each architecture the image is built for, and
// qemuArch qemu-user's name of it.
var (
	elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}
	qemuArch   = map[elf.Machine]string{elf.EM_X86_64: "x86_64", elf.EM_AARCH64: "aarch64"}
)

// affinityArchs are the architectures deploy/daemonset.yaml's pods may run on: the
// values of its required node affinity on kubernetes.io/arch.
func affinityArchs(t *testing.T, ds *appsv1.DaemonSet) []string {
	t.Helper()
	a := ds.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatal("deploy/daemonset.yaml has no required node affinity: it would land on nodes the image has no build for")
	}
	var archs []string
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == "kubernetes.io/arch" && e.Operator == "In" {
				archs = append(archs, e.Values...)
			}
		}
	}
	slices.Sort(archs)
	return archs
}

// stringVar reads the initial value of a Go string variable from an executable's
// symbol table and data (a string is a pointer and a length, here little-endian
// 64-bit).
func stringVar(f *elf.File, name string) (value string, declared bool, err error) {
	syms, err := f.Symbols()
	if err != nil {
		return "", false, err
	}
	i := slices.IndexFunc(syms, func(s elf.Symbol) bool { return s.Name == name })
	if i < 0 {
		return "", false, nil
	}
	if f.Class != elf.ELFCLASS64 || f.ByteOrder != binary.LittleEndian {
		return "", true, fmt.Errorf("only little-endian 64-bit executables are read")
	}
	header, err := readVirtual(f, syms[i].Value, 16)
	if err != nil {
		return "", true, err
	}
	data, err := readVirtual(f, binary.LittleEndian.Uint64(header), binary.LittleEndian.Uint64(header[8:]))
	return string(data), true, err
}

// readVirtual reads n bytes at virtual address addr from the section holding them.
func readVirtual(f *elf.File, addr, n uint64) ([]byte, error) {
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_NOBITS || addr < sec.Addr || addr+n > sec.Addr+sec.Size {
			continue
		}
		buf := make([]byte, n)
		_, err := sec.ReadAt(buf, int64(addr-sec.Addr))
		return buf, err
	}
	return nil, fmt.Errorf("no section holds %d bytes at %#x", n, addr)
}

// wantLabels are the OCI labels and annotations the image must carry.
func wantLabels(img builtImage) map[string]string {
	return map[string]string{
		"org.opencontainers.image.version":  img.version,
		"org.opencontainers.image.revision": img.revision,
		"org.opencontainers.image.source":   "https://github.com/nftproxy/nftproxy",
		"org.opencontainers.image.created":  img.created.Format(time.RFC3339),
	}
}

func checkLabels(t *testing.T, got map[string]string, img builtImage) {
	t.Helper()
	for k, v := range wantLabels(img) {
		if got[k] != v {
			t.Errorf("label/annotation %s = %q, want %q", k, got[k], v)
		}
	}
}

// checkSkopeo inspects the archive through skopeo's two archive transports: the
// image index (digest index) for this machine's platform and for each of archs, the
// docker archive's amd64 image; and copies the index whole, as a registry push does,
// which must keep its digest.
func checkSkopeo(t *testing.T, img builtImage, index string, archs []string, dir string) {
	type inspection struct{ ref, arch string }
	var refs []inspection
	for _, ref := range []string{"oci-archive:" + img.archive + ":latest", "oci-archive:" + img.archive + ":" + img.version} {
		refs = append(refs, inspection{ref, runtime.GOARCH})
	}
	for _, arch := range archs {
		refs = append(refs, inspection{"oci-archive:" + img.archive + ":latest", arch})
	}
	refs = append(refs, inspection{"docker-archive:" + img.archive, "amd64"})
	for _, in := range refs {
		ref := in.ref
		out, err := exec.Command("skopeo", "inspect", "--override-arch", in.arch, ref).Output()
		if err != nil {
			t.Errorf("skopeo inspect %s: %v", ref, exitStderr(err))
			continue
		}
		var got struct {
			Digest, Architecture, Os string
			Labels                   map[string]string
			Layers                   []string
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("skopeo inspect %s: %v", ref, err)
		}
		checkLabels(t, got.Labels, img)
		if got.Architecture != in.arch || got.Os != "linux" || len(got.Layers) != 1 {
			t.Errorf("skopeo inspect --override-arch %s %s: %s/%s with %d layers", in.arch, ref, got.Os, got.Architecture, len(got.Layers))
		}
		// The docker view's digest is of a Docker manifest skopeo makes up.
		if strings.HasPrefix(ref, "oci-archive:") && got.Digest != index {
			t.Errorf("skopeo inspect %s: digest %s, want the index's %s", ref, got.Digest, index)
		}
	}
	copied := filepath.Join(dir, "copied")
	if out, err := exec.Command("skopeo", "copy", "--all", "oci-archive:"+img.archive+":latest", "oci:"+copied+":latest").CombinedOutput(); err != nil {
		t.Fatalf("skopeo copy --all: %v\n%s", err, out)
	}
	var layout struct{ Manifests []struct{ Digest string } }
	if b, err := os.ReadFile(filepath.Join(copied, "index.json")); err != nil || json.Unmarshal(b, &layout) != nil || len(layout.Manifests) != 1 {
		t.Fatalf("the copy's index.json: %s, %v", b, err)
	}
	if got := layout.Manifests[0].Digest; got != index {
		t.Errorf("skopeo copy --all made the index %s of %s: a registry push would not keep its digest", got, index)
	}
	raw, err := exec.Command("skopeo", "inspect", "--raw", "oci-archive:"+img.archive+":latest").Output()
	if err != nil {
		t.Fatalf("skopeo inspect --raw: %v", exitStderr(err))
	}
	var manifest struct{ Annotations map[string]string }
	if err := json.Unmarshal(raw, &manifest); err != nil {
		t.Fatal(err)
	}
	checkLabels(t, manifest.Annotations, img)
}

func exitStderr(err error) error {
	if ee, ok := err.(*exec.ExitError); ok {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}

// checkCtrImport imports the archive into a throw-away containerd (in the bed's control
// namespace, with its state in the bed's directory, so the bed removes both) and
// checks the images it lists: the index, complete for this machine's platform.
func checkCtrImport(t *testing.T, bed *testbed.Bed, img builtImage, digest string) {
	dir := filepath.Join(bed.Dir, "containerd")
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf("version = 2\nroot = %q\nstate = %q\n# Kubernetes' plugin is not needed to import.\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\naddress = %q\n",
		filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	containerd := bed.Ctl.Start("containerd", "--config", filepath.Join(dir, "config.toml"))
	defer containerd.Stop(5 * time.Second)
	ctr := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return bed.Ctl.Exec(ctx, append([]string{"ctr", "--address", sock, "--namespace", "k8s.io"}, args...)...)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, err := ctr("version"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("containerd not answering: %v\n%s", err, containerd.Log())
		}
	}
	out, err := ctr("images", "import", img.archive)
	if err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, containerd.Log())
	}
	t.Logf("ctr images import:\n%s", strings.TrimSpace(out))
	out, err = ctr("images", "check")
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{img.version, "latest"} {
		name := "docker.io/library/nftproxy:" + tag
		i := slices.IndexFunc(strings.Split(out, "\n"), func(l string) bool { return strings.HasPrefix(l, name+" ") })
		if line := strings.Split(out, "\n"); i < 0 || !strings.Contains(line[i], digest) || !strings.Contains(line[i], "complete") {
			t.Errorf("ctr images check lists no complete %s with digest %s:\n%s", name, digest, out)
		}
	}
}

// readDaemonSet decodes the DaemonSet in deploy/daemonset.yaml (leniently: fields
// this test does not know are fine).
func readDaemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	path := filepath.Join(kubebin.RepoRoot(), "deploy", "daemonset.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for doc := range strings.SplitSeq(string(data), "\n---") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil || meta.Kind != "DaemonSet" {
			continue
		}
		ds := &appsv1.DaemonSet{}
		if err := yaml.Unmarshal([]byte(doc), ds); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(ds.Spec.Template.Spec.Containers) == 0 {
			t.Fatalf("%s: the DaemonSet has no container", path)
		}
		return ds
	}
	t.Fatalf("%s holds no DaemonSet", path)
	return nil
}

// nodeFacts is what kubelet knows about node n. Allocatable is this machine's.
func nodeFacts(t *testing.T, n *testbed.Node) ocispec.Node {
	t.Helper()
	host, _ := os.Hostname()
	return ocispec.Node{
		Name: n.Name, IPs: []netip.Addr{n.IPv4, n.IPv6}, NetNS: "/var/run/netns/" + n.NS, Hostname: host,
		AllocatableCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		AllocatableMemory: *resource.NewQuantity(memTotal(t), resource.BinarySI),
	}
}

// memTotal is MemTotal of /proc/meminfo, in bytes.
func memTotal(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				return kb << 10
			}
		}
	}
	t.Fatalf("no MemTotal in /proc/meminfo")
	return 0
}

// podVolumes writes, below dir, what kubelet would put into the pod's volumes: the
// kubeadm ConfigMap "kube-proxy" (config.conf and kubeconfig.conf, pointing at the
// bed's API server) for a configMap volume naming it, and an empty directory for a
// hostPath this machine lacks (which containerd would create on the host).
func podVolumes(t *testing.T, bed *testbed.Bed, pod v1.PodSpec, dir string) map[string]string {
	t.Helper()
	volumes := map[string]string{}
	for _, vol := range pod.Volumes {
		path := filepath.Join(dir, "volumes", vol.Name)
		switch {
		case vol.ConfigMap != nil && vol.ConfigMap.Name == "kube-proxy":
			if err := ocispec.WriteVolume(path, kubeadmConfigMap()); err != nil {
				t.Fatal(err)
			}
		case vol.ConfigMap != nil:
			t.Fatalf("volume %s: configMap %q is not one this test can fill", vol.Name, vol.ConfigMap.Name)
		case vol.HostPath != nil:
			if _, err := os.Stat(vol.HostPath.Path); err == nil {
				continue
			}
			t.Logf("volume %s: hostPath %s does not exist here; an empty directory stands in", vol.Name, vol.HostPath.Path)
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
		default:
			continue // Derive reports volumes without a source if they are mounted
		}
		volumes[vol.Name] = path
	}
	return volumes
}

// kubeadmConfigMap is the kube-proxy ConfigMap as kubeadm writes it, for this bed:
// the server is the control-plane endpoint, CA and token are the service account's.
func kubeadmConfigMap() map[string][]byte {
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
clientConnection:
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
clusterCIDR: %s
mode: nftables
nftables:
  minSyncPeriod: 0s
  syncPeriod: 0s
`, clusterCIDRs)
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: %[2]s/ca.crt
    server: %[1]s
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: %[2]s/token
`, testbed.APIServerURL, ocispec.ServiceAccountPath)
	return map[string][]byte{"config.conf": []byte(config), "kubeconfig.conf": []byte(kubeconfig)}
}

// serviceAccountVolume creates ServiceAccount namespace/name bound to ClusterRole
// system:node-proxier and writes what kubelet's projected service account volume
// holds: a token from the TokenRequest API, the CA and the namespace.
func serviceAccountVolume(t *testing.T, bed *testbed.Bed, namespace, name, dir string) string {
	t.Helper()
	if name == "" {
		name = "default"
	}
	ctx := context.Background()
	client := bed.Client()
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if _, err := client.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nftproxy-e2e:image:" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", namespace, name, err)
	}
	path := filepath.Join(dir, "volumes", "kube-api-access")
	files := map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": bed.CACert(), "namespace": []byte(namespace)}
	if err := ocispec.WriteVolume(path, files); err != nil {
		t.Fatal(err)
	}
	return path
}
