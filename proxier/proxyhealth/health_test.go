package proxyhealth

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nftproxy/nftproxy/nft"
)

const testTimeout = 60 * time.Second

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// step is one call on Health at some offset from t0.
type step struct {
	at     time.Duration
	queue  []nft.Family
	update []nft.Family
}

func TestStatus(t *testing.T) {
	tests := []struct {
		name     string
		steps    []step
		checkAt  time.Duration
		healthy  bool
		families map[string]bool // family name → healthy
	}{
		{
			name:     "fresh start is healthy",
			checkAt:  time.Hour,
			healthy:  true,
			families: map[string]bool{},
		},
		{
			name:     "queued update within timeout",
			steps:    []step{{at: 0, queue: []nft.Family{nft.IPv4}}},
			checkAt:  testTimeout - time.Second,
			healthy:  true,
			families: map[string]bool{"IPv4": true},
		},
		{
			name:     "queued update never applied goes unhealthy even before the first sync",
			steps:    []step{{at: 0, queue: []nft.Family{nft.IPv4}}},
			checkAt:  testTimeout,
			healthy:  false,
			families: map[string]bool{"IPv4": false},
		},
		{
			name: "applied update is healthy however old",
			steps: []step{
				{at: 0, queue: []nft.Family{nft.IPv4}},
				{at: time.Second, update: []nft.Family{nft.IPv4}},
			},
			checkAt:  time.Hour,
			healthy:  true,
			families: map[string]bool{"IPv4": true},
		},
		{
			name: "later queued updates do not reset the oldest",
			steps: []step{
				{at: 0, queue: []nft.Family{nft.IPv4}},
				{at: 50 * time.Second, queue: []nft.Family{nft.IPv4}},
			},
			checkAt:  61 * time.Second,
			healthy:  false,
			families: map[string]bool{"IPv4": false},
		},
		{
			name: "one stuck family makes the whole proxy unhealthy",
			steps: []step{
				{at: 0, queue: []nft.Family{nft.IPv4, nft.IPv6}},
				{at: time.Second, update: []nft.Family{nft.IPv4}},
			},
			checkAt:  2 * testTimeout,
			healthy:  false,
			families: map[string]bool{"IPv4": true, "IPv6": false},
		},
		{
			name: "queue after update restarts the clock",
			steps: []step{
				{at: 0, queue: []nft.Family{nft.IPv6}},
				{at: 10 * time.Second, update: []nft.Family{nft.IPv6}},
				{at: 100 * time.Second, queue: []nft.Family{nft.IPv6}},
			},
			checkAt:  150 * time.Second,
			healthy:  true,
			families: map[string]bool{"IPv6": true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(t0)
			h := New(testTimeout, clk)
			for _, s := range tt.steps {
				clk.SetTime(t0.Add(s.at))
				for _, f := range s.queue {
					h.QueuedUpdate(f)
				}
				for _, f := range s.update {
					h.Updated(f)
				}
			}
			clk.SetTime(t0.Add(tt.checkAt))
			st := h.Status()
			if st.Healthy != tt.healthy {
				t.Errorf("Healthy = %v, want %v", st.Healthy, tt.healthy)
			}
			if !st.CurrentTime.Equal(t0.Add(tt.checkAt)) {
				t.Errorf("CurrentTime = %v, want %v", st.CurrentTime, t0.Add(tt.checkAt))
			}
			if len(st.Families) != len(tt.families) {
				t.Errorf("Families = %v, want %v", st.Families, tt.families)
			}
			for name, healthy := range tt.families {
				if got, ok := st.Families[name]; !ok || got.Healthy != healthy {
					t.Errorf("Families[%s] = %+v (present %v), want healthy %v", name, got, ok, healthy)
				}
			}
		})
	}
}

func TestLastUpdatedIsLatestFamily(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(t0)
	h := New(testTimeout, clk)
	h.Updated(nft.IPv4)
	clk.SetTime(t0.Add(5 * time.Second))
	h.Updated(nft.IPv6)
	clk.SetTime(t0.Add(time.Minute))
	st := h.Status()
	if want := t0.Add(5 * time.Second); !st.LastUpdated.Equal(want) {
		t.Errorf("LastUpdated = %v, want %v", st.LastUpdated, want)
	}
	if got := st.Families["IPv4"].LastUpdated; !got.Equal(t0) {
		t.Errorf("IPv4 LastUpdated = %v, want %v", got, t0)
	}
}

func TestSyncNode(t *testing.T) {
	now := metav1.NewTime(t0)
	tests := []struct {
		name string
		node *v1.Node
		want bool
	}{
		{"plain node", &v1.Node{}, true},
		{"deleted node", nil, false},
		{"being deleted", &v1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, false},
		{"autoscaler taint", taintedNode(ToBeDeletedTaint), false},
		{"other taint", taintedNode("node.kubernetes.io/unschedulable"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := New(testTimeout, nil)
			if !h.NodeEligible() {
				t.Fatal("node not eligible before any SyncNode")
			}
			h.SyncNode(tt.node)
			if got := h.NodeEligible(); got != tt.want {
				t.Errorf("NodeEligible = %v, want %v", got, tt.want)
			}
		})
	}
}

func taintedNode(key string) *v1.Node {
	return &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: key, Effect: v1.TaintEffectNoSchedule}}}}
}
