#!/usr/bin/env bash
# nft-release.sh fetches another Debian release's `nft` (the nftables package of that suite
# and the libraries it needs, that suite's glibc and loader included), unpacks it without
# installing anything, and prints the command prefix that runs it on this machine:
#
#   $ e2e/tools/nft-release.sh bullseye
#   /root/.cache/nftproxy-e2e/nodes/nft/bullseye/root/lib64/ld-linux-x86-64.so.2 --library-path … …/usr/sbin/nft
#   $ $(e2e/tools/nft-release.sh bullseye) --version
#   nftables v0.9.8 (E.D.S.)
#
# The tests use it to check that listings of nftproxy's table by the `nft` of older and newer
# nodes (bullseye's 0.9.8, trixie's 1.1.3, sid's 1.1.7) neither abort nor fail to reload.
#
# Everything goes to ${NFTPROXY_E2E_CACHE:-$HOME/.cache/nftproxy-e2e}/nodes/nft/<suite>/:
# apt/ (a private apt configuration, lists and an empty dpkg status, so the machine's own apt
# state is not touched), debs/ (the downloaded packages) and root/ (them unpacked with
# dpkg-deb -x). root/.complete holds the nftables version once root/ is whole; a second run
# only prints the prefix. The archive is the machine's own Debian mirror (the first
# /debian URI of its apt sources) unless NFT_RELEASE_MIRROR names another.
#
# Usage: e2e/tools/nft-release.sh [--force] <suite>     (bullseye, bookworm, trixie, sid, …)
set -euo pipefail

force=0
if [[ "${1:-}" == --force ]]; then
	force=1
	shift
fi
if [[ $# -ne 1 || ! "$1" =~ ^[a-z][a-z0-9-]*$ ]]; then
	echo "usage: $0 [--force] <suite>" >&2
	exit 2
fi
suite="$1"
cache="${NFTPROXY_E2E_CACHE:-$HOME/.cache/nftproxy-e2e}"
dir="$cache/nodes/nft/$suite"
root="$dir/root"

prefix() {
	echo "$root/lib64/ld-linux-x86-64.so.2 --library-path $root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu $root/usr/sbin/nft"
}

if [[ $force -eq 0 && -s "$root/.complete" ]]; then
	prefix
	exit 0
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9
if [[ $force -eq 0 && -s "$root/.complete" ]]; then
	prefix
	exit 0
fi

mirror="${NFT_RELEASE_MIRROR:-}"
if [[ -z "$mirror" ]]; then
	mirror="$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
		grep -oE '(https?|file)://[^ ]*/debian/?( |$)' | head -n1 | tr -d ' ' || true)"
fi
if [[ -z "$mirror" ]]; then
	echo "$0: no Debian mirror in the machine's apt sources; set NFT_RELEASE_MIRROR" >&2
	exit 1
fi
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

apt="$dir/apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/etc/preferences.d" "$dir/debs"
: >"$apt/status"
echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt/etc/sources.list"
opts=(
	-o "Dir::Etc::SourceList=$apt/etc/sources.list"
	-o "Dir::Etc::SourceParts=-"
	-o "Dir::Etc::PreferencesParts=$apt/etc/preferences.d"
	-o "Dir::State::Lists=$apt/lists"
	-o "Dir::State::status=$apt/status"
	-o "Dir::Cache=$apt/cache"
	-o "APT::Architecture=amd64"
	-o "APT::Architectures=amd64"
	-o "APT::Install-Recommends=false"
	-o "Debug::NoLocking=true"
	-o "APT::Sandbox::User=root"
)
apt-get "${opts[@]}" -q update >"$apt/update.log" 2>&1 || {
	cat "$apt/update.log" >&2
	[[ -e "$root/.complete" ]] || rm -rf "$dir" # e.g. a suite the archive does not serve
	exit 1
}

# nftables and everything it depends on, as apt would install it on an empty system.
mapfile -t pkgs < <(apt-get "${opts[@]}" -s install nftables 2>"$apt/simulate.err" |
	awk '$1 == "Inst" { print $2 }')
if [[ ${#pkgs[@]} -eq 0 ]]; then
	cat "$apt/simulate.err" >&2
	exit 1
fi
(cd "$dir/debs" && rm -f ./*.deb && apt-get "${opts[@]}" -q download "${pkgs[@]}" >"$apt/download.log" 2>&1) || {
	cat "$apt/download.log" >&2
	exit 1
}

rm -rf "$root"
mkdir -p "$root"
for deb in "$dir"/debs/*.deb; do
	dpkg-deb -x "$deb" "$root"
done
# The loader's lib64 link is absolute in libc6 (or, with merged /usr, only under usr/): point
# root/lib64/ld-linux-x86-64.so.2 at the loader inside root/.
mkdir -p "$root/lib64"
for ld in lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2; do
	if [[ -e "$root/$ld" ]]; then
		ln -sfn "../$ld" "$root/lib64/ld-linux-x86-64.so.2"
		break
	fi
done
version="$(dpkg-deb -f "$(ls "$dir"/debs/nftables_*.deb)" Version)"
# Check it runs before declaring it whole.
$(prefix) --version >/dev/null
echo "$version" >"$root/.complete"
prefix
