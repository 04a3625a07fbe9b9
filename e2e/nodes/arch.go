package nodes

import "runtime"

// archSpec is what differs between the architectures a node can be.
type archSpec struct {
	// Debian is dpkg's name of the architecture, and GOARCH Go's: a node's
	// packages and its test binaries.
	Debian, GOARCH string
	// Triplet names the directory of its libraries (usr/lib/<triplet>),
	// Loader is the path of its glibc loader (PT_INTERP of its programs).
	Triplet, Loader string
	// QEMU is the emulator that boots it, from the Debian package
	// QEMUPackage, with Machine's options; Console is the serial console's
	// device in the guest.
	QEMU, QEMUPackage string
	Machine           []string
	Console           string
	// QEMUUser runs one of its static programs on this machine when it is
	// of another architecture (busybox's depmod, for the node's modules).
	QEMUUser string
}

// hostCommand is the command that runs a static program of the
// architecture on this machine: itself, or under qemu-user.
func (a archSpec) hostCommand(program string) []string {
	if a.GOARCH == runtime.GOARCH {
		return []string{program}
	}
	return []string{a.QEMUUser, program}
}

// archs are the architectures a node can be: this machine's, and the
// image's other platform.
var archs = map[string]archSpec{
	"amd64": {Debian: "amd64", GOARCH: "amd64", Triplet: "x86_64-linux-gnu", Loader: "usr/lib64/ld-linux-x86-64.so.2",
		QEMU: "qemu-system-x86_64", QEMUPackage: "qemu-system-x86", Machine: []string{"-cpu", "max"}, Console: "ttyS0"},
	// The virt board: a PCI host bridge (virtio-serial-pci), a PL011 UART
	// as ttyAMA0, no firmware needed for a kernel booted directly.
	"arm64": {Debian: "arm64", GOARCH: "arm64", Triplet: "aarch64-linux-gnu", Loader: "usr/lib/ld-linux-aarch64.so.1",
		QEMU: "qemu-system-aarch64", QEMUPackage: "qemu-system-arm", Machine: []string{"-machine", "virt", "-cpu", "max"},
		Console: "ttyAMA0", QEMUUser: "qemu-aarch64-static"},
}
