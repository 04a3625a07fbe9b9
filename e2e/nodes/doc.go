// Package nodes runs tests on the kernels and userland of the Debian
// releases nftproxy's users run (bullseye, bookworm, trixie and sid),
// each booted under QEMU: the kernel nftproxy programs and the nft,
// ip and conntrack its tests read the kernel back with are then the
// release's own, not this machine's.
//
// Prepare fetches a release's kernel and the packages nftables, iproute2,
// conntrack, busybox-static, netbase and dash with the dependencies apt
// resolves for them, through a private apt configuration (its own
// sources.list, lists, empty status file and cache: the machine's apt
// state is never read nor written), and unpacks them with dpkg-deb under
// the cache (${NFTPROXY_E2E_CACHE:-$HOME/.cache/nftproxy-e2e}/nodes/<suite>),
// where a second Prepare finds them. From them it builds the node's
// initramfs, a cpio archive written here:
//
//   - the release's userland on a merged-/usr layout (/sbin/ip and
//     /usr/sbin/ip both lead to the package's ip): the tool packages' files
//     and the shared libraries their programs need, found from their ELF
//     headers, with the release's own loader and glibc;
//   - busybox's applets for everything else, and dash as /bin/sh
//     (userland.go says why);
//   - the kernel's netfilter, SCTP, bridge, veth, dummy and sock_diag
//     modules with those they depend on (modinfo's depends=), decompressed,
//     loaded by /init in dependency order, and busybox's modprobe for what
//     the kernel asks for later;
//   - /init (init.sh).
//
// Node.Run boots it with qemu-system-x86_64 under software emulation
// (KVM does not work on the machines we test on, which are VMs
// themselves), one CPU, no network device: the guest's traffic stays in
// the guest. A Job's files are appended to the initramfs as a second
// archive; its script's output reaches the host through a virtio serial
// port written to a file, its exit status through the serial console,
// between lines marked with a nonce of the run. A run that ends otherwise
// (a panic, the timeout, a canceled context, Ctrl-C) kills QEMU and
// removes the run's files.
//
// PrepareUserland fetches and unpacks a release's userland alone, and
// Userland.Command runs one of its tools on this machine with the
// release's own loader and libraries: a release's nft against this
// machine's kernel, without booting anything.
//
// TestKernelTests (NFTPROXY_NODES=1, make nodes) runs the kernel tests of
// nft/nftnl, conntrack, proxier, proxier/ruleset, proxier/localnodeport,
// proxier/leftovers and cmd/nftproxy on every release and writes each
// test's result to bin/nodes/<suite>/results.json; docs/nodes.md says
// what they find. TestNftReleasesListOurTable and
// TestNftReleasesListRewrittenPickMaps (NFTPROXY_E2E=1, make e2e) list
// nftproxy's tables with each release's nft on this machine's kernel.
package nodes
