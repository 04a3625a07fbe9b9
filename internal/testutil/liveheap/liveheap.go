// Package liveheap reads the live heap the one way every measurement that
// reports it does (the proxier's and the watch layer's benchmarks,
// e2e/cmd/bench's API list floor), so that their figures can be put side
// by side.
package liveheap

import "runtime"

// Bytes is the heap in use, in bytes, after two full collections: a
// sync.Pool's contents survive the first one (in the pool's victim cache)
// and only the second frees them, so one collection would count as live
// what the next one frees. Bytes stops the world twice: call it outside
// timed regions.
func Bytes() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// MiB is bytes in mebibytes, the unit benchmarks report heap in.
func MiB(bytes uint64) float64 { return float64(bytes) / (1 << 20) }
