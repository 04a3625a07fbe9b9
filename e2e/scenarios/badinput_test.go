package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// TestBadInputFromEtcd: Services and EndpointSlices the API server would
// refuse, written straight into etcd (which skips its validation) and
// served by the API server like any other, are skipped part by part. Each
// problem is logged once and counted once in
// nftproxy_invalid_objects_total. Nothing from them reaches the kernel's
// table, and the Services beside them answer. (That such names cannot
// change what `nft list` prints even when they reach the ruleset builder:
// ruleset.TestKernelListsHostileNames.)
func TestBadInputFromEtcd(t *testing.T) {
	c := newCluster(t)
	a := c.backend(0, "a")
	client := c.nodes[0].AddPod("client")
	ips := c.service("web", 80, false, v1.ProtocolTCP)
	c.endpoints("web", backendPort, a)
	c.eventually(client.Netns, "tcp", vip(ips, 80), 3, "a", onlyFrom("a"))

	slice := func(name, svc string, addrs ...string) *discovery.EndpointSlice {
		pname, proto, port := "tcp", v1.ProtocolTCP, int32(backendPort)
		es := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discovery.LabelServiceName: svc}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: &pname, Protocol: &proto, Port: &port}},
		}
		for _, addr := range addrs {
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr}})
		}
		return es
	}
	tcp := func(name string, port int32) v1.ServicePort {
		return v1.ServicePort{Name: name, Port: port, Protocol: v1.ProtocolTCP}
	}
	hostile := "evil\"}\n\tchain x {"
	stored := []testbed.StoredService{
		{Name: hostile, Ports: []v1.ServicePort{tcp("tcp", 80)}, Slice: slice("evil-1", hostile, a.IPv4.String())},
		{Name: "wéb", Ports: []v1.ServicePort{tcp("tcp", 80)}, Slice: slice("web-x", "wéb", a.IPv4.String())},
		{Name: "ports", Ports: []v1.ServicePort{tcp("tcp", 80), tcp("ñ", 81), tcp("zero", 0)},
			Slice: slice("ports-1", "ports", a.IPv4.String(), "fd00::1", "999.1.1.1")},
	}
	storedIPs, err := c.bed.Store(c.ns, stored)
	if err != nil {
		t.Fatal(err)
	}
	c.eventually(client.Netns, "tcp", netip.AddrPortFrom(storedIPs[2], 80), 3, "a", onlyFrom("a"))
	for _, ip := range storedIPs[:2] { // not programmed: unallocated
		c.eventually(client.Netns, "tcp", netip.AddrPortFrom(ip, 80), 1, "timeout", all("timeout"))
	}
	c.eventually(client.Netns, "tcp", vip(ips, 80), 3, "a", onlyFrom("a"))

	want := map[string]float64{
		`kind="Service",reason="invalid-name"`:          2,
		`kind="EndpointSlice",reason="invalid-name"`:    2,
		`kind="Service",reason="invalid-port-name"`:     1,
		`kind="Service",reason="invalid-port"`:          1,
		`kind="EndpointSlice",reason="invalid-address"`: 2,
	}
	n1 := c.nodes[0]
	got := invalidObjects(t, n1)
	for series, n := range want {
		if got[series] != n {
			t.Errorf("nftproxy_invalid_objects_total{%s} = %v, want %v (all: %v)", series, got[series], n, got)
		}
	}
	for series, n := range got { // every other series is served, at 0
		if _, ok := want[series]; !ok && n != 0 {
			t.Errorf("nftproxy_invalid_objects_total{%s} = %v, want 0", series, n)
		}
	}
	var total float64
	for _, n := range want {
		total += n
	}
	if lines := strings.Count(c.proxy["n1"].Log(), "Skipping invalid part of object"); float64(lines) != total {
		t.Errorf("%d log lines about invalid objects, want %v", lines, total)
	}
	table := c.ruleset(n1)
	for _, s := range []string{"evil", "é", "ñ", "999.1.1.1", storedIPs[0].String() + " ", storedIPs[1].String() + " "} {
		if strings.Contains(table, s) {
			t.Errorf("the table holds %q:\n%s", s, table)
		}
	}
}

// invalidObjects reads the series of nftproxy_invalid_objects_total from
// the metrics of nftproxy on n, by their labels.
func invalidObjects(t *testing.T, n *testbed.Node) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, err := n.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, l := range strings.Split(body, "\n") {
		labels, ok := strings.CutPrefix(l, "nftproxy_invalid_objects_total{")
		if !ok {
			continue
		}
		end := strings.Index(labels, "}")
		v, err := strconv.ParseFloat(strings.TrimSpace(labels[end+1:]), 64)
		if err != nil {
			t.Fatal(fmt.Errorf("metric line %q: %w", l, err))
		}
		out[labels[:end]] = v
	}
	return out
}
