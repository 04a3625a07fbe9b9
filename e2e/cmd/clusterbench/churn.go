package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The churn: Deployments dep-0 … dep-(D-1), each behind a Service of its
// own, that the controller-manager scales and rolls as ClusterLoader2's
// load test has it do. Their pods are the fake kubelet's; the EndpointSlice
// controller writes their Services' EndpointSlices, with trigger times.

func depName(i int) string { return fmt.Sprintf("dep-%d", i) }

// createDeployments creates the Deployments and Services, and waits until
// every pod is ready and every Service has its endpoints.
func (cl *cluster) createDeployments() {
	ctx := context.Background()
	for i := range cl.cfg.Deployments {
		name := depName(i)
		labels := map[string]string{"app": name}
		replicas := int32(cl.cfg.Replicas)
		zero := int64(0)
		d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: churnNS},
			Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: v1.PodSpec{TerminationGracePeriodSeconds: &zero, Containers: []v1.Container{{
						Name: "server", Image: "registry.k8s.io/pause:3.10",
						Ports: []v1.ContainerPort{{ContainerPort: backendPort}}}}}}}}
		if _, err := cl.client.AppsV1().Deployments(churnNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			cl.tb.Fatal(err)
		}
		svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: churnNS},
			Spec: v1.ServiceSpec{Selector: labels, Ports: []v1.ServicePort{{Name: "http", Port: 80,
				Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(backendPort)}}}}
		if _, err := cl.client.CoreV1().Services(churnNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			cl.tb.Fatal(err)
		}
	}
	want := cl.cfg.Deployments * cl.cfg.Replicas
	if !cl.kubelet.waitReady(want, 5*time.Minute) {
		cl.tb.Fatalf("the churn Deployments' %d pods were not all ready in 5 minutes", want)
	}
	cl.tb.Logf("clusterbench: %d Deployments with %d pods ready", cl.cfg.Deployments, want)
}

// churn is the churn writer running in the background.
type churn struct {
	stop      chan struct{}
	done      chan struct{}
	scales    atomic.Int64
	rollouts  atomic.Int64
	failures  atomic.Int64
	lastError atomic.Value // string
}

// startChurn scales or rolls one Deployment every cfg.ChurnEvery: a scale
// sets it to a random size between half and one and a half times
// --replicas; a rollout changes its pod template, which replaces every pod
// (maxSurge and maxUnavailable 25%, the Deployment defaults).
func (cl *cluster) startChurn() *churn {
	ch := &churn{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(ch.done)
		tick := time.NewTicker(cl.cfg.ChurnEvery)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-ch.stop:
				return
			case <-tick.C:
			}
			if err := cl.churnOne(n); err != nil {
				ch.failures.Add(1)
				ch.lastError.Store(err.Error())
			} else if n%2 == 0 {
				ch.scales.Add(1)
			} else {
				ch.rollouts.Add(1)
			}
		}
	}()
	return ch
}

// churnOne is the n-th churn step: even steps scale, odd steps roll.
func (cl *cluster) churnOne(n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := depName(rand.IntN(cl.cfg.Deployments))
	var patch string
	if n%2 == 0 {
		lo := max(cl.cfg.Replicas/2, 1)
		patch = fmt.Sprintf(`{"spec":{"replicas":%d}}`, lo+rand.IntN(cl.cfg.Replicas+1))
	} else {
		patch = fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"clusterbench/rollout":"%d"}}}}}`, n)
	}
	_, err := cl.client.AppsV1().Deployments(churnNS).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// end stops the churn and returns what it did.
func (ch *churn) end() (scales, rollouts, failures int64, lastError string) {
	close(ch.stop)
	<-ch.done
	last, _ := ch.lastError.Load().(string)
	return ch.scales.Load(), ch.rollouts.Load(), ch.failures.Load(), last
}
