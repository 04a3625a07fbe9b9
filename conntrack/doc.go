// Package conntrack deletes the conntrack flows a sync made stale, and
// applies the conntrack sysctls of the configuration.
//
// UDP and SCTP have no connection teardown a client would notice: a flow
// that conntrack keeps DNAT'ing to a backend that is gone black-holes the
// client (DNS is the classic victim) until the flow times out, which
// continuous traffic prevents. After a sync that changed a UDP or SCTP
// Service, the proxier hands the changed frontends, before and after, to
// Interface.Reconcile:
//
//   - Stale (reconcile.go) is the pure decision: which flows to delete;
//   - Netlink (netlink.go, ctnetlink.go) dumps the family's table once per
//     protocol in use, filtered by the kernel, and deletes in batches;
//   - Fake (fake.go) does the same in memory for the proxier's tests.
//
// TCP flows are left alone but for one kind: a connection attempt that
// went past a frontend before its rules existed and was never answered
// (Stale says why it must go). ApplySysctls (sysctl.go) runs once at
// startup. The package imports neither proxier/ nor the nft model nor
// k8s.io/api; it speaks netlink through internal/nlcodec.
package conntrack
