package scenarios

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// kubeletPod is a pod of the nftproxy DaemonSet run on a bed node the way
// kubelet would run it, without a container runtime: the Pod object is
// created from the DaemonSet's template and admitted by the API server
// (which adds the service account volume), its volumes are filled as
// kubelet fills them (ConfigMap keys byte for byte, a token from the
// TokenRequest API bound to the pod, the cluster's CA), and each container
// runs in the node's network namespace and a private mount namespace with
// its volumes at their mount paths, its image's binary at the command's
// path, its environment and $(VAR) references, its capabilities and its
// read-only root and /proc/sys. Nothing changes outside those namespaces.
type kubeletPod struct {
	d    *dropIn
	t    *testing.T
	node *testbed.Node
	pod  *v1.Pod // as admitted
	dir  string  // one directory per volume
	main *testbed.Process
}

// startPod creates the DaemonSet's pod for node n, runs its init
// containers to completion and starts its container.
func (d *dropIn) startPod(t *testing.T, n *testbed.Node) *kubeletPod {
	t.Helper()
	ctx, cancel := d.ctx()
	defer cancel()
	ds, err := d.client.AppsV1().DaemonSets(kubeSystem).Get(ctx, dropInName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := d.client.CoreV1().Pods(kubeSystem).Create(ctx, daemonSetPod(ds, n.Name), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the API server refuses the DaemonSet's pod: %v", err)
	}
	k := &kubeletPod{d: d, t: t, node: n, pod: pod, dir: filepath.Join(d.dir, pod.Name)}
	for _, vol := range pod.Spec.Volumes {
		k.fillVolume(vol)
	}
	for _, c := range pod.Spec.InitContainers {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := n.Exec(ctx, k.launcher(c)...)
		cancel()
		if err != nil {
			t.Fatalf("init container %s: %v\n%s", c.Name, err, out)
		}
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("the DaemonSet's pod has %d containers; this test runs one", len(pod.Spec.Containers))
	}
	k.main = n.Start(k.launcher(pod.Spec.Containers[0])...)
	return k
}

// daemonSetPod is the pod the DaemonSet controller would create for node.
func daemonSetPod(ds *appsv1.DaemonSet, node string) *v1.Pod {
	tmpl := ds.Spec.Template.DeepCopy()
	yes := true
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: ds.Name + "-" + node, Namespace: ds.Namespace, Labels: tmpl.Labels, Annotations: tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name,
				UID: ds.UID, Controller: &yes, BlockOwnerDeletion: &yes}},
		},
		Spec: tmpl.Spec,
	}
	pod.Spec.NodeName = node
	return pod
}

// stop stops the container and deletes the pod object (its token with it).
func (k *kubeletPod) stop() {
	k.main.Stop(5 * time.Second)
	ctx, cancel := k.d.ctx()
	defer cancel()
	k.d.client.CoreV1().Pods(kubeSystem).Delete(ctx, k.pod.Name, metav1.DeleteOptions{})
}

// fillVolume writes a volume's files into k.dir/<volume name>.
func (k *kubeletPod) fillVolume(vol v1.Volume) {
	dir := filepath.Join(k.dir, vol.Name)
	switch {
	case vol.ConfigMap != nil:
		k.configMapFiles(dir, vol.ConfigMap.Name, vol.ConfigMap.Items)
	case vol.Projected != nil:
		for _, src := range vol.Projected.Sources {
			k.projectedFiles(dir, src)
		}
	default:
		k.t.Fatalf("volume %s: only ConfigMap and projected volumes are run by this test", vol.Name)
	}
}

func (k *kubeletPod) projectedFiles(dir string, src v1.VolumeProjection) {
	switch {
	case src.ServiceAccountToken != nil:
		k.writeFile(filepath.Join(dir, src.ServiceAccountToken.Path), k.token(src.ServiceAccountToken))
	case src.ConfigMap != nil:
		k.configMapFiles(dir, src.ConfigMap.Name, src.ConfigMap.Items)
	case src.DownwardAPI != nil:
		for _, item := range src.DownwardAPI.Items {
			if item.FieldRef == nil || item.FieldRef.FieldPath != "metadata.namespace" {
				k.t.Fatalf("downward API item %s: not run by this test", item.Path)
			}
			k.writeFile(filepath.Join(dir, item.Path), []byte(k.pod.Namespace))
		}
	default:
		k.t.Fatalf("projected volume source %+v: not run by this test", src)
	}
}

// token is what kubelet writes for a service account token projection:
// a token of the pod's service account bound to the pod.
func (k *kubeletPod) token(p *v1.ServiceAccountTokenProjection) []byte {
	req := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: p.ExpirationSeconds,
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: k.pod.Name, UID: k.pod.UID},
	}}
	if p.Audience != "" {
		req.Spec.Audiences = []string{p.Audience}
	}
	ctx, cancel := k.d.ctx()
	defer cancel()
	tr, err := k.d.client.CoreV1().ServiceAccounts(k.pod.Namespace).CreateToken(ctx, k.pod.Spec.ServiceAccountName, req, metav1.CreateOptions{})
	if err != nil {
		k.t.Fatalf("token for service account %s: %v", k.pod.Spec.ServiceAccountName, err)
	}
	return []byte(tr.Status.Token)
}

// configMapFiles writes a ConfigMap's keys (or the items named) as files.
func (k *kubeletPod) configMapFiles(dir, name string, items []v1.KeyToPath) {
	ctx, cancel := k.d.ctx()
	defer cancel()
	cm, err := k.d.client.CoreV1().ConfigMaps(k.pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatalf("ConfigMap volume: %v", err)
	}
	if len(items) == 0 {
		for key := range cm.Data {
			items = append(items, v1.KeyToPath{Key: key, Path: key})
		}
	}
	for _, it := range items {
		data, ok := cm.Data[it.Key]
		if !ok {
			k.t.Fatalf("ConfigMap %s has no key %s", name, it.Key)
		}
		k.writeFile(filepath.Join(dir, it.Path), []byte(data))
	}
}

func (k *kubeletPod) writeFile(path string, data []byte) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		k.t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		k.t.Fatal(err)
	}
}

// volumeFile returns the content of a file of a volume as the pod sees it
// at path (a file under one of the container's mount paths).
func (k *kubeletPod) volumeFile(c v1.Container, path string) ([]byte, error) {
	for _, m := range c.VolumeMounts {
		if rel, err := filepath.Rel(m.MountPath, path); err == nil && !strings.HasPrefix(rel, "..") {
			return os.ReadFile(filepath.Join(k.dir, m.Name, rel))
		}
	}
	return nil, fmt.Errorf("%s is on no volume of container %s", path, c.Name)
}

// launcher is the command line that runs container c on the node: a shell
// script in a private mount namespace that sets the container's file
// system up and execs its command.
func (k *kubeletPod) launcher(c v1.Container) []string {
	script := filepath.Join(k.dir, "run-"+c.Name+".sh")
	k.writeFile(script, []byte(k.script(c)))
	return []string{"unshare", "--mount", "--propagation", "private", "sh", script}
}

func (k *kubeletPod) script(c v1.Container) string {
	if len(c.Command) == 0 {
		k.t.Fatalf("container %s: no command", c.Name)
	}
	for _, m := range c.VolumeMounts {
		if m.SubPath != "" || m.SubPathExpr != "" {
			k.t.Fatalf("container %s: subPath mounts are not run by this test", c.Name)
		}
	}
	sc := c.SecurityContext
	if sc == nil {
		sc = &v1.SecurityContext{}
	}
	if sc.RunAsUser != nil && *sc.RunAsUser != 0 {
		k.t.Fatalf("container %s: runs as user %d; this test runs root only", c.Name, *sc.RunAsUser)
	}
	var s strings.Builder
	s.WriteString("set -eu\n")
	// Mount points that do not exist on the host are made on a tmpfs over
	// their nearest existing directory (in this mount namespace only).
	targets := []string{filepath.Dir(c.Command[0])}
	for _, m := range c.VolumeMounts {
		targets = append(targets, m.MountPath)
	}
	for _, dir := range tmpfsDirs(targets) {
		fmt.Fprintf(&s, "mount -t tmpfs -o mode=0755 e2e-pod %s\n", shq(dir))
	}
	// The image: our binary at the command's path.
	fmt.Fprintf(&s, "mkdir -p %s\ncp %s %s\n", shq(filepath.Dir(c.Command[0])), shq(k.d.nftproxy), shq(c.Command[0]))
	for _, m := range c.VolumeMounts {
		fmt.Fprintf(&s, "mkdir -p %[2]s\nmount --bind %[1]s %[2]s\n", shq(filepath.Join(k.dir, m.Name)), shq(m.MountPath))
		if m.ReadOnly {
			fmt.Fprintf(&s, "mount -o remount,bind,ro %s\n", shq(m.MountPath))
		}
	}
	privileged := sc.Privileged != nil && *sc.Privileged
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		s.WriteString("mount -o remount,bind,ro /\n")
	}
	if !privileged { // container runtimes mount /proc/sys read-only
		s.WriteString("mount --bind /proc/sys /proc/sys\nmount -o remount,bind,ro /proc/sys\n")
	}
	env := k.env(c)
	s.WriteString(`exec env -i NFTPROXY_E2E_BED="${NFTPROXY_E2E_BED:-}"`)
	for _, e := range env {
		fmt.Fprintf(&s, " %s", shq(e[0]+"="+e[1]))
	}
	if !privileged {
		for _, a := range capabilityArgs(sc) {
			fmt.Fprintf(&s, " %s", shq(a))
		}
	}
	for _, a := range expandVars(append(slices.Clone(c.Command), c.Args...), env) {
		fmt.Fprintf(&s, " %s", shq(a))
	}
	s.WriteString("\n")
	return s.String()
}

// tmpfsDirs returns, for the paths that do not exist, the nearest existing
// directory of each (symbolic links resolved: /var/run is /run), shortest
// first.
func tmpfsDirs(paths []string) []string {
	set := map[string]bool{}
	for _, p := range paths {
		if _, err := os.Stat(p); err == nil {
			continue
		}
		dir := filepath.Dir(p)
		for {
			if _, err := os.Stat(dir); err == nil {
				break
			}
			dir = filepath.Dir(dir)
		}
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		set[dir] = true
	}
	dirs := make([]string, 0, len(set))
	for d := range set {
		dirs = append(dirs, d)
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) < len(dirs[j]) })
	return dirs
}

// defaultCapabilities are a container's capabilities when its
// securityContext adds and drops none (containerd's and Docker's default).
var defaultCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW", "SETGID",
	"SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

// capabilityArgs is a setpriv command that leaves root the container's
// capabilities: for root, the permitted set after exec is the inheritable
// and bounding sets together, so both are set.
func capabilityArgs(sc *v1.SecurityContext) []string {
	caps := slices.Clone(defaultCapabilities)
	if sc.Capabilities != nil {
		for _, d := range sc.Capabilities.Drop {
			if capName(d) == "ALL" {
				caps = nil
			}
			caps = slices.DeleteFunc(caps, func(c string) bool { return c == capName(d) })
		}
		for _, a := range sc.Capabilities.Add {
			caps = append(caps, capName(a))
		}
	}
	list := "-all"
	for _, c := range caps {
		list += ",+" + strings.ToLower(c)
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		setpriv = "setpriv"
	}
	args := []string{setpriv, "--inh-caps=" + list, "--bounding-set=" + list}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		args = append(args, "--no-new-privs")
	}
	return args
}

func capName(c v1.Capability) string { return strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_") }

// env is the container's environment as kubelet resolves it, in order.
func (k *kubeletPod) env(c v1.Container) [][2]string {
	var env [][2]string
	for _, e := range c.Env {
		val := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.FieldRef != nil:
			val = k.field(e.ValueFrom.FieldRef.FieldPath)
		case e.ValueFrom.ResourceFieldRef != nil:
			val = k.resource(c, e.ValueFrom.ResourceFieldRef)
		default:
			k.t.Fatalf("env %s: not run by this test", e.Name)
		}
		env = append(env, [2]string{e.Name, val})
	}
	return env
}

// field resolves a downward API field; with hostNetwork the pod's IP is
// the node's.
func (k *kubeletPod) field(path string) string {
	switch path {
	case "metadata.name":
		return k.pod.Name
	case "metadata.namespace":
		return k.pod.Namespace
	case "spec.nodeName":
		return k.node.Name
	case "spec.serviceAccountName":
		return k.pod.Spec.ServiceAccountName
	case "status.hostIP":
		return k.node.IPv4.String()
	case "status.podIP":
		if k.pod.Spec.HostNetwork {
			return k.node.IPv4.String()
		}
	}
	k.t.Fatalf("downward API field %s: not run by this test", path)
	return ""
}

// resource resolves limits.memory: the container's limit, or the node's
// memory when it has none (kubelet: the node's allocatable memory).
func (k *kubeletPod) resource(c v1.Container, ref *v1.ResourceFieldSelector) string {
	if ref.Resource != "limits.memory" || !ref.Divisor.IsZero() && ref.Divisor.Value() != 1 {
		k.t.Fatalf("resource field %s: not run by this test", ref.Resource)
	}
	if q, ok := c.Resources.Limits[v1.ResourceMemory]; ok {
		return strconv.FormatInt(q.Value(), 10)
	}
	return strconv.FormatInt(nodeMemoryBytes(k.t), 10)
}

func nodeMemoryBytes(t *testing.T) int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if _, err := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); err == nil {
			return kb * 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

// expandVars replaces $(NAME) with the value of env variable NAME and $$
// with $, as kubelet does in a container's command and args; references
// to undefined variables stay as written.
func expandVars(args []string, env [][2]string) []string {
	vals := map[string]string{}
	for _, e := range env {
		vals[e[0]] = e[1]
	}
	out := make([]string, len(args))
	for i, a := range args {
		var b strings.Builder
		for j := 0; j < len(a); j++ {
			switch {
			case strings.HasPrefix(a[j:], "$$"):
				b.WriteByte('$')
				j++
			case strings.HasPrefix(a[j:], "$("):
				if end := strings.IndexByte(a[j:], ')'); end > 0 {
					if v, ok := vals[a[j+2:j+end]]; ok {
						b.WriteString(v)
						j += end
						continue
					}
				}
				b.WriteByte('$')
			default:
				b.WriteByte(a[j])
			}
		}
		out[i] = b.String()
	}
	return out
}

// shq quotes s for sh.
func shq(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// probeURL is where kubelet sends an HTTP probe of container c: the pod's
// IP (the node's, with hostNetwork) unless the probe names a host.
func (k *kubeletPod) probeURL(c v1.Container, p *v1.Probe) string {
	if p == nil || p.HTTPGet == nil {
		k.t.Fatalf("container %s: want an HTTP probe, got %+v", c.Name, p)
	}
	host := p.HTTPGet.Host
	if host == "" {
		host = k.field("status.podIP")
	}
	return fmt.Sprintf("http://%s:%d%s", host, k.port(c, p.HTTPGet.Port), p.HTTPGet.Path)
}

// port resolves a port number or a container port's name.
func (k *kubeletPod) port(c v1.Container, p intstr.IntOrString) int32 {
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	k.t.Fatalf("container %s has no port %q", c.Name, p.StrVal)
	return 0
}

// probe sends an HTTP probe from the node, as kubelet does, until it
// succeeds (kubelet: a status in [200, 400)) or wait passes.
func (k *kubeletPod) probe(p *v1.Probe, wait time.Duration) error {
	c := k.pod.Spec.Containers[0]
	url := k.probeURL(c, p)
	var (
		code int
		body string
		err  error
	)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body, err = extHTTPGet(k.node.Netns, url); err == nil && code >= http.StatusOK && code < http.StatusBadRequest {
			return nil
		}
		select {
		case <-k.main.Done():
			return fmt.Errorf("probe %s: nftproxy exited: %v", url, k.main.Err())
		default:
		}
	}
	return fmt.Errorf("probe %s: no success within %v: last %d %q (%v)", url, wait, code, body, err)
}
