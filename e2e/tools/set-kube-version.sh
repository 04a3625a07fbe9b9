#!/usr/bin/env bash
# set-kube-version.sh writes the Kubernetes and etcd versions of e2e/tools/versions into
# every go.mod that depends on them, then runs go mod tidy in each
# (docs/upgrading-kubernetes.md):
#
#   - e2e/tools/kube, kubecli, kubenode, conformance ("kubernetes") and e2e/tools/kube-skew
#     ("skew-kubernetes"): require k8s.io/kubernetes at that version and replace each of
#     its staging modules, as listed by that version's own go.mod (they change between
#     releases), by the published v0.X.Y;
#   - e2e/tools/etcd ("etcd") and e2e/tools/etcd-skew ("skew-etcd"): the etcd server;
#   - e2e/tools/coredns: CoreDNS at the version kubeadm of "kubernetes" deploys
#     (its CoreDNSVersion), which make conformance tags with kubeadm's image name;
#   - the main module and e2e/monitoring: each k8s.io staging module they require at the
#     v0.X.Y of "kubernetes" (go get, so that their other dependencies follow).
#
# Usage:
#   e2e/tools/set-kube-version.sh                 # rewrite from e2e/tools/versions as it is
#   e2e/tools/set-kube-version.sh v1.38.1         # set "kubernetes", and "etcd" from its
#                                                 # build/dependencies.yaml, then rewrite
#   e2e/tools/set-kube-version.sh --skew v1.36.5  # the same for "skew-kubernetes"
#
# It needs the Go module proxy; it compiles nothing (build.sh does that).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
versions="$here/versions"

usage() {
	echo "usage: $0 [[--skew] vX.Y.Z]" >&2
	exit 2
}

# version KEY prints the version e2e/tools/versions gives KEY.
version() {
	local v
	v="$(awk -v k="$1" '$1 == k { print $2 }' "$versions")"
	if [[ ! $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		echo "$versions: no valid \"$1 vX.Y.Z\" line (got \"$v\")" >&2
		exit 1
	fi
	echo "$v"
}

# set_version KEY VALUE rewrites KEY's line of e2e/tools/versions.
set_version() {
	sed -i -E "s/^$1 v[0-9.]+$/$1 $2/" "$versions"
	[[ "$(version "$1")" == "$2" ]] || { echo "could not set $1 in $versions" >&2; exit 1; }
}

# kube_gomod VERSION prints the path of k8s.io/kubernetes@VERSION's go.mod in the module
# cache, downloading it.
kube_gomod() {
	(cd "$root" && go mod download -json "k8s.io/kubernetes@$1") |
		sed -n -E 's/^[[:space:]]*"GoMod": "(.*)",?$/\1/p'
}

# etcd_of VERSION prints the etcd version k8s.io/kubernetes@VERSION is tested with.
etcd_of() {
	local dir
	dir="$(cd "$root" && go mod download -json "k8s.io/kubernetes@$1" |
		sed -n -E 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
	awk '/name: "etcd"/ { found = 1; next } found && $1 == "version:" { print "v" $2; exit }' \
		"$dir/build/dependencies.yaml"
}

# staging_of VERSION lists the staging modules k8s.io/kubernetes@VERSION replaces with
# local paths (./staging/src/k8s.io/...).
staging_of() {
	awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$(kube_gomod "$1")"
}

# staging_version v1.37.2 prints v0.37.2.
staging_version() {
	echo "v0.${1#v1.}"
}

# set_kubernetes MODDIR VERSION points the nested module at k8s.io/kubernetes@VERSION.
set_kubernetes() {
	local moddir="$1" kube="$2" staging
	staging="$(staging_version "$kube")"
	echo "$moddir: k8s.io/kubernetes $kube, staging modules $staging"
	local edits=("-require=k8s.io/kubernetes@$kube")
	local old
	for old in $(awk '$2 == "=>" && $1 ~ /^k8s\.io\// { print $1 }' "$moddir/go.mod"); do
		edits+=("-dropreplace=$old")
	done
	local m
	for m in $(staging_of "$kube"); do
		edits+=("-replace=$m=$m@$staging")
	done
	(cd "$moddir" && go mod edit "${edits[@]}")
	group_replaces "$moddir/go.mod"
	(cd "$moddir" && go mod tidy)
}

# group_replaces GOMOD gathers the one-line replace directives go mod edit writes into
# one replace block at the end, as a person would write them.
group_replaces() {
	awk '
		/^replace [^(]/ { sub(/^replace /, ""); lines[++n] = $0; blank = 1; next }
		/^replace \($/ { inblock = 1; next }
		inblock && /^\)$/ { inblock = 0; next }
		inblock { sub(/^[[:space:]]+/, ""); lines[++n] = $0; next }
		blank && /^$/ { next }
		{ blank = 0; print }
		END {
			if (n == 0) exit
			print ""
			print "replace ("
			for (i = 1; i <= n; i++) print "\t" lines[i]
			print ")"
		}' "$1" >"$1.tmp"
	mv "$1.tmp" "$1"
	go mod edit -fmt "$1"
}

# set_etcd MODDIR VERSION points the nested module at the etcd server VERSION.
set_etcd() {
	echo "$1: etcd $2"
	(cd "$1" && go mod edit "-require=go.etcd.io/etcd/server/v3@$2" && go mod tidy)
}

# coredns_of VERSION prints the CoreDNS version kubeadm of k8s.io/kubernetes@VERSION deploys.
coredns_of() {
	local dir
	dir="$(cd "$root" && go mod download -json "k8s.io/kubernetes@$1" |
		sed -n -E 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
	sed -n -E 's/^[[:space:]]*CoreDNSVersion[[:space:]]*=[[:space:]]*"(v[0-9.]+)".*/\1/p' \
		"$dir/cmd/kubeadm/app/constants/constants.go"
}

# set_coredns MODDIR VERSION points the nested module at CoreDNS VERSION.
set_coredns() {
	echo "$1: coredns $2"
	(cd "$1" && go mod edit "-require=github.com/coredns/coredns@$2" && go mod tidy)
}

# set_clients MODDIR VERSION moves each staging module MODDIR requires to the v0.X.Y of
# k8s.io/kubernetes@VERSION.
set_clients() {
	local moddir="$1" kube="$2" staging m
	staging="$(staging_version "$kube")"
	local gets=()
	for m in $(staging_of "$kube"); do
		if awk -v m="$m" '$1 == m { found = 1 } END { exit !found }' "$moddir/go.mod"; then
			gets+=("$m@$staging")
		fi
	done
	echo "$moddir: ${gets[*]}"
	(cd "$moddir" && go get "${gets[@]}" && go mod tidy)
}

case $# in
0) ;;
1) [[ $1 =~ ^v1\.[0-9]+\.[0-9]+$ ]] || usage
	set_version kubernetes "$1"
	set_version etcd "$(etcd_of "$1")" ;;
2) [[ $1 == --skew && $2 =~ ^v1\.[0-9]+\.[0-9]+$ ]] || usage
	set_version skew-kubernetes "$2"
	set_version skew-etcd "$(etcd_of "$2")" ;;
*) usage ;;
esac

kube="$(version kubernetes)"
skew="$(version skew-kubernetes)"
for mod in kube kubecli kubenode conformance; do
	set_kubernetes "$here/$mod" "$kube"
done
set_coredns "$here/coredns" "$(coredns_of "$kube")"
set_kubernetes "$here/kube-skew" "$skew"
set_etcd "$here/etcd" "$(version etcd)"
set_etcd "$here/etcd-skew" "$(version skew-etcd)"
set_clients "$root" "$kube"
set_clients "$root/e2e/monitoring" "$kube"
echo "done; check with: go test -run TestKubeVersions ./e2e/testbed"
