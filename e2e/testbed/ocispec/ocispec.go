// Package ocispec derives the OCI runtime spec that kubelet and containerd's CRI plugin
// would give one container of a pod, so that a test can run a manifest's container with
// runc as a cluster would: command and args with $(VAR) references expanded, env with
// fieldRef and resourceFieldRef values filled in, a mount for each volumeMount and for
// the service account token, the securityContext's capabilities, and hostNetwork as
// the node's network namespace.
//
// It covers what nftproxy's DaemonSet and similar node agents use and fails with an
// error on anything else (envFrom, configMapKeyRef, volumes it cannot place) rather
// than guessing. It does not add the environment variables kubelet makes from
// Services (KUBERNETES_SERVICE_HOST, …), the host's devices a privileged container
// sees, rlimits or an OOM score.
package ocispec

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Version is the runtime spec version the specs claim: what runc 1.1 (Debian 12)
// implements.
const Version = "1.0.2-dev"

// Image is the part of an image's configuration a runtime uses.
type Image struct {
	Entrypoint, Cmd, Env []string
	WorkingDir, User     string
}

// Node is what kubelet knows about the node the pod runs on.
type Node struct {
	Name string
	// IPs are status.hostIPs; the first is status.hostIP.
	IPs []netip.Addr
	// NetNS is the path of the node's network namespace, which hostNetwork pods join.
	NetNS string
	// Hostname is the host's name: a hostNetwork pod shares its UTS namespace.
	Hostname string
	// AllocatableCPU and AllocatableMemory are what a resourceFieldRef to an unset
	// limit resolves to, as in kubelet.
	AllocatableCPU, AllocatableMemory resource.Quantity
}

// Input is one container of a pod and everything kubelet and the runtime would add.
type Input struct {
	Pod       metav1.ObjectMeta
	Spec      corev1.PodSpec
	Container string // its name in Spec.Containers or Spec.InitContainers
	Image     Image
	Rootfs    string // the unpacked image
	Node      Node
	// PodNetNS and PodIPs are the pod's own network namespace and addresses; unused
	// with hostNetwork (the node's).
	PodNetNS string
	PodIPs   []netip.Addr
	// Volumes maps volume names to host directories holding what kubelet would put
	// there (a configMap's keys as files, …). hostPath volumes need no entry.
	Volumes map[string]string
	// ServiceAccount is the directory of kubelet's projected service account volume
	// (token, ca.crt, namespace), mounted read-only at ServiceAccountPath unless the
	// pod opts out of automounting.
	ServiceAccount string
	// EtcHosts and ResolvConf, when set, are mounted at /etc/hosts (by kubelet) and
	// /etc/resolv.conf (by the runtime).
	EtcHosts, ResolvConf string
	// RuntimeCapabilities are the capabilities the runtime itself holds, which
	// containerd gives a privileged container (CurrentCapabilities reads them). Nil:
	// every capability Linux knows.
	RuntimeCapabilities []string
}

// ServiceAccountPath is where kubelet mounts the service account volume.
const ServiceAccountPath = "/var/run/secrets/kubernetes.io/serviceaccount"

// defaultPath is the PATH containerd gives a container whose image sets none.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Derive builds the runtime spec of in's container.
func Derive(in Input) (*specs.Spec, error) {
	c, err := in.container()
	if err != nil {
		return nil, err
	}
	env, err := containerEnv(in, c)
	if err != nil {
		return nil, fmt.Errorf("container %s: env: %w", c.Name, err)
	}
	lookup := lookupIn(env)
	args := commandLine(c, in.Image, lookup)
	if len(args) == 0 {
		return nil, fmt.Errorf("container %s: neither it nor its image names a command", c.Name)
	}
	user, err := processUser(in, c)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.Name, err)
	}
	mounts, err := containerMounts(in, c)
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", c.Name, err)
	}
	namespaces, err := namespaces(in)
	if err != nil {
		return nil, err
	}
	sec := newSecurity(c, in.RuntimeCapabilities)
	spec := &specs.Spec{
		Version: Version,
		Process: &specs.Process{
			User:            user,
			Args:            args,
			Env:             processEnv(in, env),
			Cwd:             firstNonEmpty(c.WorkingDir, in.Image.WorkingDir, "/"),
			Capabilities:    sec.capabilities(),
			NoNewPrivileges: sec.noNewPrivileges(),
		},
		Root:   &specs.Root{Path: in.Rootfs, Readonly: sec.readOnlyRoot()},
		Mounts: mounts,
		Linux: &specs.Linux{
			Namespaces:    namespaces,
			Resources:     &specs.LinuxResources{Devices: sec.devices()},
			MaskedPaths:   sec.maskedPaths(),
			ReadonlyPaths: sec.readonlyPaths(),
		},
	}
	if !in.Spec.HostNetwork {
		spec.Hostname = firstNonEmpty(in.Spec.Hostname, in.Pod.Name)
	}
	return spec, nil
}

// container is the container named in.Container, an init container or not.
func (in Input) container() (*corev1.Container, error) {
	for _, list := range [][]corev1.Container{in.Spec.InitContainers, in.Spec.Containers} {
		for i := range list {
			if list[i].Name == in.Container {
				return &list[i], nil
			}
		}
	}
	return nil, fmt.Errorf("pod has no container %q", in.Container)
}

// commandLine is the process's argv as Kubernetes defines it: command replaces the
// image's entrypoint (and then its cmd too), args replace the image's cmd. $(VAR)
// references in command and args are expanded from the container's environment.
func commandLine(c *corev1.Container, img Image, lookup func(string) (string, bool)) []string {
	var argv []string
	for _, s := range c.Command {
		argv = append(argv, Expand(s, lookup))
	}
	if len(c.Command) == 0 {
		argv = append(argv, img.Entrypoint...)
	}
	for _, s := range c.Args {
		argv = append(argv, Expand(s, lookup))
	}
	if len(c.Command) == 0 && len(c.Args) == 0 {
		argv = append(argv, img.Cmd...)
	}
	return argv
}

// processEnv is the image's environment overridden by the container's, with PATH and
// HOSTNAME as containerd adds them.
func processEnv(in Input, env []envVar) []string {
	hostname := in.Node.Hostname
	if !in.Spec.HostNetwork {
		hostname = firstNonEmpty(in.Spec.Hostname, in.Pod.Name)
	}
	out := []string{"HOSTNAME=" + hostname}
	hasPath := false
	for _, kv := range in.Image.Env {
		hasPath = hasPath || strings.HasPrefix(kv, "PATH=")
		out = append(out, kv)
	}
	if !hasPath {
		out = append(out, defaultPath)
	}
	for _, e := range env {
		out = setEnv(out, e.name, e.value)
	}
	return out
}

// setEnv replaces name's entry in env, or appends one.
func setEnv(env []string, name, value string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, name+"=") {
			env[i] = name + "=" + value
			return env
		}
	}
	return append(env, name+"="+value)
}

// processUser is the securityContext's user and group (the container's over the
// pod's), else the image's numeric USER, else root.
func processUser(in Input, c *corev1.Container) (specs.User, error) {
	var u specs.User
	if img := in.Image.User; img != "" && img != "root" {
		uid, gid, _ := strings.Cut(img, ":")
		id, err := strconv.ParseUint(uid, 10, 32)
		if err != nil {
			return u, fmt.Errorf("image user %q: only numeric users are supported", img)
		}
		u.UID = uint32(id)
		if gid != "" {
			id, err := strconv.ParseUint(gid, 10, 32)
			if err != nil {
				return u, fmt.Errorf("image user %q: only numeric groups are supported", img)
			}
			u.GID = uint32(id)
		}
	}
	if psc := in.Spec.SecurityContext; psc != nil {
		setID(&u.UID, psc.RunAsUser)
		setID(&u.GID, psc.RunAsGroup)
	}
	if sc := c.SecurityContext; sc != nil {
		setID(&u.UID, sc.RunAsUser)
		setID(&u.GID, sc.RunAsGroup)
	}
	return u, nil
}

func setID(dst *uint32, id *int64) {
	if id != nil {
		*dst = uint32(*id)
	}
}

// namespaces are new mount, PID, IPC and UTS namespaces unless the pod shares the
// host's, and the node's network namespace for hostNetwork pods (which share the
// host's UTS namespace too), else the pod's.
func namespaces(in Input) ([]specs.LinuxNamespace, error) {
	ns := []specs.LinuxNamespace{{Type: specs.MountNamespace}}
	if !in.Spec.HostPID {
		ns = append(ns, specs.LinuxNamespace{Type: specs.PIDNamespace})
	}
	if !in.Spec.HostIPC {
		ns = append(ns, specs.LinuxNamespace{Type: specs.IPCNamespace})
	}
	netns := in.PodNetNS
	if in.Spec.HostNetwork {
		netns = in.Node.NetNS
	} else {
		ns = append(ns, specs.LinuxNamespace{Type: specs.UTSNamespace})
	}
	if netns == "" {
		return nil, fmt.Errorf("no network namespace for the pod (hostNetwork %v)", in.Spec.HostNetwork)
	}
	return append(ns, specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: netns}), nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
