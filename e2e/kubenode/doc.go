// Package kubenode makes a node of an e2e test bed a real Kubernetes node:
// containerd and kubelet run in the node's network namespace, and
// kube-controller-manager and kube-scheduler run beside the bed's API server,
// so that a DaemonSet gets its pods, the scheduler binds them and the kubelet
// starts their containers from images imported into containerd. `make
// kubelet-e2e` uses it to run deploy/'s DaemonSet (docs/kubelet-e2e.md).
//
// A kubelet and a container runtime expect a machine of their own; here they
// share one with other tests and must leave it as they found it:
//
//   - Network: the node's namespace. Without Options.CNI only hostNetwork
//     pods run, in the node's namespace too; with it, Debian's bridge,
//     host-local and portmap plugins give each pod an address of each
//     family, from the node's two pod CIDRs, on a bridge cni0 in the node's
//     namespace (the bed already routes every node's pod CIDRs to it), their
//     leases in the node's /var/lib tmpfs.
//   - Files: the node's containerd, kubelet and containers run in one mount
//     namespace of their own (they must share one: the kubelet mounts volumes
//     that the runtime then bind-mounts into containers). In it the machine's
//     root filesystem is read-only and /run, /var/lib and /var/log are empty
//     tmpfs, so paths both programs hard-code (/run/containerd for shim
//     sockets, /var/lib/kubelet/device-plugins, /var/log/containers) and any
//     write we did not foresee stay inside the namespace or fail; only the
//     node's directory in the bed's working directory is writable.
//   - Cgroups: everything the kubelet and runc create is under one parent
//     named after the node's namespace ("nfp1a2b3-node1"), made in every
//     hierarchy before the kubelet starts and removed when the node stops
//     (testbed.Sweep removes those of dead beds).
//   - Kernel settings: at start the kubelet sets vm.overcommit_memory,
//     kernel.panic and others that are global to the machine. Inside the
//     mount namespace those files are shadowed by files holding the values
//     the kubelet wants, and protectKernelDefaults makes it fail rather than
//     write should one differ.
//
// Each Node is stopped when the test ends, before its bed (and, on SIGINT or
// SIGTERM, by the bed's cleanup): the kubelet, then every process in the
// node's cgroups (the containers) and the cgroups themselves, then
// containerd, its shims and the mount namespace's holder. The pods' network
// namespaces are mounted in the node's /run tmpfs, so they go with it.
package kubenode
