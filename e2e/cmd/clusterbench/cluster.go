package main

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/e2e/testbed"
	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// The cluster's namespaces, Services and addresses.
const (
	staticNS = "static" // the selector-less Services
	churnNS  = "churn"  // the Deployments and their Services
	markerNS = "marker"
	// markerSvc is the marker Service: port "data" (80) reaches marker pod
	// a or b, port "marker" (81) carries the marker value as the target
	// port of its EndpointSlice (markerBase + value).
	markerSvc  = "marker"
	markerIP   = "10.96.0.250"
	markerPort = 81
	markerBase = 20000
	// backendPort is where the marker pods' probe servers listen, and the
	// target port of every Service.
	backendPort = 8080
	// hostNode is the bed node whose namespace runs the hollow watchers.
	hostNode = "hollow-host"
)

// cluster is the bed and what runs on it for every column.
type cluster struct {
	tb     testbed.TB
	cfg    config
	bed    *testbed.Bed
	client kubernetes.Interface // admin, for the bench's own writes
	bins   binaries
	real   []*testbed.Node // the real nodes, r1…
	host   *testbed.Node   // the hollow watchers' namespace
	// markerPods answer through the marker's port "data": the value's
	// parity picks one, so that a real node shows by traffic which value
	// its rules hold.
	markerPods [2]*testbed.Pod
	marker     int // the marker's current value
	hollow     []string
	// The control loops: kube-controller-manager and the fake kubelet,
	// started afresh with each start of the API server (stopControlLoops,
	// startControlLoops), so that no column starts with their reflectors
	// still backing off from the previous column's outages.
	kcm     *testbed.Process
	kubelet *fakeKubelet
}

// binaries are the programs the columns run.
type binaries struct {
	nftproxy, hollow, probe                       string
	kubeProxy, hollowProxy, kubeControllerManager string
}

// hollowName is hollow node i's name.
func hollowName(i int) string { return fmt.Sprintf("hollow-%d", i) }

// hollowPodCIDR is hollow node i's pod CIDR: 10.160.0.0/11 in /24s, away
// from the real nodes' (10.244.0.0/16) and the static endpoints'
// (10.128.0.0/11). No packet is ever sent to them.
func hollowPodCIDR(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 160+i/256, i%256))
}

// hollowIP is hollow node i's InternalIP, in 10.192.0.0/11 (never sent a
// packet either). A kubelet reports its Node's addresses, and kube-proxy's
// NodeManager waits for them before its proxy starts.
func hollowIP(i int) string { return fmt.Sprintf("10.%d.%d.1", 192+i/256, i%256) }

// newCluster starts the bed, the controller-manager and the fake kubelet,
// and creates every object the columns share.
func newCluster(tb testbed.TB, c config) *cluster {
	cl := &cluster{tb: tb, cfg: c}
	cl.bins = buildBinaries(tb)
	cl.bed = testbed.Start(tb, testbed.Options{})
	cfg := cl.bed.RESTConfig()
	cfg.UserAgent = "clusterbench"
	var err error
	if cl.client, err = kubernetes.NewForConfig(cfg); err != nil {
		tb.Fatal(err)
	}
	for _, ns := range []string{staticNS, churnNS, markerNS} {
		if _, err := cl.client.CoreV1().Namespaces().Create(context.Background(),
			&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
	for i := 1; i <= c.Real; i++ {
		cl.real = append(cl.real, cl.bed.AddNode(fmt.Sprintf("r%d", i)))
	}
	cl.host = cl.bed.AddNode(hostNode)
	for i, name := range []string{"marker-a", "marker-b"} {
		cl.markerPods[i] = cl.real[0].AddPod(name)
		cl.markerPods[i].Start(cl.bins.probe, "serve", "--name", name, "--port", fmt.Sprint(backendPort), "--tcp")
	}
	cl.createHollowNodes()
	cl.storeStatic()
	cl.createMarker()
	cl.startControlLoops()
	cl.createDeployments()
	return cl
}

// startControlLoops starts kube-controller-manager and the fake kubelet.
func (cl *cluster) startControlLoops() {
	cl.startControllers()
	cl.kubelet = startFakeKubelet(cl.tb, cl.bed.RESTConfig(), cl.nodeNames(), cl.podCIDRs())
}

// stopControlLoops stops them.
func (cl *cluster) stopControlLoops() {
	cl.kubelet.stop()
	cl.kcm.Stop(10 * time.Second)
}

// buildBinaries builds (or finds up to date) every program the columns run.
func buildBinaries(tb testbed.TB) binaries {
	dir := testbed.EnsureBinaries(tb)
	testbed.RunBuild(tb, "--cluster")
	return binaries{
		nftproxy:              testbed.GoBuild(tb, "github.com/nftproxy/nftproxy/cmd/nftproxy"),
		hollow:                testbed.GoBuild(tb, "github.com/nftproxy/nftproxy/e2e/cmd/hollow"),
		probe:                 testbed.ProbePath(tb),
		kubeProxy:             filepath.Join(dir, "kube-proxy"),
		hollowProxy:           filepath.Join(dir, "hollowproxy"),
		kubeControllerManager: filepath.Join(kubebin.Dir(kubebin.Pinned().Kubernetes), "kube-controller-manager"),
	}
}

// nodeNames are the nodes the fake kubelet places pods on: every hollow
// node and every real one.
func (cl *cluster) nodeNames() []string {
	names := append([]string(nil), cl.hollow...)
	for _, n := range cl.real {
		names = append(names, n.Name)
	}
	return names
}

// podCIDRs are the nodes' IPv4 pod CIDRs.
func (cl *cluster) podCIDRs() map[string]netip.Prefix {
	out := map[string]netip.Prefix{}
	for i, name := range cl.hollow {
		out[name] = hollowPodCIDR(i)
	}
	for _, n := range cl.real {
		out[n.Name] = n.PodCIDRs[0]
	}
	return out
}

// createHollowNodes registers a Node object per hollow node, ready, as a
// hollow kubelet would (no heartbeats follow: the controller-manager runs
// no node lifecycle controller).
func (cl *cluster) createHollowNodes() {
	ctx := context.Background()
	for i := range cl.cfg.Hollow {
		name := hollowName(i)
		cidr := hollowPodCIDR(i).String()
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
			Spec: v1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}
		created, err := cl.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			cl.tb.Fatalf("create Node %s: %v", name, err)
		}
		created.Status = v1.NodeStatus{
			Capacity:  v1.ResourceList{v1.ResourcePods: resource.MustParse("110")},
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: hollowIP(i)}},
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "Hollow",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}},
		}
		if _, err := cl.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			cl.tb.Fatalf("Node %s status: %v", name, err)
		}
		cl.hollow = append(cl.hollow, name)
	}
}

// storeStatic writes the static Services into etcd: selector-less, port
// 80, each with an EndpointSlice of --endpoints addresses in 10.128.0.0/11
// (never sent traffic).
func (cl *cluster) storeStatic() {
	svcs := make([]testbed.StoredService, cl.cfg.Services)
	for i := range svcs {
		name := fmt.Sprintf("svc-%d", i)
		pname, proto, port := "http", v1.ProtocolTCP, int32(backendPort)
		es := &discovery.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discovery.LabelServiceName: name}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: &pname, Protocol: &proto, Port: &port}},
		}
		ready := true
		for e := range cl.cfg.Endpoints {
			k := uint32(i*cl.cfg.Endpoints + e + 1)
			addr := netip.AddrFrom4([4]byte{10, 128 + byte(k>>16&0x1f), byte(k >> 8), byte(k)})
			es.Endpoints = append(es.Endpoints, discovery.Endpoint{Addresses: []string{addr.String()},
				Conditions: discovery.EndpointConditions{Ready: &ready}})
		}
		svcs[i] = testbed.StoredService{Name: name,
			Ports: []v1.ServicePort{{Name: pname, Port: 80, Protocol: proto, TargetPort: intstr.FromInt32(backendPort)}}, Slice: es}
	}
	if _, err := cl.bed.Store(staticNS, svcs); err != nil {
		cl.tb.Fatal(err)
	}
	if err := cl.bed.WaitRepaired(5 * time.Minute); err != nil {
		cl.tb.Fatal(err)
	}
}

// createMarker creates the marker Service and its EndpointSlice at value 0.
func (cl *cluster) createMarker() {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: markerSvc, Namespace: markerNS},
		Spec: v1.ServiceSpec{ClusterIP: markerIP, Ports: []v1.ServicePort{
			{Name: "data", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(backendPort)},
			{Name: "marker", Port: markerPort, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(markerBase)},
		}}}
	if _, err := cl.client.CoreV1().Services(markerNS).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		cl.tb.Fatal(err)
	}
	if err := cl.writeMarker(0); err != nil {
		cl.tb.Fatal(err)
	}
}

// writeMarker sets the marker to value k: its EndpointSlice's endpoint is
// marker pod k%2, its port "marker" markerBase+k.
func (cl *cluster) writeMarker(k int) error {
	pod := cl.markerPods[k%2]
	data, marker, proto := "data", "marker", v1.ProtocolTCP
	dport, mport := int32(backendPort), int32(markerBase+k)
	ready, node := true, pod.Node.Name
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: markerSvc + "-1", Namespace: markerNS,
			Labels:      map[string]string{discovery.LabelServiceName: markerSvc},
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &data, Protocol: &proto, Port: &dport}, {Name: &marker, Protocol: &proto, Port: &mport}},
		Endpoints: []discovery.Endpoint{{Addresses: []string{pod.IPv4.String()}, NodeName: &node,
			Conditions: discovery.EndpointConditions{Ready: &ready}}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slices := cl.client.DiscoveryV1().EndpointSlices(markerNS)
	old, err := slices.Get(ctx, es.Name, metav1.GetOptions{})
	if err == nil {
		es.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(ctx, es, metav1.UpdateOptions{})
	} else {
		_, err = slices.Create(ctx, es, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("marker %d: %w", k, err)
	}
	cl.marker = k
	return nil
}

// startControllers runs kube-controller-manager in the control namespace
// with the controllers a Deployment's endpoints need: Deployments,
// ReplicaSets, EndpointSlices (which write the trigger times), and the
// ServiceAccount controller (pods need their namespace's default
// ServiceAccount). No node lifecycle controller: the hollow nodes send no
// heartbeats. Its API QPS is raised so that it keeps up with the churn.
func (cl *cluster) startControllers() {
	cl.kcm = cl.bed.Ctl.Start(cl.bins.kubeControllerManager,
		"--kubeconfig="+cl.bed.AdminKubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--controllers=deployment,replicaset,endpointslice,serviceaccount",
		"--kube-api-qps=200", "--kube-api-burst=400",
	)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		if _, err := cl.client.CoreV1().ServiceAccounts(churnNS).Get(ctx, "default", metav1.GetOptions{}); err == nil {
			return
		}
		select {
		case <-ctx.Done():
			cl.tb.Fatal("kube-controller-manager made no default ServiceAccount in a minute")
		case <-time.After(200 * time.Millisecond):
		}
	}
}
