package ocispec

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

// containerMounts are the runtime's file systems (/proc, /dev, /sys, …), then one bind
// mount per volumeMount, the service account volume, /etc/hosts and /etc/resolv.conf.
func containerMounts(in Input, c *corev1.Container) ([]specs.Mount, error) {
	privileged := isPrivileged(c)
	mounts := runtimeMounts(privileged, in.Spec.HostIPC)
	for _, vm := range c.VolumeMounts {
		src, apiData, err := volumeSource(in, vm)
		if err != nil {
			return nil, fmt.Errorf("volumeMount %s at %s: %w", vm.Name, vm.MountPath, err)
		}
		mounts = append(mounts, bind(src, vm.MountPath, vm.ReadOnly || apiData))
	}
	if automount(in.Spec) && !mountsAt(c, ServiceAccountPath) {
		if in.ServiceAccount == "" {
			return nil, fmt.Errorf("the pod mounts a service account token, but Input.ServiceAccount is empty")
		}
		mounts = append(mounts, bind(in.ServiceAccount, ServiceAccountPath, true))
	}
	if in.EtcHosts != "" && !mountsAt(c, "/etc/hosts") {
		mounts = append(mounts, bind(in.EtcHosts, "/etc/hosts", false))
	}
	if in.ResolvConf != "" && !mountsAt(c, "/etc/resolv.conf") {
		mounts = append(mounts, bind(in.ResolvConf, "/etc/resolv.conf", true))
	}
	return mounts, nil
}

// runtimeMounts are the file systems containerd mounts into every container; sysfs
// and the cgroup hierarchy are writable only for privileged containers.
func runtimeMounts(privileged, hostIPC bool) []specs.Mount {
	rw := "ro"
	if privileged {
		rw = "rw"
	}
	shm := specs.Mount{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}
	if hostIPC {
		shm = bind("/dev/shm", "/dev/shm", false)
	}
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", rw}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", rw}},
		shm,
	}
}

func bind(src, dst string, readOnly bool) specs.Mount {
	rw := "rw"
	if readOnly {
		rw = "ro"
	}
	return specs.Mount{Destination: dst, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", rw}}
}

// volumeSource is the host path of a volumeMount: the directory Input.Volumes names for
// its volume, else a hostPath volume's path, joined with its subPath. apiData is set for the volumes kubelet
// always mounts read-only: configMap, secret, downwardAPI and projected.
func volumeSource(in Input, vm corev1.VolumeMount) (src string, apiData bool, err error) {
	i := slices.IndexFunc(in.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
	if i < 0 {
		return "", false, fmt.Errorf("the pod has no volume %q", vm.Name)
	}
	vol := in.Spec.Volumes[i]
	apiData = vol.ConfigMap != nil || vol.Secret != nil || vol.DownwardAPI != nil || vol.Projected != nil
	src, ok := in.Volumes[vol.Name]
	switch {
	case ok:
	case vol.HostPath != nil:
		// Missing paths are created by kubelet (*OrCreate types) or containerd (no
		// type); here the caller decides what stands in, so nothing on the host changes.
		if _, err := os.Stat(vol.HostPath.Path); err != nil {
			return "", false, fmt.Errorf("hostPath volume %q: %w (give Input.Volumes a directory for it)", vol.Name, err)
		}
		src = vol.HostPath.Path
	default:
		return "", false, fmt.Errorf("volume %q is not a hostPath and Input.Volumes has no directory for it", vol.Name)
	}
	if vm.SubPath != "" {
		if !filepath.IsLocal(vm.SubPath) {
			return "", false, fmt.Errorf("subPath %q leaves the volume", vm.SubPath)
		}
		src = filepath.Join(src, vm.SubPath)
	}
	return src, apiData, nil
}

// automount says whether kubelet mounts the service account token (the pod's
// automountServiceAccountToken; the ServiceAccount's own setting is not seen here).
func automount(spec corev1.PodSpec) bool {
	return spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken
}

func mountsAt(c *corev1.Container, path string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool {
		return filepath.Clean(vm.MountPath) == path
	})
}
