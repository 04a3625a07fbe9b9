package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// TestBed is the test bed's self-test: two nodes with a pod each, traffic between the pods
// over TCP, UDP and raw SCTP on both families without NAT, the API server through
// Bed.Client and both kubeconfigs, and no leftovers after cleanup. It runs as root only
// (see RequirePrivileges).
func TestBed(t *testing.T) {
	var prefix string
	t.Run("bed", func(t *testing.T) {
		b := Start(t, Options{})
		prefix = b.Prefix
		probe := ProbePath(t)
		nodeA, nodeB := b.AddNode("node-a"), b.AddNode("node-b")
		podA, podB := nodeA.AddPod("a"), nodeB.AddPod("b")

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv := podB.Start(probe, "serve", "--name", "pod-b", "--port", "8080", "--tcp", "--udp", "--sctp-raw")
		if err := srv.WaitForLog(ctx, "ready"); err != nil {
			t.Fatal(err)
		}
		t.Run("pod to pod", func(t *testing.T) {
			for _, proto := range []string{"tcp", "udp", "sctp"} {
				for _, dst := range []netip.Addr{podB.IPv4, podB.IPv6} {
					src := podA.IPv4
					if dst.Is6() {
						src = podA.IPv6
					}
					addr := netip.AddrPortFrom(dst, 8080).String()
					t.Run(proto+" "+addr, func(t *testing.T) {
						// Several attempts: each uses a new source port and conntrack entry.
						for _, line := range dial(t, podA.Netns, probe, proto, addr, 3) {
							checkReply(t, line, "pod-b", src)
						}
					})
				}
			}
		})
		t.Run("source port", func(t *testing.T) {
			for _, proto := range []string{"tcp", "udp", "sctp"} {
				addr := netip.AddrPortFrom(podB.IPv4, 8080).String()
				out, err := podA.Exec(ctx, probe, "dial", "--proto", proto, "--addr", addr, "--count", "2", "--source-port", "40000")
				if err != nil {
					t.Fatal(err)
				}
				for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
					if want := fmt.Sprintf("pod-b %s:40000", podA.IPv4); line != want {
						t.Errorf("%s: got %q, want %q", proto, line, want)
					}
				}
			}
		})
		t.Run("closed port", func(t *testing.T) {
			for _, proto := range []string{"tcp", "udp"} {
				for _, dst := range []netip.Addr{podB.IPv4, podB.IPv6} {
					addr := netip.AddrPortFrom(dst, 9999).String()
					if got := dial(t, podA.Netns, probe, proto, addr, 1)[0]; got != "refused" {
						t.Errorf("%s %s: got %q, want refused", proto, addr, got)
					}
				}
			}
		})
		t.Run("rejected", func(t *testing.T) {
			// An nft reject on the path (like a proxy's for a Service without endpoints)
			// sends ICMP port unreachable, which every protocol reports as refused.
			if _, err := exec.LookPath("nft"); err != nil {
				t.Skip("needs nft")
			}
			rules := "table inet reject_test { chain forward { type filter hook forward priority 0; meta l4proto { tcp, udp, sctp } th dport 9998 reject; }; }"
			if _, err := nodeB.Exec(ctx, "nft", rules); err != nil {
				t.Fatal(err)
			}
			defer nodeB.Exec(ctx, "nft", "delete table inet reject_test")
			for _, proto := range []string{"tcp", "udp", "sctp"} {
				for _, dst := range []netip.Addr{podB.IPv4, podB.IPv6} {
					addr := netip.AddrPortFrom(dst, 9998).String()
					if got := dial(t, podA.Netns, probe, proto, addr, 1)[0]; got != "refused" {
						t.Errorf("%s %s: got %q, want refused", proto, addr, got)
					}
				}
			}
		})
		t.Run("node to pod", func(t *testing.T) {
			for _, dst := range []netip.Addr{podB.IPv4, podB.IPv6} {
				src := nodeA.IPv4
				if dst.Is6() {
					src = nodeA.IPv6
				}
				line := dial(t, nodeA.Netns, probe, "tcp", netip.AddrPortFrom(dst, 8080).String(), 1)[0]
				checkReply(t, line, "pod-b", src)
			}
		})
		t.Run("api", func(t *testing.T) { testAPI(t, b, podB) })
	})
	if prefix != "" {
		checkNoLeftovers(t, prefix)
	}
}

// dial runs `probe dial` in ns and returns its lines.
func dial(t *testing.T, ns Netns, probe, proto, addr string, count int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := ns.Exec(ctx, probe, "dial", "--proto", proto, "--addr", addr, "--timeout", "2s", "--count", fmt.Sprint(count))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != count {
		t.Fatalf("dial %s %s: want %d lines, got %q", proto, addr, count, out)
	}
	return lines
}

// checkReply checks a "NAME PEER" line: the right server answered and saw the client's
// own address (no NAT between pods).
func checkReply(t *testing.T, line, wantName string, wantPeer netip.Addr) {
	t.Helper()
	name, peer, ok := strings.Cut(line, " ")
	if !ok || name != wantName {
		t.Errorf("reply %q: want name %s", line, wantName)
		return
	}
	ap, err := netip.ParseAddrPort(peer)
	if err != nil || ap.Addr() != wantPeer {
		t.Errorf("reply %q: server saw %s, want %s", line, peer, wantPeer)
	}
}

func testAPI(t *testing.T, b *Bed, backend *Pod) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := b.Client()

	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 2 {
		t.Fatalf("want 2 Nodes, got %d", len(nodes.Items))
	}
	for _, n := range nodes.Items {
		if len(n.Spec.PodCIDRs) != 2 || len(n.Status.Addresses) != 3 {
			t.Errorf("Node %s: podCIDRs %v, addresses %v", n.Name, n.Spec.PodCIDRs, n.Status.Addresses)
		}
	}

	dualStack := corev1.IPFamilyPolicyRequireDualStack
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: &dualStack,
			Ports:          []corev1.ServicePort{{Name: "tcp", Port: 80, Protocol: corev1.ProtocolTCP}},
		},
	}
	svc, err = c.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(svc.Spec.ClusterIPs) != 2 {
		t.Fatalf("want a dual-stack Service, got ClusterIPs %v", svc.Spec.ClusterIPs)
	}
	for _, ip := range svc.Spec.ClusterIPs {
		a := netip.MustParseAddr(ip)
		if !netip.MustParsePrefix("10.96.0.0/12").Contains(a) && !netip.MustParsePrefix("fd00:96::/108").Contains(a) {
			t.Errorf("ClusterIP %s outside %s", ip, ServiceCIDRs)
		}
	}
	port, proto, ready := int32(8080), corev1.ProtocolTCP, true
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      "echo-v4",
			Namespace: "default",
			Labels:    map[string]string{discoveryv1.LabelServiceName: "echo"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{backend.IPv4.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			NodeName:   &backend.Node.Name,
		}},
		Ports: []discoveryv1.EndpointPort{{Name: new("tcp"), Port: &port, Protocol: &proto}},
	}
	if _, err := c.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The proxy user reads what a proxy needs and may not write Services.
	proxy, err := kubernetes.NewForConfig(b.ProxyRESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	slices, err := proxy.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=echo"})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) != 1 || slices.Items[0].Endpoints[0].Addresses[0] != backend.IPv4.String() {
		t.Errorf("EndpointSlices read back: %+v", slices.Items)
	}
	// system:node-proxier may list and watch Services, but not get them.
	if _, err := proxy.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Error(err)
	}
	if _, err := proxy.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
	_, err = proxy.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 1}}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("proxy user creating a Service: got %v, want Forbidden", err)
	}

	// The kubeconfig files work (TLS verified against the bed's CA).
	for _, path := range []string{b.AdminKubeconfig, b.ProxyKubeconfig} {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Dial = b.Ctl.DialContext
		kc, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kc.CoreV1().Services("default").List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("%s: %v", filepath.Base(path), err)
		}
	}
}

// checkNoLeftovers checks that a cleaned-up bed left no namespace, process or owner file.
func checkNoLeftovers(t *testing.T, prefix string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, prefix+"-") {
			t.Errorf("namespace left behind: %s", line)
		}
	}
	for _, p := range markedProcesses() {
		if p.prefix == prefix {
			t.Errorf("process left behind: %d", p.pid)
		}
	}
	if _, err := os.Stat(filepath.Join(ownerDir, prefix)); err == nil {
		t.Errorf("owner file left behind")
	}
}

// TestSweep checks that Sweep removes a dead owner's namespace and processes and leaves a
// live owner's alone.
func TestSweep(t *testing.T) {
	RequirePrivileges(t)
	dead, live := newPrefix(), newPrefix()
	for _, prefix := range []string{dead, live} {
		ns := prefix + "-x"
		if err := addNetns(ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteNetns(ns) })
	}
	// live: owned by this process. dead: an owner file naming a PID that has exited.
	if err := writeOwner(live); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(ownerDir, live)) })
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ownerDir, dead), fmt.Appendf(nil, "%d 1\n", exited.Process.Pid), 0o644); err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("ip", "netns", "exec", dead+"-x", "sleep", "600")
	sleeper.Env = append(os.Environ(), bedEnv+"="+dead)
	sleeper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()

	removed, err := Sweep(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removed: %v", removed)
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		sleeper.Process.Kill()
		t.Error("Sweep did not kill the dead bed's process")
	}
	if _, err := os.Stat(filepath.Join(netnsDir, dead+"-x")); err == nil {
		t.Error("Sweep left the dead bed's namespace")
	}
	if _, err := os.Stat(filepath.Join(netnsDir, live+"-x")); err != nil {
		t.Error("Sweep removed the live bed's namespace")
	}
}

// TestAPIServerRestart: StopAPIServer takes the API away and keeps etcd;
// StartAPIServer brings it back with the same data and credentials, ready;
// cleanup leaves nothing of either server, also when the test ends with
// the API server stopped.
func TestAPIServerRestart(t *testing.T) {
	var prefix string
	t.Run("bed", func(t *testing.T) {
		b := Start(t, Options{})
		prefix = b.Prefix
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"},
			Data: map[string]string{"k": "v"}}
		if _, err := b.Client().CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		first := b.apiServer()
		b.StopAPIServer()
		if _, err := b.Client().CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{}); err == nil {
			t.Fatal("the API answers after StopAPIServer")
		}
		before := time.Now()
		ready := b.StartAPIServer()
		if ready.Before(before) || time.Since(ready) > time.Second {
			t.Errorf("StartAPIServer returned %v after it was called, ready %v before it returned",
				ready.Sub(before), time.Since(ready))
		}
		if b.apiServer() == first || b.ControlPlanePIDs()[0] == first.Pid() {
			t.Error("the bed still names the stopped kube-apiserver")
		}
		// Same etcd data, same certificates and tokens (admin and proxy user).
		got, err := b.Client().CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{})
		if err != nil || got.Data["k"] != "v" {
			t.Fatalf("after the restart: %v, %v", got, err)
		}
		proxy, err := kubernetes.NewForConfig(b.ProxyRESTConfig())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := proxy.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("proxy user after the restart: %v", err)
		}
		b.StopAPIServer() // cleanup with the API server down
	})
	if prefix != "" {
		checkNoLeftovers(t, prefix)
	}
}
