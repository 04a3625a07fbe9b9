package main

// The processes of the node-level smoke tests (smoke_test.go). They are
// this test binary again, started by the test in a network namespace of
// its own (ip netns exec) with $NFTPROXY_SMOKE_ROLE naming what it is:
// TestMain runs that role instead of the tests. Nothing but the test
// binary, ip, nft and conntrack is needed, so that the same binary, built
// static, runs the tests on the Debian releases' kernels (e2e/nodes).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

const (
	// smokeRoleEnv names the role of a smoke test's process.
	smokeRoleEnv = "NFTPROXY_SMOKE_ROLE"
	// smokePodEnv is the name an endpoint pod's servers answer with.
	smokePodEnv = "NFTPROXY_SMOKE_POD"

	// roleEndpoint serves an endpoint pod's ports (serveEndpoint).
	roleEndpoint = "endpoint"
	// roleProxy is nftproxy with its API client replaced by a fake
	// clientset that holds the objects the test sends (runProxyOnFakeAPI).
	roleProxy = "proxy"
	// roleCommand is nftproxy's command line as shipped: diff, explain.
	roleCommand = "nftproxy"
)

// The ports every endpoint pod serves: each connection or datagram is
// answered with the pod's name and the client's address as the pod saw it.
const (
	endpointTCPPort  = 8080
	endpointUDPPort  = 8053
	endpointSCTPPort = 8132
)

// controlFd is the pipe on which a process tells the test that it is
// ready (an endpoint) or how a change of the API went (the proxy).
const controlFd = 3

func TestMain(m *testing.M) {
	switch role := os.Getenv(smokeRoleEnv); role {
	case "":
		os.Exit(m.Run())
	case roleEndpoint:
		os.Exit(serveEndpoint(os.Getenv(smokePodEnv)))
	case roleProxy:
		os.Exit(runProxyOnFakeAPI(os.Args[1:]))
	case roleCommand:
		os.Exit(runMain(context.Background(), os.Args[1:]))
	default:
		fmt.Fprintf(os.Stderr, "%s=%q: no such role\n", smokeRoleEnv, role)
		os.Exit(2)
	}
}

// serveEndpoint serves TCP, UDP and (when the kernel has SCTP sockets)
// SCTP on the endpoint ports of every address of the namespace, says
// "ready" on the control pipe and serves until standard input closes
// (the test ends, or dies).
func serveEndpoint(pod string) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "endpoint %s: %v\n", pod, err)
		return 1
	}
	tcp, err := net.Listen("tcp", fmt.Sprintf(":%d", endpointTCPPort))
	if err != nil {
		return fail(err)
	}
	udp, err := net.ListenPacket("udp", fmt.Sprintf(":%d", endpointUDPPort))
	if err != nil {
		return fail(err)
	}
	go serveTCP(tcp, pod)
	go serveUDP(udp, pod)
	if ok, _ := sctpSupported(); ok {
		fd, err := listenSCTP(endpointSCTPPort)
		if err != nil {
			return fail(err)
		}
		go serveSCTP(fd, pod)
	}
	if _, err := fmt.Fprintln(os.NewFile(controlFd, "control"), "ready"); err != nil {
		return fail(err)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// answer is what an endpoint says to a client at peer.
func answer(pod string, peer netip.AddrPort) []byte {
	return fmt.Appendf(nil, "%s %s\n", pod, netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port()))
}

func serveTCP(l net.Listener, pod string) {
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintf(os.Stderr, "endpoint %s: tcp: %v\n", pod, err)
			return
		}
		_, _ = c.Write(answer(pod, c.RemoteAddr().(*net.TCPAddr).AddrPort()))
		_ = c.Close()
	}
}

func serveUDP(c net.PacketConn, pod string) {
	buf := make([]byte, 1500)
	for {
		_, from, err := c.ReadFrom(buf)
		if err != nil {
			fmt.Fprintf(os.Stderr, "endpoint %s: udp: %v\n", pod, err)
			return
		}
		_, _ = c.WriteTo(answer(pod, from.(*net.UDPAddr).AddrPort()), from)
	}
}

// sctpSupported says whether this kernel has SCTP sockets, and if not,
// why: this machine's kernel is built without them (its conntrack and
// NAT know SCTP all the same), Debian's load the sctp module.
func sctpSupported() (bool, string) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return false, fmt.Sprintf("socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): %v", err)
	}
	unix.Close(fd)
	return true, ""
}

// listenSCTP opens a one-to-one style SCTP socket listening on port of
// every IPv4 address.
func listenSCTP(port int) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return -1, fmt.Errorf("sctp socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sctp bind :%d: %w", port, err)
	}
	if err := unix.Listen(fd, 64); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sctp listen: %w", err)
	}
	return fd, nil
}

// serveSCTP answers each association on the listening socket fd, then
// shuts it down.
func serveSCTP(fd int, pod string) {
	for {
		c, sa, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.ECONNABORTED) {
			continue
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "endpoint %s: sctp: %v\n", pod, err)
			return
		}
		_, _ = unix.Write(c, answer(pod, sockaddrAddrPort(sa)))
		unix.Close(c)
	}
}

func sockaddrAddrPort(sa unix.Sockaddr) netip.AddrPort {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port))
	}
	return netip.AddrPort{}
}

// runProxyOnFakeAPI runs nftproxy as main does, with args, but with a
// fake API: a client-go fake clientset holding the objects of the first
// JSON array on standard input. Each next array is a change: its objects
// are created or updated in the fake, which its watchers report to the
// proxy as the API server's would, and "ok" (or the error) goes to the
// control pipe. When standard input closes the proxy stops, as on SIGTERM.
func runProxyOnFakeAPI(args []string) int {
	in := json.NewDecoder(os.Stdin)
	var initial []json.RawMessage
	if err := in.Decode(&initial); err != nil {
		fmt.Fprintf(os.Stderr, "smoke proxy: the API's objects on standard input: %v\n", err)
		return 2
	}
	objs, err := decodeObjects(initial)
	if err != nil {
		fmt.Fprintf(os.Stderr, "smoke proxy: %v\n", err)
		return 2
	}
	client := newFakeAPI(objs)
	newProxyClient = func(clientOptions) (kubernetes.Interface, *rest.Config, error) { return client, nil, nil }
	ctx, stop := context.WithCancel(context.Background())
	control := os.NewFile(controlFd, "control")
	go func() {
		defer stop()
		for {
			var change []json.RawMessage
			if err := in.Decode(&change); err != nil {
				return // standard input closed: the test is done with us
			}
			reply := "ok"
			if err := applyObjects(client, change); err != nil {
				reply = "error: " + err.Error()
			}
			fmt.Fprintln(control, reply)
		}
	}()
	return runMain(ctx, args)
}

// decodeObjects decodes API objects from JSON (or YAML) as the API
// server's clients do.
func decodeObjects(raw []json.RawMessage) ([]runtime.Object, error) {
	var objs []runtime.Object
	for _, r := range raw {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(r, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("decode %.80s: %w", r, err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// applyObjects creates or updates each object in the fake API.
func applyObjects(client *fake.Clientset, raw []json.RawMessage) error {
	objs, err := decodeObjects(raw)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		gvks, _, err := scheme.Scheme.ObjectKinds(obj)
		if err != nil {
			return err
		}
		gvr, _ := meta.UnsafeGuessKindToResource(gvks[0])
		m, err := meta.Accessor(obj)
		if err != nil {
			return err
		}
		err = client.Tracker().Update(gvr, obj, m.GetNamespace())
		if apierrors.IsNotFound(err) {
			err = client.Tracker().Create(gvr, obj, m.GetNamespace())
		}
		if err != nil {
			return fmt.Errorf("%s %s/%s: %w", gvks[0].Kind, m.GetNamespace(), m.GetName(), err)
		}
	}
	return nil
}

// newFakeAPI is a fake clientset holding objs that serves ServiceCIDRs
// in discovery and, as the API server does and client-go's fake does not,
// lists and watches Nodes by the field selector metadata.name, which the
// proxy's Node informer asks for.
func newFakeAPI(objs []runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objs...)
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: "networking.k8s.io/v1",
		APIResources: []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}},
	}}
	nodes := v1.SchemeGroupVersion.WithResource("nodes")
	selected := func(sel fields.Selector, n *v1.Node) bool {
		return sel == nil || sel.Matches(fields.Set{"metadata.name": n.Name})
	}
	client.PrependReactor("list", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := client.Tracker().List(nodes, v1.SchemeGroupVersion.WithKind("Node"), "")
		if err != nil {
			return true, nil, err
		}
		list := obj.(*v1.NodeList)
		sel := a.(k8stesting.ListAction).GetListRestrictions().Fields
		list.Items = slices.DeleteFunc(list.Items, func(n v1.Node) bool { return !selected(sel, &n) })
		return true, list, nil
	})
	client.PrependWatchReactor("nodes", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(nodes, "")
		if err != nil {
			return true, nil, err
		}
		sel := a.(k8stesting.WatchAction).GetWatchRestrictions().Fields
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			n, ok := e.Object.(*v1.Node)
			return e, !ok || selected(sel, n)
		}), nil
	})
	return client
}
