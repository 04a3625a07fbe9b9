#!/usr/bin/env bash
# build.sh builds the third-party binaries the e2e test bed runs: kube-apiserver,
# upstream kube-proxy (for side-by-side comparisons), etcd, and kubectl and kubeadm (the
# deploy/ tests), from the Go module proxy.
#
# The versions come from e2e/tools/versions (the one place that names them), the sources
# from the nested modules e2e/tools/kube, e2e/tools/kubecli and e2e/tools/etcd, which keep
# k8s.io/kubernetes and etcd out of the main module's dependency graph
# (e2e/tools/set-kube-version.sh points them at the versions of that file).
#
# Binaries go to ${NFTPROXY_E2E_CACHE:-$HOME/.cache/nftproxy-e2e}/bin/<Kubernetes version>,
# one directory per release, each with the etcd that release is tested with. Each binary
# gets a stamp file holding a hash of its module's go.mod/go.sum, the Go version and the
# link flags; a binary whose stamp matches is not rebuilt, so running this script again is
# cheap. A lock serialises concurrent runs (e.g. several test packages calling
# EnsureBinaries).
#
# helm v3 and v4 come from the nested modules e2e/tools/helm3 and e2e/tools/helm4.
# With --kubelet it also builds kubelet, kube-controller-manager and kube-scheduler (from
# the nested module e2e/tools/kubenode) for `make kubelet-e2e`; other tests do not need them.
# With --skew it builds only the kube-apiserver of the oldest supported release
# ("skew-kubernetes", module e2e/tools/kube-skew) and its etcd (e2e/tools/etcd-skew), for
# `make skew`.
# With --cluster it also builds what `make cluster-bench` runs (docs/scale.md): kubemark's
# hollow kube-proxy, many in one process (hollowproxy, from the nested module e2e/tools/kube,
# cmd/hollowproxy), and kube-controller-manager (from e2e/tools/kubenode).
# With --conformance it also builds what `make conformance` runs (docs/conformance.md):
# upstream's e2e suite (e2e.test, a test binary), the ginkgo CLI and agnhost from the nested
# module e2e/tools/conformance, and CoreDNS from e2e/tools/coredns.
# With --flannel it also builds flanneld (nested module e2e/tools/flannel) for the tests of
# nftproxy beside a real CNI (docs/cnis.md).
#
# Usage: e2e/tools/build.sh [--force] [--kubelet] [--skew] [--cluster] [--conformance] [--flannel]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${NFTPROXY_E2E_CACHE:-$HOME/.cache/nftproxy-e2e}"
bin="$cache/bin"
force=0
kubelet=0
skew=0
conformance=0
cluster=0
flannel=0
for arg in "$@"; do
	case "$arg" in
	--force) force=1 ;;
	--kubelet) kubelet=1 ;;
	--skew) skew=1 ;;
	--conformance) conformance=1 ;;
	--cluster) cluster=1 ;;
	--flannel) flannel=1 ;;
	*) echo "usage: $0 [--force] [--kubelet] [--skew] [--cluster] [--conformance] [--flannel]" >&2; exit 2 ;;
	esac
done

# version KEY prints the version e2e/tools/versions gives KEY.
version() {
	local v
	v="$(awk -v k="$1" '$1 == k { print $2 }' "$here/versions")"
	if [[ ! $v =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
		echo "$here/versions: no valid \"$1 vX.Y.Z\" line (got \"$v\")" >&2
		exit 1
	fi
	echo "$v"
}

if [[ $skew == 1 ]]; then
	kube_version="$(version skew-kubernetes)"
	kube_mod="$here/kube-skew"
	etcd_mod="$here/etcd-skew"
else
	kube_version="$(version kubernetes)"
	kube_mod="$here/kube"
	etcd_mod="$here/etcd"
fi
bin="$bin/$kube_version"
mkdir -p "$bin"
exec 9>"$cache/build.lock"
flock 9

# The published k8s.io/kubernetes module reports "v0.0.0-master" unless told otherwise;
# clients and logs are easier to read with the real version.
kube_minor="${kube_version#v1.}"
kube_minor="${kube_minor%%.*}"
kube_ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=${kube_version} \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=${kube_minor}"

# stamp_of prints the identity of a build: module files (and Go files at the module's root,
# e2e/tools/coredns's main.go, or of the package built when it is the module's own, ./cmd/…),
# Go version, flags.
stamp_of() {
	local moddir="$1" ldflags="$2" pkg="${3:-}"
	local srcdir="$moddir"
	[[ $pkg == ./* ]] && srcdir="$moddir/$pkg"
	{
		cat "$moddir/go.mod" "$moddir/go.sum"
		find "$srcdir" -maxdepth 1 -name '*.go' -print0 | sort -z | xargs -0r cat
		go version
		echo "$ldflags"
	} | sha256sum | cut -d' ' -f1
}

# Binaries are static Go without cgo, unless cgo=1 around a build.
cgo=0

# build NAME MODDIR PACKAGE LDFLAGS [test]: with "test", the package's test binary
# (go test -c), as upstream builds e2e.test.
build() {
	local name="$1" moddir="$2" pkg="$3" ldflags="$4" kind="${5:-}"
	local stamp
	stamp="$(stamp_of "$moddir" "$ldflags" "$pkg")"
	if [[ $force == 0 && -x "$bin/$name" && "$(cat "$bin/$name.stamp" 2>/dev/null)" == "$stamp" ]]; then
		echo "up to date: $bin/$name"
		return
	fi
	echo "building $name from $pkg ..."
	local start=$SECONDS
	if [[ $kind == test ]]; then
		(cd "$moddir" && CGO_ENABLED=$cgo go test -c -vet=off -trimpath -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg")
	else
		(cd "$moddir" && CGO_ENABLED=$cgo go build -trimpath -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg")
	fi
	mv -f "$bin/$name.tmp" "$bin/$name"
	echo "$stamp" >"$bin/$name.stamp"
	echo "built $bin/$name in $((SECONDS - start))s"
}

build etcd "$etcd_mod" go.etcd.io/etcd/server/v3 "-s -w"
build kube-apiserver "$kube_mod" k8s.io/kubernetes/cmd/kube-apiserver "$kube_ldflags"
if [[ $skew == 0 ]]; then
	build kube-proxy "$here/kube" k8s.io/kubernetes/cmd/kube-proxy "$kube_ldflags"
	build kubectl "$here/kubecli" k8s.io/kubernetes/cmd/kubectl "$kube_ldflags"
	build kubeadm "$here/kubecli" k8s.io/kubernetes/cmd/kubeadm "$kube_ldflags"
	# helm of both major releases, for the chart's tests (e2e/helm); the
	# version each reports is its module's.
	for major in 3 4; do
		helm_version="$(awk -v m="helm.sh/helm/v$major" '$1 == m { print $2 }' "$here/helm$major/go.mod")"
		build "helm$major" "$here/helm$major" "helm.sh/helm/v$major/cmd/helm" \
			"-s -w -X helm.sh/helm/v$major/internal/version.version=$helm_version"
	done
fi
if [[ $kubelet == 1 && $skew == 0 ]]; then
	for cmd in kubelet kube-controller-manager kube-scheduler; do
		build "$cmd" "$here/kubenode" "k8s.io/kubernetes/cmd/$cmd" "$kube_ldflags"
	done
fi
if [[ $cluster == 1 && $skew == 0 ]]; then
	build kube-controller-manager "$here/kubenode" k8s.io/kubernetes/cmd/kube-controller-manager "$kube_ldflags"
	build hollowproxy "$here/kube" ./cmd/hollowproxy "$kube_ldflags"
fi
if [[ $conformance == 1 && $skew == 0 ]]; then
	build ginkgo "$here/conformance" github.com/onsi/ginkgo/v2/ginkgo "-s -w"
	build agnhost "$here/conformance" k8s.io/kubernetes/test/images/agnhost "-s -w"
	build regression-issue-74839 "$here/conformance" k8s.io/kubernetes/test/images/regression-issue-74839 "-s -w"
	build e2e.test "$here/conformance" k8s.io/kubernetes/test/e2e "$kube_ldflags" test
	build coredns "$here/coredns" . "-s -w"
fi
if [[ $flannel == 1 && $skew == 0 ]]; then
	flannel_version="$(awk '$1 == "github.com/flannel-io/flannel" { print $2 }' "$here/flannel/go.mod")"
	# Its udp backend is C on amd64: linked statically, as flannel's release is,
	# so that it runs in an image without a C library.
	cgo=1
	build flanneld "$here/flannel" github.com/flannel-io/flannel \
		"-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$flannel_version -extldflags -static"
	cgo=0
fi

echo "binaries in $bin:"
ls -l "$bin" | grep -v '\.stamp$' | grep -v '^total'
