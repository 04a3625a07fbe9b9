package ocispec

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestExpand(t *testing.T) {
	vars := map[string]string{"NODE_NAME": "n1", "EMPTY": ""}
	lookup := func(name string) (string, bool) { v, ok := vars[name]; return v, ok }
	for _, tc := range []struct{ in, want string }{
		{"--hostname-override=$(NODE_NAME)", "--hostname-override=n1"},
		{"$(NODE_NAME)$(NODE_NAME)", "n1n1"},
		{"$(EMPTY)x", "x"},
		{"$(UNKNOWN)", "$(UNKNOWN)"},
		{"$$(NODE_NAME)", "$(NODE_NAME)"},
		{"$$$(NODE_NAME)", "$n1"},
		{"a$b", "a$b"},
		{"$(NODE_NAME", "$(NODE_NAME"},
		{"$()", "$()"},
		{"trailing$", "trailing$"},
		{"", ""},
	} {
		if got := Expand(tc.in, lookup); got != tc.want {
			t.Errorf("Expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// daemonSetInput is nftproxy's DaemonSet container (as in deploy/daemonset.yaml) on a
// node with two addresses; its hostPath volume is modules, a directory that exists.
func daemonSetInput(modules string) Input {
	privileged := true
	return Input{
		Pod: metav1.ObjectMeta{Name: "nftproxy-abcde", Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-proxy"}},
		Spec: corev1.PodSpec{
			HostNetwork:        true,
			ServiceAccountName: "kube-proxy",
			Containers: []corev1.Container{{
				Name:    "nftproxy",
				Command: []string{"/usr/local/bin/nftproxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"},
				Args:    []string{"--metrics-bind-address-override=$(NODE_IP)", "--v=$(VERBOSITY)"},
				Env: []corev1.EnvVar{
					{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
					{Name: "NODE_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}},
					{Name: "GOMEMLIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}},
					{Name: "GREETING", Value: "on $(NODE_NAME) at $(NODE_IP), $$(NODE_NAME)"},
				},
				SecurityContext: &corev1.SecurityContext{Privileged: &privileged},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"},
					{Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "kube-proxy", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-proxy"}}}},
				{Name: "lib-modules", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: modules}}},
			},
		},
		Container: "nftproxy",
		Image:     Image{Entrypoint: []string{"/usr/local/bin/nftproxy"}},
		Rootfs:    "/tmp/rootfs",
		Node: Node{
			Name: "n1", IPs: []netip.Addr{netip.MustParseAddr("10.10.0.11"), netip.MustParseAddr("fd00:10::11")},
			NetNS: "/var/run/netns/nfp12345-n1", Hostname: "host",
			AllocatableCPU: resource.MustParse("2"), AllocatableMemory: resource.MustParse("4Gi"),
		},
		Volumes:        map[string]string{"kube-proxy": "/tmp/cm"},
		ServiceAccount: "/tmp/sa",
	}
}

func TestDeriveDaemonSet(t *testing.T) {
	modules := t.TempDir()
	spec, err := Derive(daemonSetInput(modules))
	if err != nil {
		t.Fatal(err)
	}
	wantArgs := []string{"/usr/local/bin/nftproxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=n1",
		"--metrics-bind-address-override=10.10.0.11", "--v=$(VERBOSITY)"}
	if !slices.Equal(spec.Process.Args, wantArgs) {
		t.Errorf("args %q, want %q", spec.Process.Args, wantArgs)
	}
	for _, kv := range []string{"NODE_NAME=n1", "NODE_IP=10.10.0.11", "GOMEMLIMIT=4294967296",
		"GREETING=on n1 at 10.10.0.11, $(NODE_NAME)", "HOSTNAME=host", defaultPath} {
		if !slices.Contains(spec.Process.Env, kv) {
			t.Errorf("env %q lacks %q", spec.Process.Env, kv)
		}
	}
	if spec.Process.User.UID != 0 || spec.Process.Cwd != "/" || spec.Root.Path != "/tmp/rootfs" || spec.Root.Readonly {
		t.Errorf("process user %+v cwd %q root %+v", spec.Process.User, spec.Process.Cwd, spec.Root)
	}
	if got := spec.Process.Capabilities.Effective; !slices.Contains(got, "CAP_NET_ADMIN") || !slices.Contains(got, "CAP_SYS_ADMIN") || len(got) != len(allCapabilities) {
		t.Errorf("privileged capabilities %v", got)
	}
	if spec.Linux.MaskedPaths != nil || spec.Linux.ReadonlyPaths != nil || !spec.Linux.Resources.Devices[0].Allow {
		t.Errorf("privileged container has masked %v, read-only %v, devices %+v", spec.Linux.MaskedPaths, spec.Linux.ReadonlyPaths, spec.Linux.Resources.Devices)
	}
	wantNS := []specs.LinuxNamespace{{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
		{Type: specs.NetworkNamespace, Path: "/var/run/netns/nfp12345-n1"}}
	if !slices.Equal(spec.Linux.Namespaces, wantNS) {
		t.Errorf("namespaces %+v, want %+v (hostNetwork: the node's, and the host's UTS)", spec.Linux.Namespaces, wantNS)
	}
	if spec.Hostname != "" {
		t.Errorf("hostname %q set in the host's UTS namespace", spec.Hostname)
	}
	binds := map[string]string{}
	for _, m := range spec.Mounts {
		if m.Type == "bind" {
			binds[m.Destination] = m.Source + " " + strings.Join(m.Options, ",")
		}
	}
	wantBinds := map[string]string{
		"/var/lib/kube-proxy": "/tmp/cm rbind,rprivate,ro", // a configMap volume is always read-only
		"/lib/modules":        modules + " rbind,rprivate,ro",
		ServiceAccountPath:    "/tmp/sa rbind,rprivate,ro",
	}
	if len(binds) != len(wantBinds) {
		t.Errorf("bind mounts %v, want %v", binds, wantBinds)
	}
	for dst, want := range wantBinds {
		if binds[dst] != want {
			t.Errorf("mount at %s: %q, want %q", dst, binds[dst], want)
		}
	}
	if i := slices.IndexFunc(spec.Mounts, func(m specs.Mount) bool { return m.Destination == "/sys" }); i < 0 || !slices.Contains(spec.Mounts[i].Options, "rw") {
		t.Errorf("a privileged container's /sys is not writable: %+v", spec.Mounts)
	}
}

func TestDeriveVariants(t *testing.T) {
	f := false
	for _, tc := range []struct {
		name   string
		change func(in *Input)
		check  func(t *testing.T, s *specs.Spec)
	}{
		{"memory limit and divisor", func(in *Input) {
			c := &in.Spec.Containers[0]
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("100Mi")}
			c.Env = append(c.Env, corev1.EnvVar{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				Resource: "requests.memory", Divisor: resource.MustParse("3Mi")}}})
			c.Env = append(c.Env, corev1.EnvVar{Name: "CPU_M", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				Resource: "limits.cpu", Divisor: resource.MustParse("1m")}}})
		}, func(t *testing.T, s *specs.Spec) {
			// requests default to limits: 100Mi / 3Mi rounds up to 34.
			for _, kv := range []string{"GOMEMLIMIT=104857600", "MEM_MI=34", "CPU_M=2000"} {
				if !slices.Contains(s.Process.Env, kv) {
					t.Errorf("env %q lacks %q", s.Process.Env, kv)
				}
			}
		}},
		{"unprivileged with capabilities", func(in *Input) {
			in.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_ADMIN", "SYS_RESOURCE"}},
				AllowPrivilegeEscalation: &f,
			}
		}, func(t *testing.T, s *specs.Spec) {
			if got := s.Process.Capabilities.Effective; !slices.Equal(got, []string{"CAP_NET_ADMIN", "CAP_SYS_RESOURCE"}) {
				t.Errorf("capabilities %v", got)
			}
			if !s.Process.NoNewPrivileges || len(s.Linux.MaskedPaths) == 0 || s.Linux.Resources.Devices[0].Allow {
				t.Errorf("unprivileged: noNewPrivileges %v masked %v devices %+v", s.Process.NoNewPrivileges, s.Linux.MaskedPaths, s.Linux.Resources.Devices)
			}
		}},
		{"pod network, image command and user", func(in *Input) {
			in.Spec.HostNetwork = false
			in.PodNetNS, in.PodIPs = "/var/run/netns/pod", []netip.Addr{netip.MustParseAddr("10.244.1.5")}
			in.Image = Image{Entrypoint: []string{"/bin/app"}, Cmd: []string{"--default"}, Env: []string{"PATH=/bin"}, User: "65532:65533", WorkingDir: "/work"}
			c := &in.Spec.Containers[0]
			c.Command, c.Args = nil, nil
			c.Env = []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['k8s-app']"}}}}
		}, func(t *testing.T, s *specs.Spec) {
			if !slices.Equal(s.Process.Args, []string{"/bin/app", "--default"}) || s.Process.User.UID != 65532 || s.Process.User.GID != 65533 || s.Process.Cwd != "/work" {
				t.Errorf("process %+v", s.Process)
			}
			for _, kv := range []string{"POD_IP=10.244.1.5", "APP=kube-proxy", "PATH=/bin", "HOSTNAME=nftproxy-abcde"} {
				if !slices.Contains(s.Process.Env, kv) {
					t.Errorf("env %q lacks %q", s.Process.Env, kv)
				}
			}
			if s.Hostname != "nftproxy-abcde" || !slices.Contains(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UTSNamespace}) ||
				!slices.Contains(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/var/run/netns/pod"}) {
				t.Errorf("hostname %q namespaces %+v", s.Hostname, s.Linux.Namespaces)
			}
		}},
		{"privileged gets the runtime's capabilities", func(in *Input) {
			in.RuntimeCapabilities = []string{"CAP_NET_ADMIN", "CAP_NET_RAW"}
		}, func(t *testing.T, s *specs.Spec) {
			if got := s.Process.Capabilities.Bounding; !slices.Equal(got, []string{"CAP_NET_ADMIN", "CAP_NET_RAW"}) {
				t.Errorf("capabilities %v, want the runtime's", got)
			}
		}},
		{"init container", func(in *Input) {
			in.Spec.InitContainers = []corev1.Container{{Name: "sysctls", Command: []string{"/usr/local/bin/nftproxy", "--init-only"}}}
			in.Container = "sysctls"
		}, func(t *testing.T, s *specs.Spec) {
			if !slices.Equal(s.Process.Args, []string{"/usr/local/bin/nftproxy", "--init-only"}) {
				t.Errorf("args %q", s.Process.Args)
			}
		}},
		{"no automount", func(in *Input) {
			in.Spec.AutomountServiceAccountToken = &f
			in.ServiceAccount = ""
		}, func(t *testing.T, s *specs.Spec) {
			if slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == ServiceAccountPath }) {
				t.Errorf("service account mounted though the pod opted out")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := daemonSetInput(t.TempDir())
			tc.change(&in)
			s, err := Derive(in)
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}

func TestDeriveRefuses(t *testing.T) {
	for name, change := range map[string]func(in *Input){
		"unknown fieldRef": func(in *Input) {
			in.Spec.Containers[0].Env[0].ValueFrom.FieldRef.FieldPath = "status.phase"
		},
		"configMapKeyRef": func(in *Input) {
			in.Spec.Containers[0].Env[0].ValueFrom = &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k"}}
		},
		"envFrom": func(in *Input) {
			in.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{}}}
		},
		"volume without a directory": func(in *Input) { delete(in.Volumes, "kube-proxy") },
		"no service account dir":     func(in *Input) { in.ServiceAccount = "" },
		"no such container":          func(in *Input) { in.Container = "other" },
		"no network namespace":       func(in *Input) { in.Node.NetNS = "" },
		"subPath leaving the volume": func(in *Input) { in.Spec.Containers[0].VolumeMounts[0].SubPath = "../etc" },
		"missing hostPath":           func(in *Input) { in.Spec.Volumes[1].HostPath.Path = "/nonexistent/nftproxy-e2e" },
	} {
		in := daemonSetInput(t.TempDir())
		change(&in)
		if _, err := Derive(in); err == nil {
			t.Errorf("%s: Derive succeeded", name)
		}
	}
}

func TestWriteVolume(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "kube-proxy")
	files := map[string][]byte{"config.conf": []byte("kind: KubeProxyConfiguration\n"), "kubeconfig.conf": []byte("kind: Config\n")}
	if err := WriteVolume(dir, files); err != nil {
		t.Fatal(err)
	}
	for name, want := range files {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != string(want) {
			t.Errorf("%s: %q, %v; want %q", name, got, err, want)
		}
		if target, err := os.Readlink(filepath.Join(dir, name)); err != nil || target != filepath.Join("..data", name) {
			t.Errorf("%s links to %q (%v), want ..data/%s", name, target, err, name)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "..data")); err != nil || !strings.HasPrefix(target, "..") {
		t.Errorf("..data links to %q (%v)", target, err)
	}
	if err := WriteVolume(t.TempDir(), map[string][]byte{"../escape": nil}); err == nil {
		t.Error("a name leaving the volume was accepted")
	}
}

func TestCurrentCapabilities(t *testing.T) {
	caps, err := CurrentCapabilities()
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 && !slices.Contains(caps, "CAP_NET_ADMIN") {
		t.Errorf("root without CAP_NET_ADMIN: %v", caps)
	}
	for _, c := range caps {
		if !slices.Contains(allCapabilities, c) {
			t.Errorf("unknown capability %s", c)
		}
	}
}
