package watch

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nftproxy/nftproxy/internal/testutil"
)

// failing returns a reactor that fails the first calls with errs, in
// turn, and then lets them through, counting all calls.
func failing(errs ...error) (k8stesting.ReactionFunc, func() int) {
	var mu sync.Mutex
	calls := 0
	return func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			calls++
			if calls <= len(errs) {
				return true, nil, errs[calls-1]
			}
			return false, nil, nil
		}, func() int {
			mu.Lock()
			defer mu.Unlock()
			return calls
		}
}

// recordedCIDRs records what the watcher sets as the API's service CIDRs.
type recordedCIDRs struct {
	mu    sync.Mutex
	cidrs []netip.Prefix
	calls int
}

func (r *recordedCIDRs) set(c []netip.Prefix) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cidrs, r.calls = c, r.calls+1
}

func (r *recordedCIDRs) get() ([]netip.Prefix, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cidrs, r.calls
}

// TestServiceCIDRDiscovery: whether the API serves ServiceCIDRs is decided
// by discovery and a 404, never by an unreachable server: Start waits for
// the server, and when they are served the first sync has them. When they
// are not (a 404, a networking.k8s.io/v1 without them, or no permission
// to list them), the proxy goes on with --service-cidr and the watcher
// looks again after the resync period, so an upgraded control plane is
// picked up.
func TestServiceCIDRDiscovery(t *testing.T) {
	const resync = time.Hour // never reached while Start runs
	servicecidrs := []metav1.APIResource{{Name: "servicecidrs", Kind: "ServiceCIDR"}}
	for _, tc := range []struct {
		name          string
		resources     []metav1.APIResource // of networking.k8s.io/v1; nil: group version not served (404)
		discoveryErrs []error
		listErrs      []error
		servedAtStart bool
		discoveries   int // by the time Start returns
	}{
		{"served", servicecidrs, nil, nil, true, 1},
		{"unreachable, then served", servicecidrs, []error{errRefused, errRefused, errReset}, nil, true, 4},
		{"500, then served", servicecidrs, []error{errInternal}, nil, true, 2},
		{"not served (404)", nil, nil, nil, false, 1},
		{"unreachable, then not served", nil, []error{errRefused}, nil, false, 2},
		{"networking.k8s.io/v1 without them", []metav1.APIResource{{Name: "ingresses"}}, nil, nil, false, 1},
		{"list refused, then served", servicecidrs, nil, []error{errRefused}, true, 1},
		{"not allowed to list them", servicecidrs, nil, []error{errForbidden}, false, 1},
		{"list says 404", servicecidrs, nil, []error{errNotFound}, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			client := fake.NewClientset(&networking.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
				Spec: networking.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/12", "fd00:96::/108"}}},
				&networking.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
					Spec: networking.ServiceCIDRSpec{CIDRs: []string{"10.100.0.0/16", "10.96.0.0/12"}}})
			fd := client.Discovery().(*fakediscovery.FakeDiscovery)
			if tc.resources != nil {
				fd.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1", APIResources: tc.resources}}
			}
			discovery, discoveries := failing(tc.discoveryErrs...)
			client.PrependReactor("get", "resource", discovery)
			list, _ := failing(tc.listErrs...)
			client.PrependReactor("list", "servicecidrs", list)

			clk := testingclock.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			w, err := newWatcher(API{Client: client}, clk, func(context.Context) probeResult { return probeReady },
				"n1", resync, NewTrackers(time.Time{}), Hooks{})
			if err != nil {
				t.Fatal(err)
			}
			w.gate.jitter = 0
			var got recordedCIDRs
			w.WatchServiceCIDRs(Hooks{}, got.set)
			done := make(chan struct{})
			go func() {
				defer close(done)
				err = w.Start(ctx)
			}()
			stepUntil(t, clk, 100*time.Millisecond, time.Minute, done)
			if err != nil {
				t.Fatal(err)
			}
			if n := discoveries(); n != tc.discoveries {
				t.Errorf("%d discoveries before Start returned, want %d", n, tc.discoveries)
			}
			// Sorted and without duplicates, whatever the store's order.
			want := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("10.100.0.0/16"),
				netip.MustParsePrefix("fd00:96::/108")}
			cidrs, calls := got.get()
			if tc.servedAtStart {
				if !slices.Equal(cidrs, want) {
					t.Errorf("service CIDRs when Start returned: %v, want %v", cidrs, want)
				}
				return
			}
			if calls != 0 {
				t.Fatalf("service CIDRs set to %v although the API does not serve them", cidrs)
			}
			// The control plane is upgraded: the next look finds them.
			fd.Lock()
			fd.Resources = []*metav1.APIResourceList{{GroupVersion: "networking.k8s.io/v1", APIResources: servicecidrs}}
			fd.Unlock()
			client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
				return false, nil, nil // the RBAC fixed as well
			})
			waitForWaiter(t, clk)
			clk.Step(resync)
			testutil.Eventually(t, "ServiceCIDRs watched after the resync period", func() bool {
				cidrs, _ := got.get()
				return slices.Equal(cidrs, want)
			})
		})
	}
}
