// Package proxyhealth serves nftproxy's HTTP endpoints the way kube-proxy does:
// /healthz and /livez on the health port (10256), used by kubelet probes and
// by cloud load balancers to decide whether to send traffic to this node;
// /metrics and /proxyMode on the metrics port (10249).
//
// Health is the state behind /healthz and /livez. The sync loop tells it
// when an update is queued and when a sync succeeded; the node watcher tells
// it about the Node object. It mirrors upstream's
// pkg/proxy/healthcheck/proxy_health.go (Kubernetes v1.36), JSON included.
package proxyhealth

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/nftproxy/nftproxy/nft"
)

// ToBeDeletedTaint is the taint the Cluster Autoscaler puts on a node before
// deleting it. Reporting unhealthy then lets load balancers drain the node
// before it disappears (KEP-3836).
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Health records sync progress per IP family and whether this node
// should receive load-balanced traffic. It is safe for concurrent use.
//
// A family is unhealthy while an update has been queued for longer than the
// health timeout (upstream: 2 × syncPeriod) without a successful sync since.
// Unlike upstream, this holds even before the first successful sync, so a
// proxier that never manages to sync goes unhealthy instead of staying
// healthy forever.
type Health struct {
	clock   clock.PassiveClock
	timeout time.Duration

	mu sync.Mutex
	// lastUpdated is when each family last synced successfully.
	lastUpdated map[nft.Family]time.Time
	// oldestQueued is when the oldest update not yet applied was queued;
	// absent when the family is in sync.
	oldestQueued map[nft.Family]time.Time
	// nodeEligible is false once the Node is being deleted, tainted for
	// deletion, or gone.
	nodeEligible bool
}

// New returns a Health that reports a family unhealthy when an
// update stays queued for timeout. A nil clk means the real clock.
//
// The node starts eligible: upstream never serves before it has fetched the
// Node, and a node watcher that is late (or not wired) must not make load
// balancers drop a working node.
func New(timeout time.Duration, clk clock.PassiveClock) *Health {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Health{
		clock:        clk,
		timeout:      timeout,
		lastUpdated:  map[nft.Family]time.Time{},
		oldestQueued: map[nft.Family]time.Time{},
		nodeEligible: true,
	}
}

// QueuedUpdate records that a change for family f is waiting to be synced.
// Only the oldest pending change counts: later ones do not reset the clock.
func (h *Health) QueuedUpdate(f nft.Family) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, pending := h.oldestQueued[f]; !pending {
		h.oldestQueued[f] = h.clock.Now()
	}
}

// Updated records that family f was synced successfully: every change queued
// so far is applied.
func (h *Health) Updated(f nft.Family) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.oldestQueued, f)
	h.lastUpdated[f] = h.clock.Now()
}

// SyncNode records the latest state of this node's Node object; nil means
// the Node was deleted.
func (h *Health) SyncNode(node *v1.Node) {
	eligible := nodeEligible(node)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeEligible = eligible
}

// nodeEligible reports whether load balancers should keep sending traffic to
// the node: it exists, is not being deleted and is not about to be.
func nodeEligible(node *v1.Node) bool {
	if node == nil || node.DeletionTimestamp != nil {
		return false
	}
	for _, taint := range node.Spec.Taints {
		if taint.Key == ToBeDeletedTaint {
			return false
		}
	}
	return true
}

// Status is the JSON body of /healthz and /livez, field for field what
// upstream answers (external probes parse lastUpdated).
type Status struct {
	// LastUpdated is the latest successful sync of any family; when
	// healthy, the handlers report the current time instead, as upstream
	// does for compatibility with older releases.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is only set in /healthz answers.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every family is healthy (node not considered).
	Healthy bool `json:"healthy"`
	// Families is the health of each family, keyed "IPv4" / "IPv6".
	Families map[string]FamilyStatus `json:"status,omitempty"`
}

// FamilyStatus is the health of one IP family.
type FamilyStatus struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Status returns a snapshot of the sync health, without the node check.
func (h *Health) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock.Now()
	st := Status{CurrentTime: now, Healthy: true, Families: map[string]FamilyStatus{}}
	for f, t := range h.lastUpdated {
		if t.After(st.LastUpdated) {
			st.LastUpdated = t
		}
		st.Families[f.IPFamily()] = FamilyStatus{LastUpdated: t, Healthy: true}
	}
	for f, queued := range h.oldestQueued {
		healthy := now.Sub(queued) < h.timeout
		st.Families[f.IPFamily()] = FamilyStatus{LastUpdated: h.lastUpdated[f], Healthy: healthy}
		st.Healthy = st.Healthy && healthy
	}
	return st
}

// NodeEligible reports whether the node should receive load-balanced
// traffic, from the last SyncNode.
func (h *Health) NodeEligible() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.nodeEligible
}
