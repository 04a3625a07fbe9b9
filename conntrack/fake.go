package conntrack

import (
	"context"
	"net/netip"
	"slices"
	"sync"
)

// Fake is an in-memory conntrack table for the proxier's unit tests. Its
// Reconcile behaves like Netlink's: nothing at all without a frontend to
// look at, a "dump" of the family's flows of the protocols in use (of TCP,
// only those never answered nor DNATed, as the kernel's status filter
// returns), Stale, and deletion. It records every Reconcile and never
// touches the metrics. It is safe for concurrent use.
type Fake struct {
	mu         sync.Mutex
	flows      []Flow
	reconciles []FakeReconcile
	failNext   error
}

var _ Interface = (*Fake)(nil)

// FakeReconcile is one call of Fake.Reconcile.
type FakeReconcile struct {
	Family            Family
	Previous, Current Frontends
	Result            Result
	Deleted           []Flow
	Err               error
}

// NewFake returns a Fake holding flows.
func NewFake(flows ...Flow) *Fake {
	f := &Fake{}
	f.Add(flows...)
	return f
}

// Add inserts flows. Like the kernel, which refuses a second entry with
// the same original tuple in a zone, it ignores such duplicates.
func (f *Fake) Add(flows ...Flow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, fl := range flows {
		if !slices.ContainsFunc(f.flows, func(o Flow) bool { return sameEntry(o, fl) }) {
			f.flows = append(f.flows, fl)
		}
	}
}

func sameEntry(a, b Flow) bool {
	return a.Proto == b.Proto && a.Zone == b.Zone && unmap(a.Orig.Src) == unmap(b.Orig.Src) && unmap(a.Orig.Dst) == unmap(b.Orig.Dst)
}

// Flows returns a copy of the family's flows, in insertion order.
func (f *Fake) Flows(family Family) []Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Flow
	for _, fl := range f.flows {
		if family.contains(fl) {
			out = append(out, fl)
		}
	}
	return out
}

// Reconciles returns the calls of Reconcile so far.
func (f *Fake) Reconciles() []FakeReconcile {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reconciles)
}

// FailNextReconcile makes the next Reconcile fail with err without
// deleting anything, as a failed dump would.
func (f *Fake) FailNextReconcile(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext = err
}

// Reconcile implements Interface.
func (f *Fake) Reconcile(ctx context.Context, family Family, previous Frontends, current func() Frontends, isNodePortAddr func(netip.Addr) bool) (Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	call := FakeReconcile{Family: family, Previous: previous, Current: current()}
	defer func() { f.reconciles = append(f.reconciles, call) }()
	protos := protocols(previous, call.Current)
	if len(protos) == 0 {
		return call.Result, nil
	}
	if err := ctx.Err(); err != nil {
		call.Err = err
		return call.Result, err
	}
	if call.Err = f.failNext; call.Err != nil {
		f.failNext = nil
		return call.Result, call.Err
	}
	var dumped []Flow
	for _, fl := range f.flows {
		if family.contains(fl) && slices.Contains(protos, fl.Proto) && (fl.Proto != ProtoTCP || fl.Unanswered && !dnated(fl)) {
			dumped = append(dumped, fl)
		}
	}
	call.Current = current() // as a dump would: after reading the flows
	call.Deleted = Stale(dumped, previous, call.Current, isNodePortAddr)
	f.flows = slices.DeleteFunc(f.flows, func(fl Flow) bool { return slices.Contains(call.Deleted, fl) })
	call.Result = Result{Dumped: len(dumped), Stale: len(call.Deleted), Deleted: len(call.Deleted)}
	return call.Result, nil
}
