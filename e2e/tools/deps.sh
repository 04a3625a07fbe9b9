#!/usr/bin/env bash
# deps.sh installs what `make demo`, `make test` and the other targets need on a
# fresh Debian machine, as root: the Debian packages the tests run (nft and conntrack
# to read the kernel back, ip for the namespaces, runc, skopeo and containerd for the
# image test, `make kubelet-e2e` and `make conformance`, the CNI plugins of the latter's
# pod network, prometheus and promtool for the monitoring tests, QEMU for `make nodes`)
# and, if there is no Go, the Go toolchain from the Go module proxy. What is there
# already is left alone, so a second run costs a few `command -v`.
#
# Usage: e2e/tools/deps.sh
set -euo pipefail

# The toolchain fetched when the machine has no Go (go.mod needs 1.26).
go_version="1.26.8"

# command → Debian package
declare -A packages=(
	[nft]=nftables
	[conntrack]=conntrack
	[ip]=iproute2
	[runc]=runc
	[skopeo]=skopeo
	[containerd]=containerd
	[ctr]=containerd
	[prometheus]=prometheus
	[promtool]=prometheus
	[curl]=curl
	[unzip]=unzip
	[flock]=util-linux
	# iptables-nft: kube-proxy's iptables mode in the migration test, and the
	# KUBE-* chains the leftovers tests create.
	[iptables-nft]=iptables
	# make nodes (e2e/nodes): Debian releases' kernels booted under software
	# emulation, their packages fetched with apt-get and unpacked with dpkg-deb,
	# their modules decompressed with xz (or zstd).
	[qemu-system-x86_64]=qemu-system-x86
	[qemu-system-aarch64]=qemu-system-arm
	[apt-get]=apt
	[dpkg-deb]=dpkg
	[xz]=xz-utils
	[zstd]=zstd
	# the arm64 build of the image: its --version run by qemu-user in the image test,
	# its unit tests under qemu-user
	[qemu-aarch64-static]=qemu-user-static
	# flanneld (build.sh --flannel): its udp backend is C on amd64
	[gcc]=gcc
)

# file → Debian package, for packages that put nothing on the PATH
declare -A files=(
	# CNI plugins (bridge, host-local, loopback, portmap): make conformance's pod network
	[/usr/lib/cni/bridge]=containernetworking-plugins
	# the C library's headers, for gcc above (a recommendation, not a dependency)
	[/usr/include/stdio.h]=libc6-dev
)

missing=()
for cmd in "${!packages[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || missing+=("${packages[$cmd]}")
done
for f in "${!files[@]}"; do
	[[ -e $f ]] || missing+=("${files[$f]}")
done

if ((${#missing[@]} > 0)); then
	if [[ $EUID -ne 0 ]]; then
		echo "deps.sh: missing ${missing[*]}; run as root to install them" >&2
		exit 1
	fi
	mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
	echo "installing Debian packages: ${missing[*]}"
	# Packages with a daemon (prometheus) would start it in the root namespace
	# on installation; the tests start their own, inside their namespaces.
	policy=/usr/sbin/policy-rc.d
	own_policy=0
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\nexit 101\n' >"$policy"
		chmod +x "$policy"
		own_policy=1
	fi
	trap '[[ $own_policy == 1 ]] && rm -f "$policy"' EXIT
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [[ ! -x /usr/local/go/bin/go ]]; then
	proxy="$(printf '%s' "${GOPROXY:-https://proxy.golang.org}" | cut -d, -f1)"
	arch="$(dpkg --print-architecture)"
	zip="v0.0.1-go${go_version}.linux-${arch}.zip"
	echo "installing Go ${go_version} from ${proxy} into /usr/local/go"
	tmp="$(mktemp -d)"
	curl -fsSL -o "$tmp/go.zip" "${proxy}/golang.org/toolchain/@v/${zip}"
	unzip -q "$tmp/go.zip" -d "$tmp"
	mv "$tmp"/golang.org/toolchain@*/ /usr/local/go
	chmod +x /usr/local/go/bin/* /usr/local/go/pkg/tool/*/*
	rm -rf "$tmp"
fi
