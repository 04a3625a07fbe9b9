// Package testbed runs a real Kubernetes control plane and a fabric of network namespaces
// for nftproxy's end-to-end tests.
//
// A Bed is one isolated cluster: a control namespace holding a bridge (the node fabric,
// 10.10.0.0/24 and fd00:10::/64, bridge address .1), etcd and kube-apiserver; node
// namespaces attached to the bridge; and pod namespaces attached to their node, routed like
// Calico does it (a /32 and /128 on the pod's eth0, a link-local next hop answered by the
// node). Every participant lives in its own namespace because traffic between the root
// namespace and a namespace over a veth does not work on our test machines
// (ARP from the root side is never answered); the test process talks to the API server through
// Bed.Client, whose sockets are created inside the control namespace.
//
// Addresses, with i the node index and j the pod index on that node (both from 1):
//
//	control (bridge br0)  10.10.0.1            fd00:10::1
//	node i (eth0)         10.10.0.(10+i)       fd00:10::(10+i)
//	node i pod CIDRs      10.244.i.0/24        fd00:244:i::/64
//	pod j on node i       10.244.i.(10+j)      fd00:244:i::(10+j)
//	Service CIDRs         10.96.0.0/12         fd00:96::/108
//
// Node.RunContainer runs an OCI container with runc (package ocispec derives its runtime
// spec from a pod's container, as kubelet and containerd would), e.g. nftproxy's image as
// a node's hostNetwork proxy.
//
// Cleanup happens on every exit path we can catch: t.Cleanup deletes the bed's
// containers, kills every process the bed started and deletes its namespaces;
// SIGINT/SIGTERM (Ctrl-C during go test) does the same for all beds of the process
// before exiting. What neither can catch (SIGKILL, or go test's
// -timeout panic) is handled by Sweep, which Start runs once per process and which
// e2e/cmd/sweep runs by hand: it removes containers, namespaces and processes of beds
// whose test process is gone, and never touches a bed whose owner is still running.
//
// Tests need root, iproute2 and the binaries built by e2e/tools/build.sh. Start skips the
// test when they are missing, unless NFTPROXY_E2E=1 is set, which turns the skip into a
// failure (use that in CI so a broken setup cannot pass silently).
package testbed
