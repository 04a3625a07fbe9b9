package conntrack

import (
	"context"
	"errors"
	"slices"
	"testing"
)

// TestFakeMatchesStale: the Fake deletes what Stale says, family by family.
func TestFakeMatchesStale(t *testing.T) {
	for _, family := range []Family{IPv4, IPv6} {
		t.Run(family.String(), func(t *testing.T) {
			all4, stale4, prev4, cur4 := kernelWorld(t, IPv4)
			all6, stale6, prev6, cur6 := kernelWorld(t, IPv6)
			fake := NewFake(append(slices.Clone(all4), all6...)...)
			all, stale, prev, cur, other := all4, stale4, prev4, cur4, all6
			if family == IPv6 {
				all, stale, prev, cur, other = all6, stale6, prev6, cur6, all4
			}
			w := world{family: family}
			res, err := fake.Reconcile(context.Background(), family, prev, Fixed(cur), w.isNodePortAddr)
			if err != nil {
				t.Fatal(err)
			}
			if res.Deleted != len(stale) {
				t.Errorf("deleted %d, want %d", res.Deleted, len(stale))
			}
			if diff := flowDiff(fake.Flows(family), without(all, stale)); diff != "" {
				t.Errorf("flows left:%s", diff)
			}
			otherFamily := IPv6
			if family == IPv6 {
				otherFamily = IPv4
			}
			if diff := flowDiff(fake.Flows(otherFamily), other); diff != "" {
				t.Errorf("other family touched:%s", diff)
			}
			calls := fake.Reconciles()
			if len(calls) != 1 {
				t.Fatalf("%d calls recorded, want 1", len(calls))
			}
			if diff := flowDiff(calls[0].Deleted, stale); diff != "" {
				t.Errorf("recorded deletions:%s", diff)
			}
		})
	}
}

func TestFake(t *testing.T) {
	w := world{family: IPv4, proto: ProtoUDP}
	svc := w.fe(w.cip(1), 53)
	tcp := Frontend{Proto: ProtoTCP, Addr: w.cip(2), Port: 80}
	stale := w.nat(1, ap(svc.Addr, 53), w.ep(1))
	kept := w.nat(2, ap(svc.Addr, 53), w.ep(2))
	fake := NewFake(stale, kept, stale)
	if n := len(fake.Flows(IPv4)); n != 2 {
		t.Fatalf("duplicate tuple added: %d flows", n)
	}
	ctx := context.Background()

	// Without UDP or SCTP frontends, nothing is dumped.
	res, err := fake.Reconcile(ctx, IPv4, Frontends{tcp: nil}, Fixed(Frontends{tcp: nil}), nil)
	if err != nil || res != (Result{}) {
		t.Errorf("TCP only: %+v, %v", res, err)
	}

	boom := errors.New("boom")
	fake.FailNextReconcile(boom)
	prev, cur := Frontends{svc: eps(w.ep(1), w.ep(2))}, Frontends{svc: eps(w.ep(2))}
	if _, err := fake.Reconcile(ctx, IPv4, prev, Fixed(cur), nil); !errors.Is(err, boom) {
		t.Errorf("FailNextReconcile: %v", err)
	}
	if n := len(fake.Flows(IPv4)); n != 2 {
		t.Errorf("failed reconcile deleted flows: %d left", n)
	}
	res, err = fake.Reconcile(ctx, IPv4, prev, Fixed(cur), nil)
	if err != nil || res.Dumped != 2 || res.Deleted != 1 {
		t.Errorf("reconcile: %+v, %v", res, err)
	}
	if got := fake.Flows(IPv4); !slices.Equal(got, []Flow{kept}) {
		t.Errorf("left %v, want %v", got, kept)
	}
	if n := len(fake.Reconciles()); n != 3 {
		t.Errorf("%d reconciles recorded, want 3", n)
	}
}
