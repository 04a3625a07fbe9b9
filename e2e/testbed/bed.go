package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Addresses of the control namespace on the fabric; the API server listens there.
const (
	ControlIPv4 = "10.10.0.1"
	ControlIPv6 = "fd00:10::1"
	// APIServerURL is the API server as seen from every namespace of a bed.
	APIServerURL = "https://" + ControlIPv4 + ":6443"
	// ServiceCIDRs are the API server's --service-cluster-ip-range (IPv4 primary).
	ServiceCIDRs = "10.96.0.0/12,fd00:96::/108"
	// PodCIDRs hold every node's pod CIDRs (10.244.i.0/24,
	// fd00:244:0:i::/64): the cluster CIDRs of kube-controller-manager and
	// kubeadm's podSubnet (kube-proxy's clusterCIDR), IPv4 first. The IPv6
	// one is a /48 because a node's /64 may be at most 16 bits longer (the
	// controller-manager's node CIDR allocator and kubeadm's validation
	// refuse more), which is why a node's number sits in the fourth group.
	PodCIDRs = "10.244.0.0/16,fd00:244::/48"
	// NodeCIDRMaskSizes are the lengths of a node's pod CIDRs, IPv4 and IPv6.
	NodeCIDRMaskSizeIPv4, NodeCIDRMaskSizeIPv6 = 24, 64
)

// familyOrder returns a dual-stack list of the constants above (IPv4
// first) in the order of a cluster whose first family is IPv6 if
// ipv6Primary.
func familyOrder(list string, ipv6Primary bool) string {
	v4, v6, ok := strings.Cut(list, ",")
	if !ok || !ipv6Primary {
		return list
	}
	return v6 + "," + v4
}

// IPv6Primary reports whether the bed's first family is IPv6
// (Options.IPv6Primary).
func (b *Bed) IPv6Primary() bool { return b.opts.IPv6Primary }

// ServiceCIDRs are ServiceCIDRs in the bed's family order.
func (b *Bed) ServiceCIDRs() string { return familyOrder(ServiceCIDRs, b.opts.IPv6Primary) }

// PodCIDRs are PodCIDRs in the bed's family order.
func (b *Bed) PodCIDRs() string { return familyOrder(PodCIDRs, b.opts.IPv6Primary) }

// advertiseAddress is the API server's address of the bed's first family:
// what Service kubernetes's endpoints hold.
func (b *Bed) advertiseAddress() string {
	if b.opts.IPv6Primary {
		return ControlIPv6
	}
	return ControlIPv4
}

// bindAddress is the API server's: "::" listens on both families, which an
// IPv6-primary bed needs (pods reach it at ControlIPv6); "0.0.0.0" only on
// IPv4.
func (b *Bed) bindAddress() string {
	if b.opts.IPv6Primary {
		return "::"
	}
	return "0.0.0.0"
}

// Users in the API server's token file.
const (
	// AdminUser is in group system:masters.
	AdminUser = "admin"
	// ProxyUser has only what ClusterRole system:node-proxier grants (bound by the
	// ClusterRoleBinding ProxyRoleBinding), like kube-proxy in a real cluster.
	ProxyUser = "nftproxy"
	// ProxyRoleBinding is the ClusterRoleBinding giving ProxyUser system:node-proxier.
	ProxyRoleBinding = "nftproxy-e2e:node-proxier"
)

// Options configure a bed. The zero value is fine.
type Options struct {
	// BinDir holds etcd and kube-apiserver. Empty: EnsureAPIServer (which builds
	// them), the release $NFTPROXY_KUBE_APISERVER_VERSION names, else the newest.
	BinDir string
	// LogDir receives component and process logs (in a subdirectory named after the
	// bed's Prefix) and keeps them after the test. Empty: $NFTPROXY_E2E_LOGS if set, else
	// a temporary directory, removed at cleanup; if the test failed, the tails of all
	// logs are printed first.
	LogDir string
	// APIServerFlags are appended to kube-apiserver's command line
	// (e.g. "--feature-gates=...").
	APIServerFlags []string
	// PodRoutes says where the bed routes the nodes' pod CIDRs over the
	// fabric; a CNI under test (flannel) routes the rest. A node always
	// routes to its own pods.
	PodRoutes PodRoutes
	// IPv6Primary makes IPv6 the cluster's first family: the Service
	// ranges, cluster CIDRs, each Node's pod CIDRs and addresses, and the
	// API server's advertised address (so Service kubernetes) list IPv6
	// first; kubeadm's kube-dns gets an IPv6 address.
	IPv6Primary bool
}

// PodRoutes are the places the bed routes the nodes' pod CIDRs.
type PodRoutes int

const (
	// PodRoutesEverywhere: every node and the control namespace route each
	// node's pod CIDRs to it (a CNI with direct routing).
	PodRoutesEverywhere PodRoutes = iota
	// PodRoutesFromControl: only the control namespace does, as a machine
	// beside a cluster (the API server's, the test runner's) would reach
	// its pods; between the nodes the CNI does.
	PodRoutesFromControl
	// PodRoutesNowhere: the CNI routes them all; the control namespace is
	// outside the pod network.
	PodRoutesNowhere
)

// Bed is one running test cluster. Its methods that create things (AddNode, AddPod,
// Start) fail the test on error and must be called from the test's goroutine.
type Bed struct {
	// Prefix starts the name of every namespace of this bed: "nfp" and 5 hex digits.
	Prefix string
	// Ctl is the control namespace: bridge br0, etcd, kube-apiserver.
	Ctl Netns
	// AdminKubeconfig and ProxyKubeconfig are kubeconfig files for AdminUser and
	// ProxyUser, for programs running inside a bed namespace (they use APIServerURL).
	AdminKubeconfig, ProxyKubeconfig string
	// Dir is the bed's working directory (certificates, etcd data).
	Dir string
	// APIServerVersion is the running kube-apiserver's gitVersion (/version).
	APIServerVersion string

	t       TB
	opts    Options
	logDir  string
	pki     *pki
	etcd    *Process
	apiArgs []string // kube-apiserver's command line, for StartAPIServer
	client  kubernetes.Interface
	cleaned sync.Once

	mu         sync.Mutex
	namespaces []string // created namespaces, in creation order
	procs      []*Process
	containers []string // runc ids, in creation order
	procSeq    int
	nodes      []*Node
	apisrv     *Process // the running kube-apiserver, or the last one stopped
	hooks      []func() // OnCleanup's, in registration order
}

// Start creates a bed: the control namespace and fabric, etcd and kube-apiserver (ready,
// with RBAC for ProxyUser in place). Everything is removed when the test ends. Start skips
// a *testing.T or *testing.B when it cannot run here (not root, no iproute2), unless
// NFTPROXY_E2E=1; any other TB gets a Fatal.
func Start(t TB, opts Options) *Bed {
	t.Helper()
	if tb, ok := t.(testing.TB); ok {
		RequirePrivileges(tb)
	} else if why := privilegeProblem(); why != "" {
		t.Fatalf("e2e test bed %s", why)
	}
	sweepOnce.Do(func() {
		removed, err := Sweep(false)
		if len(removed) > 0 || err != nil {
			t.Logf("testbed: swept leftovers of earlier runs: %v (errors: %v)", removed, err)
		}
	})
	var wantVersion string
	if opts.BinDir == "" {
		opts.BinDir, wantVersion = EnsureAPIServer(t)
	} else if err := checkBinaries(opts.BinDir); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	b := &Bed{t: t, opts: opts}
	// The owner file is written before anything else exists, so that a concurrent Sweep
	// never mistakes this bed for a dead one.
	for b.Prefix == "" {
		prefix := newPrefix()
		if err := writeOwner(prefix); errors.Is(err, os.ErrExist) {
			continue
		} else if err != nil {
			t.Fatalf("record test bed owner: %v", err)
		}
		b.Prefix = prefix
	}
	b.Ctl = Netns{NS: b.Prefix + "-ctl", bed: b}
	register(b)
	t.Cleanup(func() { b.cleanup(t.Failed()) })
	if err := b.start(); err != nil {
		t.Fatalf("start test bed %s: %v", b.Prefix, err)
	}
	if wantVersion != "" && b.APIServerVersion != wantVersion {
		t.Fatalf("test bed %s: kube-apiserver reports %s, want %s (from %s)", b.Prefix, b.APIServerVersion, wantVersion, opts.BinDir)
	}
	t.Logf("testbed %s: kube-apiserver %s ready at %s after %v (logs in %s)", b.Prefix, b.APIServerVersion, APIServerURL, time.Since(started).Round(time.Millisecond), b.logDir)
	return b
}

var sweepOnce sync.Once

// RequirePrivileges skips the test unless it runs as root with iproute2 installed; with
// NFTPROXY_E2E=1 it fails the test instead.
func RequirePrivileges(t testing.TB) {
	t.Helper()
	why := privilegeProblem()
	if why == "" {
		return
	}
	if os.Getenv("NFTPROXY_E2E") == "1" {
		t.Fatalf("e2e test bed %s (NFTPROXY_E2E=1 makes this a failure)", why)
	}
	t.Skipf("e2e test bed %s", why)
}

// privilegeProblem says why a bed cannot run here, or "".
func privilegeProblem() string {
	if os.Geteuid() != 0 {
		return "needs root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "needs iproute2 (ip)"
	}
	return ""
}

func newPrefix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return "nfp" + hex.EncodeToString(b)[:5]
}

func (b *Bed) start() error {
	dir, err := os.MkdirTemp("", b.Prefix+"-")
	if err != nil {
		return err
	}
	b.Dir = dir
	b.logDir = filepath.Join(dir, "logs")
	if b.opts.LogDir == "" {
		b.opts.LogDir = os.Getenv("NFTPROXY_E2E_LOGS") // keep the logs of every bed (debugging)
	}
	if b.opts.LogDir != "" {
		b.logDir = filepath.Join(b.opts.LogDir, b.Prefix) // beds may share a LogDir
	}
	if err := os.MkdirAll(b.logDir, 0o755); err != nil {
		return err
	}
	if err := b.setupControlNetns(); err != nil {
		return err
	}
	return b.startControlPlane()
}

// addNetns creates a namespace of this bed and records it for cleanup.
func (b *Bed) addNetns(ns string, settings ...string) error {
	b.mu.Lock()
	b.namespaces = append(b.namespaces, ns)
	b.mu.Unlock()
	return addNetns(ns, settings...)
}

// ControlPlanePIDs are the process IDs of kube-apiserver and etcd.
func (b *Bed) ControlPlanePIDs() []int { return []int{b.apiServer().Pid(), b.etcd.Pid()} }

// RESTConfig is an admin client configuration whose connections are made inside the
// control namespace. QPS and Burst are high for scale tests; copy and change as needed.
func (b *Bed) RESTConfig() *rest.Config {
	return b.restConfig(b.pki.adminToken)
}

// ProxyRESTConfig is like RESTConfig but authenticates as ProxyUser.
func (b *Bed) ProxyRESTConfig() *rest.Config {
	return b.restConfig(b.pki.proxyToken)
}

func (b *Bed) restConfig(token string) *rest.Config {
	return &rest.Config{
		Host:            APIServerURL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: b.pki.caPEM},
		Dial:            b.Ctl.DialContext,
		QPS:             1000,
		Burst:           2000,
	}
}

// CACert is the PEM certificate of the CA that signed the API server's serving
// certificate: what a kubeconfig's certificate-authority names.
func (b *Bed) CACert() []byte { return slices.Clone(b.pki.caPEM) }

// AdminExec runs a command-line client of the API server (kubectl,
// kubeadm) from the control namespace as the bed's admin: tool, args, then
// --kubeconfig with the admin's kubeconfig.
func (b *Bed) AdminExec(ctx context.Context, tool string, args ...string) (string, error) {
	return b.Ctl.Exec(ctx, slices.Concat([]string{tool}, args, []string{"--kubeconfig", b.AdminKubeconfig})...)
}

// Client is an admin clientset for the bed's API server.
func (b *Bed) Client() kubernetes.Interface {
	return b.client
}

// Nodes returns the nodes added so far, in order.
func (b *Bed) Nodes() []*Node {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.nodes)
}

// LogDir is the directory holding the logs of etcd, kube-apiserver and started processes.
func (b *Bed) LogDir() string { return b.logDir }

// OnCleanup registers f to run when the bed is cleaned up, before its processes are
// killed, most recent first: also when the test process is interrupted (SIGINT,
// SIGTERM), when the test's own Cleanup functions do not run. f must be safe to call
// more than once (it may run from both) and from another goroutine. e2e/kubenode stops
// its nodes with it: their containers live in cgroups and pod namespaces that killing
// the bed's processes and namespaces would not reach.
func (b *Bed) OnCleanup(f func()) {
	b.mu.Lock()
	b.hooks = append(b.hooks, f)
	b.mu.Unlock()
}

// cleanup kills every process and deletes every namespace of the bed, once. It runs from
// t.Cleanup or from the signal handler (then without t, so it writes to stderr).
func (b *Bed) cleanup(failed bool) {
	b.cleaned.Do(func() {
		defer unregister(b)
		b.mu.Lock()
		procs, namespaces := slices.Clone(b.procs), slices.Clone(b.namespaces)
		containers, hooks := slices.Clone(b.containers), slices.Clone(b.hooks)
		b.mu.Unlock()
		if failed {
			b.dumpLogs(procs)
		}
		for _, f := range slices.Backward(hooks) {
			f()
		}
		for _, id := range slices.Backward(containers) {
			if err := deleteContainer(id); err != nil {
				fmt.Fprintf(os.Stderr, "testbed %s: %v\n", b.Prefix, err)
			}
		}
		for _, p := range slices.Backward(procs) {
			p.Kill()
		}
		for _, ns := range slices.Backward(namespaces) {
			for _, pid := range netnsPids(ns) { // e.g. daemons a test started via Exec
				killPid(pid)
			}
			if err := deleteNetns(ns); err != nil {
				fmt.Fprintf(os.Stderr, "testbed %s: %v\n", b.Prefix, err)
			}
		}
		os.Remove(filepath.Join(ownerDir, b.Prefix))
		if b.Dir != "" {
			// Certificates, kubeconfigs and etcd's data: nothing to keep
			// (logs, when kept, are in opts.LogDir).
			os.RemoveAll(b.Dir)
		}
	})
}

// dumpLogs prints the tail of every log, for a failed test.
func (b *Bed) dumpLogs(procs []*Process) {
	for _, p := range procs {
		n := 30
		if p == b.etcd || filepath.Base(p.Args[0]) == "kube-apiserver" { // every one, restarts too
			n = 60
		}
		msg := fmt.Sprintf("testbed %s: last %d lines of %s (%v):\n%s", b.Prefix, n, p.LogPath, p.Args, tail(p.Log(), n))
		if b.t != nil {
			b.t.Log(msg)
		} else {
			fmt.Fprintln(os.Stderr, msg)
		}
	}
}
