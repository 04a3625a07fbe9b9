package kubenode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// controllersTimeout bounds the wait for kube-controller-manager's first
// visible work.
const controllersTimeout = time.Minute

// StartControllers runs kube-controller-manager (every controller that is on
// by default) and kube-scheduler in the bed's control namespace, as the bed's
// admin, without leader election and without their HTTPS servers (nothing
// scrapes them). Like the node's programs they see the machine's root
// filesystem read-only: the controller manager creates its flex volume
// directory (default /usr/libexec/kubernetes/kubelet-plugins/volume/exec),
// here in the bed's working directory. The controller manager publishes the bed's CA as ConfigMap
// kube-root-ca.crt in every namespace, which pods' service account volumes
// need; StartControllers returns once it is there in kube-system.
func StartControllers(t testbed.TB, bed *testbed.Bed, bins Binaries) {
	t.Helper()
	dir := filepath.Join(bed.Dir, "controllers")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(ca, bed.RESTConfig().CAData, 0o644); err != nil {
		t.Fatal(err)
	}
	kcm := bed.Ctl.Start(withReadOnlyRoot(dir, bins.ControllerManager,
		"--kubeconfig="+bed.AdminKubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		"--root-ca-file="+ca,
		"--controllers=*",
		// A dual-stack cluster as kubeadm sets one up: the node IPAM
		// controller finds the pod CIDRs the bed gave each Node inside
		// the cluster CIDRs and keeps them.
		"--allocate-node-cidrs=true",
		"--cluster-cidr="+bed.PodCIDRs(),
		"--service-cluster-ip-range="+bed.ServiceCIDRs(),
		fmt.Sprintf("--node-cidr-mask-size-ipv4=%d", testbed.NodeCIDRMaskSizeIPv4),
		fmt.Sprintf("--node-cidr-mask-size-ipv6=%d", testbed.NodeCIDRMaskSizeIPv6),
		"--flex-volume-plugin-dir="+filepath.Join(dir, "flex-volume-plugins"),
	)...)
	bed.Ctl.Start(withReadOnlyRoot(dir, bins.Scheduler,
		"--kubeconfig="+bed.AdminKubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	)...)
	ctx, cancel := context.WithTimeout(context.Background(), controllersTimeout)
	defer cancel()
	for {
		_, err := bed.Client().CoreV1().ConfigMaps("kube-system").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		if err == nil {
			return
		}
		select {
		case <-kcm.Done():
			t.Fatalf("kube-controller-manager exited: %v", kcm.Err())
		case <-ctx.Done():
			t.Fatalf("kube-controller-manager did not publish kube-system/kube-root-ca.crt in %v: %v", controllersTimeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
