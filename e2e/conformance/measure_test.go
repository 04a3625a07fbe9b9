package conformance_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/conformance"
)

// The disruption measurement (issue 34, item 5): a client pod on node1
// opens loadRate new connections a second to a Service whose endpoints are
// pods on both nodes and holds loadHold long-lived ones, for loadWindow,
// while one disruption of the proxy happens in it.
const (
	loadRate    = 100
	loadHold    = 20
	loadWindow  = 60 * time.Second
	loadLead    = 5 * time.Second // steady load before the disruption starts
	probeImage  = "docker.io/nftproxy-e2e/probe:1"
	disruptNS   = "disruption"
	backendPort = 8080
)

// disruption is one case: prepare runs before the load starts (outside the
// measurement), disrupt inside it and returns once the proxy is back.
type disruption struct {
	name             string
	prepare, disrupt func()
}

// disruptionResult is one case's outcome.
type disruptionResult struct {
	name    string
	load    conformance.LoadSummary
	took    time.Duration // from the disruption's start until the proxy was back
	outside bool          // the disruption did not end within the load's window
}

// measureDisruption runs the disruption cases against this cluster's proxy
// and writes their results to bin/conformance/disruption-PROXY.md. A failed
// connection or a broken long-lived one is an error of the test: the goal
// is none.
func (c *cluster) measureDisruption(cfg config, images map[string]image, set conformance.Set) {
	t := c.t
	t.Helper()
	clusterIP := c.deployBackends()
	cases := []disruption{
		{name: "`kubectl -n kube-system rollout restart daemonset " + c.daemonSet + "`", disrupt: func() {
			c.kubectl("--namespace", "kube-system", "rollout", "restart", "daemonset", c.daemonSet)
			c.waitRollout()
		}},
	}
	switch {
	case c.proxy != proxyNftproxy || cfg.prevImage == "":
	case set.ProxyConfig() != nil:
		// The previous release may not read what the set configures (the
		// localhost NodePort set's gate and keyword are newer than it):
		// its pod would never start, which says nothing of an upgrade.
		t.Logf("disruption upgrade: not measured after the set %s, whose proxy configuration the previous release may not read", set)
	default:
		prev, cur := versionTag(t, cfg.prevImage), versionTag(t, cfg.image)
		cases = append(cases, disruption{
			name:    fmt.Sprintf("upgrade: image nftproxy:%s → nftproxy:%s (`kubectl set image`)", prev, cur),
			prepare: func() { c.setImage("nftproxy:" + prev) },
			disrupt: func() { c.setImage("nftproxy:" + cur) },
		})
	}
	cases = append(cases,
		disruption{name: "`kubectl delete pod` of node1's " + c.daemonSet + " pod", disrupt: func() { c.deleteDaemonPod("node1") }},
		disruption{name: "node1's kubelet restarted", disrupt: func() {
			if err := c.nodes[0].RestartKubelet(); err != nil {
				t.Fatalf("restart node1's kubelet: %v", err)
			}
			c.waitNodesReady()
			c.waitRollout()
		}},
	)
	var results []disruptionResult
	for i, d := range cases {
		if d.prepare != nil {
			d.prepare()
		}
		r := c.underLoad(fmt.Sprintf("client-%d", i), clusterIP, d)
		t.Logf("disruption %s: %s (back after %v)", d.name, r.load, r.took.Round(100*time.Millisecond))
		if r.load.Failed > 0 || r.load.Broken > 0 {
			t.Errorf("disruption %s with %s: %d of %d new connections failed %v, %d of %d held ones broke",
				d.name, c.proxy, r.load.Failed, r.load.Attempted, r.load.Failures, r.load.Broken, r.load.Held)
		}
		if r.outside {
			t.Errorf("disruption %s took %v, beyond the load's window (%v): the figures miss its end", d.name, r.took, loadWindow)
		}
		results = append(results, r)
	}
	writeDisruption(t, filepath.Join(cfg.out, "disruption-"+c.proxy+".md"), c.proxy, results)
}

// deployBackends starts two probe servers on each node behind Service
// disruption/backend and returns its ClusterIP once all four are its ready
// endpoints.
func (c *cluster) deployBackends() string {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := c.bed.Client()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: disruptNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node1", "node1", "node2", "node2"} {
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "backend-" + node + "-", Labels: map[string]string{"app": "backend"}},
			Spec: v1.PodSpec{
				NodeName: node,
				Containers: []v1.Container{{
					Name: "serve", Image: probeImage, ImagePullPolicy: v1.PullIfNotPresent,
					Args: []string{"serve", "--name", "$(POD_NAME)", "--port", fmt.Sprint(backendPort), "--tcp", "--echo"},
					Env: []v1.EnvVar{{Name: "POD_NAME", ValueFrom: &v1.EnvVarSource{
						FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
					ReadinessProbe: &v1.Probe{ProbeHandler: v1.ProbeHandler{
						TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(backendPort)}}, PeriodSeconds: 2},
				}},
			},
		}
		if _, err := client.CoreV1().Pods(disruptNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	svc, err := client.CoreV1().Services(disruptNS).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "backend"},
		Spec: v1.ServiceSpec{
			Selector: map[string]string{"app": "backend"},
			Ports:    []v1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(backendPort), Protocol: v1.ProtocolTCP}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.poll("Service disruption/backend with 4 ready endpoints", readyTimeout, func(ctx context.Context) error {
		slices, err := client.DiscoveryV1().EndpointSlices(disruptNS).List(ctx, metav1.ListOptions{LabelSelector: discovery.LabelServiceName + "=backend"})
		if err != nil {
			return err
		}
		ready := 0
		for _, s := range slices.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		if ready != 4 {
			return fmt.Errorf("%d ready endpoints\n%s", ready, c.describe(disruptNS))
		}
		return nil
	})
	return svc.Spec.ClusterIP
}

// underLoad runs probe load in a pod on node1 for loadWindow and d's
// disruption loadLead after the load is steady, and reads the load's
// summary from the pod's log once it has ended.
func (c *cluster) underLoad(name, clusterIP string, d disruption) disruptionResult {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), loadWindow+3*time.Minute)
	defer cancel()
	pods := c.bed.Client().CoreV1().Pods(disruptNS)
	_, err := pods.Create(ctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PodSpec{
			NodeName:      "node1",
			RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{
				Name: "load", Image: probeImage, ImagePullPolicy: v1.PullIfNotPresent,
				Args: []string{"load", "--addr", net.JoinHostPort(clusterIP, "80"), "--rate", fmt.Sprint(loadRate), "--hold", fmt.Sprint(loadHold),
					"--timeout", "1s", "--duration", loadWindow.String()},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	logs := func(ctx context.Context) string {
		b, _ := pods.GetLogs(name, &v1.PodLogOptions{}).DoRaw(ctx)
		return string(b)
	}
	c.poll("load "+name+" steady", readyTimeout, func(ctx context.Context) error {
		if l := logs(ctx); !strings.Contains(l, fmt.Sprintf("ready held=%d", loadHold)) {
			return fmt.Errorf("load not ready: %q\n%s", l, c.describe(disruptNS))
		}
		return nil
	})
	loadStart := time.Now()
	time.Sleep(loadLead)
	begin := time.Now()
	d.disrupt()
	r := disruptionResult{name: d.name, took: time.Since(begin)}
	r.outside = time.Since(loadStart) > loadWindow
	c.poll("load "+name+" done", loadWindow+time.Minute, func(ctx context.Context) error {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed {
			return fmt.Errorf("load pod %s", p.Status.Phase)
		}
		return nil
	})
	out := logs(ctx)
	if r.load, err = conformance.ParseLoad(out); err != nil {
		t.Fatal(err)
	}
	return r
}

// setImage sets the image of both of nftproxy's containers and waits for
// the rollout.
func (c *cluster) setImage(image string) {
	c.t.Helper()
	c.kubectl("--namespace", "kube-system", "set", "image", "daemonset/"+c.daemonSet, "sysctls="+image, "nftproxy="+image)
	c.waitRollout()
}

// waitRollout waits until every node runs an up-to-date, available pod of
// the DaemonSet.
func (c *cluster) waitRollout() {
	c.t.Helper()
	time.Sleep(time.Second) // let the controller observe the change
	c.waitDaemonSet()
}

// deleteDaemonPod deletes the DaemonSet's pod on node and waits until its
// replacement is ready.
func (c *cluster) deleteDaemonPod(node string) {
	t := c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	pods := c.bed.Client().CoreV1().Pods("kube-system")
	list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var old *v1.Pod
	for i, p := range list.Items {
		for _, o := range p.OwnerReferences {
			if o.Kind == "DaemonSet" && o.Name == c.daemonSet {
				old = &list.Items[i]
			}
		}
	}
	if old == nil {
		t.Fatalf("no pod of DaemonSet %s on %s", c.daemonSet, node)
	}
	if err := pods.Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.poll("a new "+c.daemonSet+" pod ready on "+node, readyTimeout, func(ctx context.Context) error {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if p.UID == old.UID || !strings.HasPrefix(p.Name, c.daemonSet+"-") {
				continue
			}
			for _, cond := range p.Status.Conditions {
				if cond.Type == v1.PodReady && cond.Status == v1.ConditionTrue {
					return nil
				}
			}
		}
		return fmt.Errorf("no new ready pod yet")
	})
}

// writeDisruption writes the results as the Markdown table docs/conformance.md shows.
func writeDisruption(t interface{ Fatal(...any) }, path, proxy string, results []disruptionResult) {
	var b strings.Builder
	fmt.Fprintf(&b, "Proxy: %s; load: %d new connections/s and %d held, for %v each, from a pod on node1 to a ClusterIP with 4 endpoints on 2 nodes.\n\n", proxy, loadRate, loadHold, loadWindow)
	b.WriteString("| Disruption | New connections attempted | Failed | Held | Held and survived | Proxy back after |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		fails := ""
		if len(r.load.Failures) > 0 {
			fails = fmt.Sprintf(" %v", r.load.Failures)
		}
		fmt.Fprintf(&b, "| %s | %d | %d%s | %d | %d | %.1f s |\n", r.name, r.load.Attempted, r.load.Failed, fails, r.load.Held, r.load.Survived(), r.took.Seconds())
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}
