package kubenode_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/kubenode"
	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// kubeProxyConfig is added to the bed's kubeadm configuration:
// conntrack.maxPerCore 0 leaves nf_conntrack_max alone, since it is global
// to the machine and a privileged container could change it.
const kubeProxyConfig = "conntrack:\n  maxPerCore: 0\n"

// daemonSetName is deploy/'s DaemonSet, in kube-system.
const daemonSetName = "nftproxy"

// dropIn runs kubeadm and kubectl against the bed, as its admin, from the
// control namespace.
type dropIn struct {
	t    *testing.T
	bed  *testbed.Bed
	bins kubenode.Binaries
	dir  string
}

func (d *dropIn) run(tool string, args ...string) string {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := d.bed.AdminExec(ctx, tool, args...)
	if err != nil {
		d.t.Fatalf("%s %s: %v\n%s", filepath.Base(tool), strings.Join(args, " "), err, out)
	}
	d.t.Logf("%s %s:\n%s", filepath.Base(tool), strings.Join(args, " "), strings.TrimSpace(out))
	return out
}

func (d *dropIn) kubectl(args ...string) string {
	d.t.Helper()
	return d.run(d.bins.Kubectl, args...)
}

// kubeadmProxyAddon runs kubeadm's kube-proxy addon phase against the bed.
func (d *dropIn) kubeadmProxyAddon() {
	d.t.Helper()
	d.bed.KubeadmProxyAddon(d.t, d.bins.Kubeadm, d.dir, kubeProxyConfig)
}

// waitDaemonPod waits until the DaemonSet's pod on node runs with every
// container ready, and returns it. Otherwise it fails the test with what the
// API server knows about the pod: its phase, conditions, containers' states
// and the events of kube-system.
func (d *dropIn) waitDaemonPod(node string) *v1.Pod {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), podTimeout)
	defer cancel()
	var pod *v1.Pod
	for {
		var err error
		pod, err = d.daemonPod(ctx, node)
		if err == nil && podReady(pod) {
			d.t.Logf("pod %s/%s ready on %s", pod.Namespace, pod.Name, node)
			return pod
		}
		select {
		case <-ctx.Done():
			d.t.Fatalf("no ready pod of DaemonSet %s on %s after %v (%v)\n%s", daemonSetName, node, podTimeout, err, d.describe(pod))
		case <-time.After(time.Second):
		}
	}
}

// daemonPod returns the DaemonSet's pod bound to node.
func (d *dropIn) daemonPod(ctx context.Context, node string) (*v1.Pod, error) {
	pods, err := d.bed.Client().CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		owned := slices.ContainsFunc(p.OwnerReferences, func(o metav1.OwnerReference) bool {
			return o.Kind == "DaemonSet" && o.Name == daemonSetName
		})
		if owned && p.Spec.NodeName == node {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no pod of DaemonSet %s bound to %s among %d in kube-system", daemonSetName, node, len(pods.Items))
}

func podReady(p *v1.Pod) bool {
	if p.Status.Phase != v1.PodRunning || len(p.Status.ContainerStatuses) == 0 {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// describe says what the API server knows about pod (which may be nil) and
// lists the events of kube-system.
func (d *dropIn) describe(pod *v1.Pod) string {
	var b strings.Builder
	if pod != nil {
		fmt.Fprintf(&b, "pod %s: phase %s on %q\n", pod.Name, pod.Status.Phase, pod.Spec.NodeName)
		for _, c := range pod.Status.Conditions {
			fmt.Fprintf(&b, "  condition %s=%s %s %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
			fmt.Fprintf(&b, "  container %s: ready=%v restarts=%d state=%s last=%s\n",
				cs.Name, cs.Ready, cs.RestartCount, containerState(cs.State), containerState(cs.LastTerminationState))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	events, err := d.bed.Client().CoreV1().Events("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(&b, "events: %v\n", err)
		return b.String()
	}
	for _, e := range events.Items {
		fmt.Fprintf(&b, "event %s %s/%s: %s %s (x%d)\n", e.Type, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message, e.Count)
	}
	return b.String()
}

func containerState(s v1.ContainerState) string {
	switch {
	case s.Waiting != nil:
		return fmt.Sprintf("waiting (%s: %s)", s.Waiting.Reason, s.Waiting.Message)
	case s.Running != nil:
		return "running since " + s.Running.StartedAt.String()
	case s.Terminated != nil:
		return fmt.Sprintf("terminated (%s, exit %d: %s)", s.Terminated.Reason, s.Terminated.ExitCode, s.Terminated.Message)
	}
	return "none"
}
