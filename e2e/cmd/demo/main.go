// Command demo shows nftproxy at work on a local test bed: a real
// kube-apiserver and etcd, one node and three pods as network namespaces,
// nftproxy programming the node's kernel, and connections through a
// ClusterIP answered by both backends. It removes everything it created when
// it ends, also on Ctrl-C. Run it as root: `make demo`.
package main

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

func main() { os.Exit(testbed.Main(run)) }

func run(tb testbed.TB) {
	step("Building nftproxy and the probe; starting etcd and kube-apiserver in a control namespace")
	nftproxy := testbed.GoBuild(tb, "github.com/nftproxy/nftproxy/cmd/nftproxy")
	probe := testbed.ProbePath(tb)
	bed := testbed.Start(tb, testbed.Options{})
	client := bed.Client()
	ctx := context.Background()

	step("Adding node1 with backend pods web-a and web-b and a client pod")
	node := bed.AddNode("node1")
	var backends []*testbed.Pod
	for _, name := range []string{"web-a", "web-b"} {
		p := node.AddPod(name)
		srv := p.Start(probe, "serve", "--name", name, "--port", "8080", "--tcp")
		must(tb, srv.WaitForLog(ctx, "ready"))
		backends = append(backends, p)
	}
	clientPod := node.AddPod("client")

	step("Starting nftproxy on node1")
	proxy := node.Start(nftproxy, "--kubeconfig", bed.ProxyKubeconfig, "--hostname-override", node.Name,
		"--cluster-cidr", "10.244.0.0/16", "--v", "2")
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	must(tb, proxy.WaitForLog(waitCtx, "Synced"))

	step("Creating Service default/web (port 80) with an EndpointSlice: web-a and web-b on port 8080")
	svc, err := client.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	must(tb, err)
	name, port, proto := "http", int32(8080), v1.ProtocolTCP
	es := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discovery.LabelServiceName: "web"}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for _, p := range backends {
		addr, nodeName := p.IPv4.String(), node.Name
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}, NodeName: &nodeName})
	}
	_, err = client.DiscoveryV1().EndpointSlices("default").Create(ctx, es, metav1.CreateOptions{})
	must(tb, err)
	vip := svc.Spec.ClusterIP + ":80"
	fmt.Printf("  ClusterIP %s\n", vip)

	step("Connecting 10 times from the client pod to " + vip)
	var lines []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := clientPod.Exec(ctx, probe, "dial", "--proto", "tcp", "--addr", vip, "--count", "10")
		must(tb, err)
		lines = strings.Split(strings.TrimSpace(out), "\n")
		if answered(lines) == 10 && len(byBackend(lines)) == 2 {
			break
		}
	}
	for _, l := range lines {
		fmt.Println("  " + l)
	}
	counts := byBackend(lines)
	fmt.Printf("  answers per backend: %v\n", counts)

	step("What nftproxy wrote: nft list table ip nftproxy (on node1)")
	out, err := node.Exec(ctx, "nft", "list", "table", "ip", "nftproxy")
	must(tb, err)
	fmt.Print(out)

	step("What nftproxy would program, from the API alone: nftproxy dump --ip-families ipv4 (on node1)")
	out, err = node.Exec(ctx, nftproxy, "dump", "--kubeconfig", bed.ProxyKubeconfig, "--hostname-override", node.Name,
		"--cluster-cidr", "10.244.0.0/16", "--ip-families", "ipv4")
	must(tb, err)
	fmt.Print(out)

	step("The kernel's table against what nftproxy would program now: nftproxy diff --ip-families ipv4 (on node1)")
	// Exit status 0 and no output: the same, while the proxy owns the table.
	out, err = node.Exec(ctx, nftproxy, "diff", "--kubeconfig", bed.ProxyKubeconfig, "--hostname-override", node.Name,
		"--cluster-cidr", "10.244.0.0/16", "--ip-families", "ipv4")
	must(tb, err)
	fmt.Printf("%s  exit status 0: no differences\n", out)

	step("Where a connection from the client pod to " + vip + " goes: nftproxy explain --from " + clientPod.IPv4.String() + " " + vip + " (on node1)")
	out, err = node.Exec(ctx, nftproxy, "explain", "--from", clientPod.IPv4.String(), vip)
	must(tb, err)
	fmt.Print(out)

	step("Sync metrics from http://127.0.0.1:10249/metrics (on node1)")
	printMetrics(tb, node)

	if len(counts) != 2 {
		tb.Fatalf("want answers from both backends, got %v", counts)
	}
	step("Done: both backends answered through the ClusterIP. Cleaning up.")
}

func answered(lines []string) int {
	n := 0
	for _, c := range byBackend(lines) {
		n += c
	}
	return n
}

func byBackend(lines []string) map[string]int {
	out := map[string]int{}
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 2 && strings.HasPrefix(f[0], "web-") {
			out[f[0]]++
		}
	}
	return out
}

func printMetrics(tb testbed.TB, node *testbed.Node) {
	body, err := node.HTTPGet(context.Background(), "http://127.0.0.1:10249/metrics")
	must(tb, err)
	var keep []string
	for _, l := range strings.Split(body, "\n") {
		for _, prefix := range []string{
			"kubeproxy_sync_proxy_rules_duration_seconds_count", "kubeproxy_sync_proxy_rules_duration_seconds_sum",
			"kubeproxy_sync_full_proxy_rules_duration_seconds_sum", "kubeproxy_sync_partial_proxy_rules_duration_seconds_sum",
			"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "kubeproxy_sync_proxy_rules_endpoint_changes_total",
			"kubeproxy_sync_proxy_rules_service_changes_total", "nftproxy_sync_kernel_operations_sum", "nftproxy_syncs_total",
		} {
			if strings.HasPrefix(l, prefix) {
				keep = append(keep, l)
			}
		}
	}
	sort.Strings(keep)
	for _, l := range keep {
		fmt.Println("  " + l)
	}
}

func step(s string) { fmt.Printf("\n==> %s\n", s) }

func must(tb testbed.TB, err error) {
	if err != nil {
		tb.Fatal(err)
	}
}
