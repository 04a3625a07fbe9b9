package testbed

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Control plane timeouts. etcd is up in well under a second and kube-apiserver ready
// about 2 s later on our machines; the margins cover loaded CI hosts.
const (
	etcdTimeout      = 30 * time.Second
	apiserverTimeout = 90 * time.Second
)

// setupControlNetns creates the control namespace with the fabric bridge. The control
// namespace routes between nodes like a top-of-rack router, so it forwards and knows every
// node's pod CIDRs (AddNode adds those routes).
func (b *Bed) setupControlNetns() error {
	ns := b.Ctl.NS
	if err := b.addNetns(ns, "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"); err != nil {
		return err
	}
	// Multicast snooping off: the bridge then floods IPv6 neighbour solicitations instead
	// of depending on MLD reports, which nodes send only some time after link-up.
	return ipBatch(ns,
		"link add br0 type bridge mcast_snooping 0",
		"addr add "+ControlIPv4+"/24 dev br0",
		"addr add "+ControlIPv6+"/64 dev br0 nodad",
		"link set br0 up",
	)
}

// startControlPlane starts etcd and kube-apiserver in the control namespace, waits until
// the API server is ready and sets up the proxy user's RBAC and the kubeconfig files.
// etcd listens on loopback of the control namespace only, so beds never clash on ports.
func (b *Bed) startControlPlane() error {
	p, err := newPKI(b.Dir)
	if err != nil {
		return fmt.Errorf("generate keys: %w", err)
	}
	b.pki = p
	bin := b.opts.BinDir
	b.etcd, err = b.startProcess(b.Ctl.NS, []string{
		filepath.Join(bin, "etcd"),
		"--name=default",
		"--data-dir=" + filepath.Join(b.Dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379",
		"--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=default=http://127.0.0.1:2380",
		"--unsafe-no-fsync", // the data dies with the test; fsync only slows scale tests
		"--log-level=warn",
	})
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	if err := b.waitEtcd(); err != nil {
		return err
	}
	b.apiArgs = []string{
		filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=" + b.bindAddress(),
		"--advertise-address=" + b.advertiseAddress(),
		"--secure-port=6443",
		"--cert-dir=" + filepath.Join(b.Dir, "apiserver-certs"),
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--token-auth-file=" + p.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + p.saPub,
		"--service-account-signing-key-file=" + p.saKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-cluster-ip-range=" + b.ServiceCIDRs(),
		"--profiling=false",
	}
	b.apiArgs = append(b.apiArgs, b.opts.APIServerFlags...)
	apisrv, err := b.startProcess(b.Ctl.NS, b.apiArgs)
	if err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	b.setAPIServer(apisrv)
	b.client, err = kubernetes.NewForConfig(b.RESTConfig())
	if err != nil {
		return err
	}
	if _, err := b.waitAPIServer(apisrv, 100*time.Millisecond); err != nil {
		return err
	}
	info, err := b.client.Discovery().ServerVersion()
	if err != nil {
		return fmt.Errorf("kube-apiserver /version: %w", err)
	}
	b.APIServerVersion = info.GitVersion
	if err := b.bindProxyUser(); err != nil {
		return err
	}
	b.AdminKubeconfig = filepath.Join(b.Dir, "admin.kubeconfig")
	b.ProxyKubeconfig = filepath.Join(b.Dir, "proxy.kubeconfig")
	if err := writeKubeconfig(b.AdminKubeconfig, APIServerURL, AdminUser, p.adminToken, p.caPEM); err != nil {
		return err
	}
	return writeKubeconfig(b.ProxyKubeconfig, APIServerURL, ProxyUser, p.proxyToken, p.caPEM)
}

// waitEtcd polls etcd's /health endpoint from inside the control namespace.
func (b *Bed) waitEtcd() error {
	hc := &http.Client{Transport: &http.Transport{DialContext: b.Ctl.DialContext}, Timeout: time.Second}
	defer hc.CloseIdleConnections()
	return poll(etcdTimeout, b.etcd, "etcd", func() error {
		resp, err := hc.Get("http://127.0.0.1:2379/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), `"health":"true"`) {
			return fmt.Errorf("health: %s", body)
		}
		return nil
	})
}

// waitAPIServer polls /readyz every interval until it passes and returns
// when it did. /readyz includes the RBAC bootstrap (ClusterRole
// system:node-proxier exists once it passes).
func (b *Bed) waitAPIServer(p *Process, interval time.Duration) (time.Time, error) {
	rc := b.client.Discovery().RESTClient()
	var ready time.Time
	err := pollEvery(apiserverTimeout, interval, p, "kube-apiserver", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		body, err := rc.Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("%w: %s", err, body)
		}
		ready = time.Now()
		return nil
	})
	return ready, err
}

// restartPoll is how often StartAPIServer asks /readyz: tests measure from
// the moment it passes, so the poll's period bounds their error.
const restartPoll = 20 * time.Millisecond

// StopAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 10 s) and
// leaves etcd and its data running: clients see the API go away as in a
// control plane outage or upgrade. StartAPIServer brings it back.
func (b *Bed) StopAPIServer() {
	b.t.Helper()
	p := b.apiServer()
	select {
	case <-p.Done():
		b.t.Fatalf("StopAPIServer: kube-apiserver is not running (%v)", p.err)
	default:
	}
	p.Stop(10 * time.Second)
}

// StartAPIServer starts kube-apiserver again with the same flags,
// certificates and etcd, waits until /readyz passes (polling every 20 ms)
// and returns when it did. It fails the test if the server is running.
func (b *Bed) StartAPIServer() time.Time {
	b.t.Helper()
	select {
	case <-b.apiServer().Done():
	default:
		b.t.Fatalf("StartAPIServer: kube-apiserver is still running")
	}
	p, err := b.startProcess(b.Ctl.NS, b.apiArgs)
	if err != nil {
		b.t.Fatalf("start kube-apiserver: %v", err)
	}
	b.setAPIServer(p)
	ready, err := b.waitAPIServer(p, restartPoll)
	if err != nil {
		b.t.Fatalf("restart kube-apiserver: %v", err)
	}
	return ready
}

func (b *Bed) apiServer() *Process {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.apisrv
}

func (b *Bed) setAPIServer(p *Process) {
	b.mu.Lock()
	b.apisrv = p
	b.mu.Unlock()
}

// bindProxyUser grants ProxyUser the bootstrap ClusterRole system:node-proxier.
func (b *Bed) bindProxyUser() error {
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ProxyRoleBinding},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ProxyUser}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ClusterRoleBinding %s: %w", ProxyRoleBinding, err)
	}
	return nil
}

// poll calls check every 100 ms until it succeeds, the process exits, or
// timeout passes.
func poll(timeout time.Duration, p *Process, what string, check func() error) error {
	return pollEvery(timeout, 100*time.Millisecond, p, what, check)
}

// pollEvery is poll with another period.
func pollEvery(timeout, interval time.Duration, p *Process, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("%s exited (%v):\n%s", what, p.err, tail(p.Log(), 40))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %v\n%s", what, timeout, err, tail(p.Log(), 40))
		}
		time.Sleep(interval)
	}
}

func killPid(pid int) {
	if pid != os.Getpid() {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
