package nft_test

import (
	"github.com/nftproxy/nftproxy/nft"

	"net/netip"
	"testing"
)

// TestEndpointsElements: the ranges of a slot's endpoints cover every
// bucket of the slot once, in order, and differ in size by at most one.
func TestEndpointsElements(t *testing.T) {
	const slot = 7
	base := uint32(slot * nft.EndpointBuckets)
	for _, n := range []int{1, 2, 3, 5, 7, 10, 100, 1000, 65535, 65536, 70000} {
		eps := make([]netip.AddrPort, n)
		for j := range eps {
			eps[j] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 128, byte(j >> 8), byte(j)}), uint16(j))
		}
		els := nft.EndpointsElements(slot, eps)
		if want := min(n, nft.EndpointBuckets); len(els) != want {
			t.Fatalf("%d endpoints: %d elements, want %d", n, len(els), want)
		}
		next, smallest, largest := base, uint32(nft.EndpointBuckets), uint32(0)
		for j, e := range els {
			lo := e.Key[0].Int
			if lo != next || e.End < lo || len(e.Key) != 1 {
				t.Fatalf("%d endpoints: element %d is %v-%d, want it to start at %d", n, j, e.Key, e.End, next)
			}
			if to := netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int)); to != eps[j] {
				t.Fatalf("%d endpoints: element %d goes to %v, want %v", n, j, to, eps[j])
			}
			size := e.End - lo + 1
			smallest, largest = min(smallest, size), max(largest, size)
			next = e.End + 1
		}
		if next != base+nft.EndpointBuckets || largest-smallest > 1 {
			t.Errorf("%d endpoints: ranges end at %d, sizes %d to %d", n, next, smallest, largest)
		}
	}
	if els := nft.EndpointsElements(slot, nil); len(els) != 0 {
		t.Errorf("no endpoints: %d elements", len(els))
	}
}
