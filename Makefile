# nftproxy — see README.md. Everything that touches the kernel needs root.
# A fresh machine may have Go only where deps.sh puts it.
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/go/bin
GO        ?= go
BIN       := bin
E2E_FLAGS ?= -timeout 30m

# What nftproxy --version, its start-up log and kubernetes_build_info report
# (cmd/nftproxy/version.go). git describe falls back to the commit when no
# tag is reachable, and marks a dirty tree "-dirty".
VERSION    ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
GIT_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
GO_LDFLAGS = -X main.version=$(VERSION) -X main.gitCommit=$(GIT_COMMIT) -X main.buildDate=$(BUILD_DATE)

.PHONY: all deps build image test unit unit-arm64 e2e-tools e2e demo bench bench-plots vet clean soak skew

all: build

# Debian packages the tests use and, without one, a Go toolchain (as root; a
# no-op when everything is there). Every target that runs tests depends on it,
# so that `make demo` and `make test` are all the set-up a fresh machine needs.
deps:
	e2e/tools/deps.sh

build:
	$(GO) build -ldflags "$(GO_LDFLAGS)" -o $(BIN)/nftproxy ./cmd/nftproxy
	$(GO) build -o $(BIN)/probe ./e2e/cmd/probe

# The container image (see README.md, "Image"): a static binary in an OCI
# archive built by deploy/image, its own module, without a container engine.
# Its build date is the commit's (unless BUILD_DATE is set on the command line),
# so that building a commit twice gives the same image.
# IMAGE_PLATFORMS are the platforms of the image index: a binary each, cross-compiled
# (deploy/daemonset.yaml schedules only on their architectures; docs/image.md says how
# each is tested).
IMAGE_TAR ?= $(BIN)/nftproxy-image.tar
IMAGE_PLATFORMS := linux/amd64 linux/arm64
image: BUILD_DATE = $(shell TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo 1970-01-01T00:00:00Z)
image:
	for p in $(IMAGE_PLATFORMS); do \
		CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -ldflags "$(GO_LDFLAGS)" \
			-o $(BIN)/nftproxy-static-$${p%/*}-$${p#*/} ./cmd/nftproxy || exit 1; \
	done
	cd deploy/image && $(GO) run . build $(foreach p,$(IMAGE_PLATFORMS),--binary $(abspath $(BIN)/nftproxy-static-$(subst /,-,$(p)))) \
		--out $(abspath $(IMAGE_TAR)) --version $(VERSION) --revision $(or $(GIT_COMMIT),unknown) --created $(BUILD_DATE)

# deploy/monitoring's tests are a module of their own (e2e/monitoring/doc.go).
MONITORING := cd e2e/monitoring && NFTPROXY_E2E=1

vet: deps
	$(GO) vet ./...
	cd deploy/image && $(GO) vet ./...
	cd e2e/monitoring && $(GO) mod tidy -diff && $(GO) vet ./...
	cd e2e/benchplot && $(GO) mod tidy -diff && $(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)

# Unit tests (pure code, fakes) and kernel integration tests (root: each in
# its own network namespace), with the race detector.
unit: deps
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /e2e/)
	$(GO) test -count=1 -run '^TestKubeVersions$$' ./e2e/testbed
	cd deploy/image && $(GO) test -race -count=1 ./...
	$(MONITORING) $(GO) test -race -count=1 .
	cd e2e/benchplot && $(GO) test -race -count=1 ./...

# The unit tests of the arm64 build (the image's other platform), run by qemu-user:
# the pure code and every byte of the netlink encoding. Its kernel tests skip here
# (qemu-user opens no netfilter netlink socket); they run on an arm64 kernel in a VM.
unit-arm64: deps
	GOARCH=arm64 CGO_ENABLED=0 $(GO) test -count=1 -exec qemu-aarch64-static $$($(GO) list ./... | grep -v /e2e/)

# kube-apiserver, etcd and upstream kube-proxy of the newest Kubernetes
# release (e2e/tools/versions), and flanneld (e2e/cni), built from the Go
# module proxy into ~/.cache/nftproxy-e2e/bin/<version> (instant when up to
# date).
e2e-tools: deps
	e2e/tools/build.sh --flannel

# The real test bed: apiserver + etcd, nodes and pods as network namespaces.
# KUBE_APISERVER_VERSION picks the beds' kube-apiserver and etcd: the newest
# release (default) or the oldest supported one (make skew).
KUBE_APISERVER_VERSION ?= $(NFTPROXY_KUBE_APISERVER_VERSION)
e2e: e2e-tools
	NFTPROXY_E2E=1 NFTPROXY_KUBE_APISERVER_VERSION=$(KUBE_APISERVER_VERSION) $(GO) test -count=1 $(E2E_FLAGS) ./e2e/...
	$(MONITORING) NFTPROXY_KUBE_APISERVER_VERSION=$(KUBE_APISERVER_VERSION) $(GO) test -count=1 $(E2E_FLAGS) ./live

# The scenarios that exercise the API (Services of every kind, EndpointSlices,
# ServiceCIDRs, this Node, restarts, outages, objects straight from etcd)
# against the kube-apiserver and etcd of the oldest Kubernetes release
# nftproxy supports ("skew-kubernetes" in e2e/tools/versions; built on demand
# by e2e/tools/build.sh --skew). docs/kubernetes-versions.md says what differs.
SKEW_VERSION := $(shell awk '$$1 == "skew-kubernetes" { print $$2 }' e2e/tools/versions)
SKEW_TESTS   ?= ^(TestClusterIP|TestExternal|TestSemantics|TestConntrack|TestRestart|TestEarlyConnectionAttempt|TestNodeChanges|TestAPIServerOutage|TestStartWithoutAPIServer|TestBadInputFromEtcd|TestDump|TestDiff)$$
skew: e2e-tools
	e2e/tools/build.sh --skew
	NFTPROXY_E2E=1 NFTPROXY_KUBE_APISERVER_VERSION=$(SKEW_VERSION) $(GO) test -count=1 $(E2E_FLAGS) \
		-run '$(SKEW_TESTS)' ./e2e/scenarios
	NFTPROXY_E2E=1 NFTPROXY_KUBE_APISERVER_VERSION=$(SKEW_VERSION) $(GO) test -count=1 -run '^TestBed$$' ./e2e/testbed

test: deps vet unit e2e

# nftproxy and upstream kube-proxy side by side on the same API state (see
# docs/benchmarks.md). Not part of `make test`. BENCH_SERVICES=10000 for more.
# Each size's values go to $(BENCH_DATA)/bench-N.json, which holds one run
# (the previous run's files are removed first); e2e/benchplot, a module of
# its own, draws them into $(BENCH_PLOTS). `make bench-plots` only redraws.
BENCH_SERVICES  ?= 1000 10000
BENCH_ENDPOINTS ?= 5
BENCH_CHANGES   ?= 20
BENCH_DATA      ?= docs/bench/data
BENCH_PLOTS     ?= docs/bench
bench: e2e-tools
	mkdir -p $(BENCH_DATA)
	rm -f $(BENCH_DATA)/*.json
	for n in $(BENCH_SERVICES); do \
		$(GO) run ./e2e/cmd/bench --upstream --services $$n --endpoints $(BENCH_ENDPOINTS) --changes $(BENCH_CHANGES) \
			--json $(BENCH_DATA)/bench-$$n.json || exit 1; \
	done
	$(MAKE) --no-print-directory bench-plots

bench-plots:
	cd e2e/benchplot && $(GO) run . --out $(abspath $(BENCH_PLOTS)) $(abspath $(BENCH_DATA))
	@echo "plots drawn from $(BENCH_DATA)/*.json into $(BENCH_PLOTS)/*.svg (shown by docs/benchmarks.md)"

# Many nodes on one API server, nftproxy's beside kube-proxy's (docs/scale.md):
# kube-apiserver, etcd and kube-controller-manager, CLUSTER_HOLLOW hollow nodes
# (nftproxy's proxier on the fake backend; kubemark's hollow kube-proxy) and
# CLUSTER_REAL real nodes (the proxy binaries on kernel tables); start, churn,
# API server restart and outage storms, every proxy restarted. Rewrites
# docs/scale.md's tables. Not part of `make test`.
CLUSTER_HOLLOW    ?= 200
CLUSTER_REAL      ?= 8
CLUSTER_SERVICES  ?= 2000
CLUSTER_ENDPOINTS ?= 5
CLUSTER_RUNS      ?= 3
CLUSTER_FLAGS     ?=
.PHONY: cluster-bench
cluster-bench: e2e-tools
	e2e/tools/build.sh --cluster
	mkdir -p $(BIN)/cluster-bench
	$(GO) run ./e2e/cmd/clusterbench --hollow $(CLUSTER_HOLLOW) --real $(CLUSTER_REAL) \
		--services $(CLUSTER_SERVICES) --endpoints $(CLUSTER_ENDPOINTS) --runs $(CLUSTER_RUNS) \
		--doc docs/scale.md --json $(BIN)/cluster-bench/result.json $(CLUSTER_FLAGS)

# The kernel's cost of ruleset shapes, batch by batch (root; fresh namespaces;
# docs/design-measurements.md). NFTPROXY_BENCH_SIZES=10000x5,100000x10 for more.
.PHONY: bench-kernel
bench-kernel:
	$(GO) test ./nft/nftnl -run '^$$' -bench Kernel -benchtime 5x -timeout 3h

# deploy/ on a real kubelet and containerd, one node of the bed
# (docs/kubelet-e2e.md). Not part of `make test`: it builds kubelet,
# kube-controller-manager and kube-scheduler too, and runs a container runtime.
.PHONY: kubelet-e2e
kubelet-e2e: e2e-tools image
	e2e/tools/build.sh --kubelet
	NFTPROXY_KUBELET_E2E=1 NFTPROXY_IMAGE_TAR=$(abspath $(IMAGE_TAR)) \
		$(GO) test -count=1 -v -timeout 20m -run TestDaemonSetOnKubelet ./e2e/kubenode/

# Upstream's [sig-network] conformance tests on a dual-stack two-node cluster
# of real kubelets, once with nftproxy (make image, kubectl apply -k deploy/)
# and once with upstream kube-proxy, then nftproxy's disruptions measured
# under load (docs/conformance.md). Not part of `make test`: it builds
# e2e.test, agnhost, CoreDNS and the test images, and runs two clusters.
# CONFORMANCE_SET=sig-network runs the broader set and then, on the same
# clusters reconfigured, the localhost NodePort tests (localhost-nodeports,
# which also runs alone); CONFORMANCE_CNI=flannel-iptables|flannel-nftables
# runs them on flannel's pod network instead of the bed's bridge, and
# CONFORMANCE_PRIMARY=ipv6 on a cluster that lists IPv6 first (their tables
# go to docs/cnis.md); PREV_RELEASE is the commit whose image the upgrade
# case starts from. The JUnit reports, run records, logs and disruption
# figures go to bin/conformance[/CNI] (bin/conformance[/CNI]/SET for a set
# but the conformance one); each set's table in docs/conformance.md (or
# docs/cnis.md) is rewritten from them (also after a failed run).
CONFORMANCE_SET ?= conformance
CONFORMANCE_CNI ?= bridge
CONFORMANCE_PRIMARY ?= ipv4
CONFORMANCE_OUT  = $(BIN)/conformance
CONFORMANCE_DOC  = $(if $(filter bridge/ipv4,$(CONFORMANCE_CNI)/$(CONFORMANCE_PRIMARY)),docs/conformance.md,docs/cnis.md)
PREV_RELEASE    ?= eec0c2a
PREV_IMAGE_TAR  := $(BIN)/nftproxy-image-$(PREV_RELEASE).tar
.PHONY: conformance conformance-table prev-image
conformance: e2e-tools image prev-image
	e2e/tools/build.sh --kubelet --conformance
	NFTPROXY_CONFORMANCE=1 NFTPROXY_CONFORMANCE_SET=$(CONFORMANCE_SET) NFTPROXY_CONFORMANCE_CNI=$(CONFORMANCE_CNI) \
		NFTPROXY_CONFORMANCE_PRIMARY=$(CONFORMANCE_PRIMARY) \
		NFTPROXY_IMAGE_TAR=$(abspath $(IMAGE_TAR)) NFTPROXY_PREV_IMAGE_TAR=$(abspath $(PREV_IMAGE_TAR)) \
		NFTPROXY_CONFORMANCE_OUT=$(abspath $(CONFORMANCE_OUT)) \
		$(GO) test -count=1 -v -timeout 6h -run TestConformance ./e2e/conformance/; \
		status=$$?; $(MAKE) --no-print-directory conformance-table; exit $$status

conformance-table:
	$(GO) run ./e2e/cmd/conformance-table --cni $(CONFORMANCE_CNI) --primary $(CONFORMANCE_PRIMARY) --set $(CONFORMANCE_SET) --out $(CONFORMANCE_OUT) --doc $(CONFORMANCE_DOC)

# The image of an earlier commit (make image there, from `git archive`), for
# the conformance run's upgrade case; built once per commit.
prev-image: $(PREV_IMAGE_TAR)
$(PREV_IMAGE_TAR):
	rm -rf $(BIN)/prev-src && mkdir -p $(BIN)/prev-src
	git archive $(PREV_RELEASE) | tar -x -C $(BIN)/prev-src
	$(MAKE) -C $(BIN)/prev-src image IMAGE_TAR=$(abspath $@) \
		VERSION=$$(git describe --tags --always $(PREV_RELEASE)) GIT_COMMIT=$$(git rev-parse $(PREV_RELEASE)) \
		BUILD_DATE=$$(TZ=UTC0 git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ $(PREV_RELEASE))
	rm -rf $(BIN)/prev-src

# The Helm chart (deploy/helm/nftproxy, docs/installing.md) on the conformance
# cluster: installed from the bed's registry as an OCI artifact with helm v3
# and v4 in turn in place of kube-proxy, upgraded from the chart of
# PREV_RELEASE's image to this build's, a value changed, rolled back and
# uninstalled under load (0 connections lost), `helm test` between. Not part
# of `make test` (which renders the chart against deploy/: e2e/chart).
.PHONY: helm-e2e chart
helm-e2e: e2e-tools image prev-image
	e2e/tools/build.sh --kubelet --conformance
	NFTPROXY_HELM_E2E=1 NFTPROXY_IMAGE_TAR=$(abspath $(IMAGE_TAR)) NFTPROXY_PREV_IMAGE_TAR=$(abspath $(PREV_IMAGE_TAR)) \
		NFTPROXY_CONFORMANCE_OUT=$(abspath $(CONFORMANCE_OUT)) \
		$(GO) test -count=1 -v -timeout 2h -run '^TestHelm$$' ./e2e/conformance/

# The chart packaged for this build into $(BIN): appVersion is the image tag
# `make image` gives (VERSION), the chart's version 0.1.0-g<VERSION>. helm is
# the one e2e/tools/build.sh builds (v4); `helm push` it to an OCI registry.
KUBE_RELEASE   := $(shell awk '$$1 == "kubernetes" { print $$2 }' e2e/tools/versions)
HELM          ?= $(or $(NFTPROXY_E2E_CACHE),$(HOME)/.cache/nftproxy-e2e)/bin/$(KUBE_RELEASE)/helm4
CHART_VERSION ?= 0.1.0-g$(subst .,-,$(VERSION))
chart: e2e-tools
	$(HELM) package deploy/helm/nftproxy --version $(CHART_VERSION) --app-version $(VERSION) --destination $(BIN)

# The kernel tests of nft/nftnl, conntrack, proxier, proxier/ruleset,
# proxier/localnodeport, proxier/leftovers and cmd/nftproxy on the kernels
# and userland (nft, ip, conntrack, iptables) of Debian's releases, each
# booted under QEMU's software emulation (docs/nodes.md), amd64 and Debian
# 13 on arm64; each release's results go to bin/nodes/<name>/results.json,
# from which docs/nodes.md's tables are written (make nodes-table).
# NODES_SUITES=bookworm,trixie-arm64 runs some of bullseye, bookworm,
# trixie, sid and trixie-arm64. Not part of `make test`.
NODES_SUITES ?= $(NFTPROXY_NODES_SUITES)
.PHONY: nodes nodes-table
nodes: deps
	NFTPROXY_NODES=1 NFTPROXY_NODES_SUITES=$(NODES_SUITES) $(GO) test -count=1 -timeout 3h -v ./e2e/nodes; \
		status=$$?; $(MAKE) --no-print-directory nodes-table; exit $$status

# docs/nodes.md's tables, from the results each release's run left in bin/nodes.
nodes-table:
	$(GO) run ./e2e/cmd/nodes-table --results $(BIN)/nodes --doc docs/nodes.md

# A local control plane, a node with two pods, traffic through a Service.
demo: e2e-tools
	$(GO) run ./e2e/cmd/demo

clean:
	rm -rf $(BIN)
	$(GO) run ./e2e/cmd/sweep

# The soak test for an hour (make test runs it for five minutes): churn,
# memory and goroutines flat, no failed sync, the tables as a fresh proxy's.
SOAK ?= 1h
soak: e2e-tools
	NFTPROXY_E2E=1 NFTPROXY_SOAK=$(SOAK) $(GO) test -count=1 -timeout 3h -v -run TestSoak ./e2e/soak/
