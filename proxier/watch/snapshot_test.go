package watch

import (
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/proxier/model"
)

// TestDecode: a YAML stream of single objects and Lists, JSON, empty
// documents and objects of other kinds (known or not) decode into the
// objects nftproxy reads; the others are counted; broken input names its
// document.
func TestDecode(t *testing.T) {
	input := `---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {namespace: ns, name: a}
  spec: {clusterIP: 10.96.0.1, clusterIPs: [10.96.0.1], ports: [{port: 80}]}
- apiVersion: v1
  kind: Pod
  metadata: {namespace: ns, name: p}
- apiVersion: example.org/v1
  kind: Widget
  metadata: {name: w}
---
---
{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"namespace": "ns", "name": "a-1", "labels": {"kubernetes.io/service-name": "a"}}, "addressType": "IPv4", "endpoints": []}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/16]}
`
	var objs Objects
	skipped, err := Decode(strings.NewReader(input), &objs)
	if err != nil {
		t.Fatal(err)
	}
	if skipped != 2 || len(objs.Services) != 1 || len(objs.Slices) != 1 || len(objs.Nodes) != 1 || len(objs.ServiceCIDRs) != 1 {
		t.Errorf("decoded %d Services, %d EndpointSlices, %d Nodes, %d ServiceCIDRs, skipped %d; want 1 each, 2 skipped",
			len(objs.Services), len(objs.Slices), len(objs.Nodes), len(objs.ServiceCIDRs), skipped)
	}
	for _, bad := range []string{"apiVersion: v1\nkind: Service\nspec: [\n", "---\nkind: Service\nmetadata: {name: a}\n"} {
		if _, err := Decode(strings.NewReader(bad), &Objects{}); err == nil || !strings.Contains(err.Error(), "document 1") {
			t.Errorf("Decode(%q): %v, want an error naming document 1", bad, err)
		}
	}
}

// TestNewSnapshot: the informers' label selector applies to Services and
// EndpointSlices, an object given twice counts as the last one given, the
// Node is the one named, and the ServiceCIDRs' ranges are sorted.
func TestNewSnapshot(t *testing.T) {
	input := `apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Service, metadata: {namespace: ns, name: a}, spec: {clusterIP: 10.96.0.1, clusterIPs: [10.96.0.1], ports: [{port: 80}]}}
- {apiVersion: v1, kind: Service, metadata: {namespace: ns, name: a}, spec: {clusterIP: 10.96.0.2, clusterIPs: [10.96.0.2], ports: [{port: 80}]}}
- {apiVersion: v1, kind: Service, metadata: {namespace: ns, name: b, labels: {service.kubernetes.io/service-proxy-name: other}}, spec: {clusterIP: 10.96.0.3, clusterIPs: [10.96.0.3], ports: [{port: 80}]}}
- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {namespace: ns, name: a-1, labels: {kubernetes.io/service-name: a}}, addressType: IPv4, endpoints: []}
- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {namespace: ns, name: b-1, labels: {kubernetes.io/service-name: b, service.kubernetes.io/headless: ""}}, addressType: IPv4, endpoints: []}
- {apiVersion: v1, kind: Node, metadata: {name: n1}, status: {addresses: [{type: InternalIP, address: 10.10.0.1}]}}
- {apiVersion: v1, kind: Node, metadata: {name: n2}, status: {addresses: [{type: InternalIP, address: 10.10.0.2}]}}
- {apiVersion: networking.k8s.io/v1, kind: ServiceCIDR, metadata: {name: b}, spec: {cidrs: [fd00::/112, 10.97.0.0/16]}}
- {apiVersion: networking.k8s.io/v1, kind: ServiceCIDR, metadata: {name: a}, spec: {cidrs: [10.96.0.0/16, not-a-cidr]}}
`
	var objs Objects
	if _, err := Decode(strings.NewReader(input), &objs); err != nil {
		t.Fatal(err)
	}
	s, problems := NewSnapshot("n2", objs)
	a := s.Services[model.ServiceName{Namespace: "ns", Name: "a"}]
	if len(s.Services) != 1 || a == nil || a.ClusterIPs[0].String() != "10.96.0.2" {
		t.Errorf("Services %v, want ns/a with ClusterIP 10.96.0.2 only", s.Services)
	}
	if len(s.Slices) != 1 || s.Slices[model.SliceKey{Namespace: "ns", Name: "a-1"}] == nil {
		t.Errorf("EndpointSlices %v, want ns/a-1 only", s.Slices)
	}
	if s.Node.Name != "n2" || len(s.Node.Addresses) != 1 || s.Node.Addresses[0].String() != "10.10.0.2" {
		t.Errorf("Node %+v, want n2 at 10.10.0.2", s.Node)
	}
	if got := fmtPrefixes(s); got != "10.96.0.0/16 10.97.0.0/16 fd00::/112" {
		t.Errorf("ServiceCIDRs %s", got)
	}
	if len(problems) != 1 || problems[0].Reason != "invalid-cidr" {
		t.Errorf("problems %v, want the invalid CIDR", problems)
	}
}

func fmtPrefixes(s Snapshot) string {
	var out []string
	for _, p := range s.ServiceCIDRs {
		out = append(out, p.String())
	}
	return strings.Join(out, " ")
}
