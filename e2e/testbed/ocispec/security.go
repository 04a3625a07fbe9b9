package ocispec

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
)

// allCapabilities are the capabilities Linux 5.9 and later know, in the kernel's
// numbering (CAP_CHOWN is 0).
var allCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
	"CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// defaultCapabilities are containerd's defaults for unprivileged containers.
var defaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// Paths containerd hides from (masked) or makes read-only for unprivileged containers.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
		"/proc/scsi", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// security is the container's securityContext as the runtime applies it.
type security struct {
	c       *corev1.SecurityContext // may be nil
	runtime []string                // the runtime's capabilities
}

func newSecurity(c *corev1.Container, runtime []string) security {
	if runtime == nil {
		runtime = allCapabilities
	}
	return security{c: c.SecurityContext, runtime: runtime}
}

func isPrivileged(c *corev1.Container) bool { return newSecurity(c, nil).privileged() }

func (s security) privileged() bool {
	return s.c != nil && s.c.Privileged != nil && *s.c.Privileged
}

// capabilities: the runtime's own for privileged containers, else containerd's
// defaults with the securityContext's drop ("ALL" drops every default) and add applied.
func (s security) capabilities() *specs.LinuxCapabilities {
	caps := slices.Clone(s.runtime)
	if !s.privileged() {
		caps = slices.Clone(defaultCapabilities)
		if s.c != nil && s.c.Capabilities != nil {
			caps = applyCapabilities(caps, s.c.Capabilities)
		}
	}
	return &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
}

func applyCapabilities(caps []string, change *corev1.Capabilities) []string {
	for _, d := range change.Drop {
		if strings.EqualFold(string(d), "ALL") {
			caps = nil
			break
		}
		caps = slices.DeleteFunc(caps, func(c string) bool { return c == capName(d) })
	}
	for _, a := range change.Add {
		if strings.EqualFold(string(a), "ALL") {
			return slices.Clone(allCapabilities)
		}
		if !slices.Contains(caps, capName(a)) {
			caps = append(caps, capName(a))
		}
	}
	return caps
}

// CurrentCapabilities are the effective capabilities of this process, as containerd
// reads its own to give them to privileged containers.
func CurrentCapabilities() ([]string, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		hex, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/self/status: CapEff: %w", err)
		}
		var caps []string
		for bit, name := range allCapabilities { // in the kernel's numbering
			if mask&(1<<bit) != 0 {
				caps = append(caps, name)
			}
		}
		return caps, nil
	}
	return nil, fmt.Errorf("/proc/self/status has no CapEff")
}

// capName spells a Kubernetes capability ("NET_ADMIN") as the runtime spec does.
func capName(c corev1.Capability) string {
	return "CAP_" + strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
}

// noNewPrivileges is set when the securityContext forbids privilege escalation.
func (s security) noNewPrivileges() bool {
	return s.c != nil && s.c.AllowPrivilegeEscalation != nil && !*s.c.AllowPrivilegeEscalation && !s.privileged()
}

func (s security) readOnlyRoot() bool {
	return s.c != nil && s.c.ReadOnlyRootFilesystem != nil && *s.c.ReadOnlyRootFilesystem
}

// devices: a privileged container may use every device; others only the ones runc
// creates in /dev by default (which runc allows on its own).
func (s security) devices() []specs.LinuxDeviceCgroup {
	return []specs.LinuxDeviceCgroup{{Allow: s.privileged(), Access: "rwm"}}
}

func (s security) maskedPaths() []string {
	if s.privileged() {
		return nil
	}
	return slices.Clone(maskedPaths)
}

func (s security) readonlyPaths() []string {
	if s.privileged() {
		return nil
	}
	return slices.Clone(readonlyPaths)
}
