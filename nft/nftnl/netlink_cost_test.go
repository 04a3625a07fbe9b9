package nftnl

// What do a cold start and one small transaction cost the kernel, as the
// table grows? The benchmarks below build a table in a fresh namespace and
// time batches against it. Their figure is the kernel's time
// (BatchStats.Kernel: from the batch's sendmsg to the reply to the GETGEN
// sent after it), reported as the median kernel-ms of the iterations;
// ns/op is the wall time of the loop, which includes building batches.
//
//	NFTPROXY_BENCH_SIZES=10000x5,100000x10 go test ./nft/nftnl -run '^$' \
//	  -bench Kernel -benchtime 5x -timeout 3h
//
// Sizes are Services x endpoints (default 1000x5). Figures measured with
// these and with designs since deleted are in docs/design-measurements.md.

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// benchSize is a table of Services, each with endpoints.
type benchSize struct{ services, endpoints int }

func (s benchSize) String() string { return fmt.Sprintf("%dx%d", s.services, s.endpoints) }

// benchSizes reads NFTPROXY_BENCH_SIZES (e.g. "10000x5,100000x10").
func benchSizes(b *testing.B) []benchSize {
	spec := os.Getenv("NFTPROXY_BENCH_SIZES")
	if spec == "" {
		spec = "1000x5"
	}
	var out []benchSize
	for _, f := range strings.Split(spec, ",") {
		var s benchSize
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%dx%d", &s.services, &s.endpoints); err != nil || s.services < 2 || s.endpoints < 1 {
			b.Fatalf("NFTPROXY_BENCH_SIZES=%q: want <services>x<endpoints>, services ≥ 2 (%v)", spec, err)
		}
		out = append(out, s)
	}
	return out
}

// reportKernel reports the median of ds as unit, in milliseconds.
func reportKernel(b *testing.B, ds []time.Duration, unit string) {
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Microseconds())/1000, unit)
}

// benchPair times do then undo (one batch each) in every iteration, so
// that the table is the same before each, and reports both medians.
func benchPair(b *testing.B, do, undo func() (time.Duration, error)) {
	var fwd, back []time.Duration
	for b.Loop() {
		d, err := do()
		if err != nil {
			b.Fatal(err)
		}
		fwd = append(fwd, d)
		if undo == nil {
			continue
		}
		u, err := undo()
		if err != nil {
			b.Fatal(err)
		}
		back = append(back, u)
	}
	reportKernel(b, fwd, "kernel-ms")
	reportKernel(b, back, "undo-kernel-ms")
}

// costChange is one change timed against a bed: do, then undo (nil: do
// leaves the table as it found it).
type costChange struct {
	name     string
	do, undo func() (time.Duration, error)
}

// costBed is a table built in a fresh namespace: the kernel time of the
// batches that built it, and the changes to time against it.
type costBed struct {
	build   []costPhase
	changes []costChange
}

type costPhase struct {
	name   string
	kernel time.Duration
}

// benchBeds runs, for each size, a "cold-start" benchmark that builds a
// bed per iteration (reporting each build batch's kernel time), then one
// benchmark per change against a bed built once.
func benchBeds(b *testing.B, build func(b *testing.B, sz benchSize) *costBed) {
	for _, sz := range benchSizes(b) {
		b.Run(sz.String(), func(b *testing.B) {
			b.Run("cold-start", func(b *testing.B) {
				phases := map[string][]time.Duration{}
				var names []string
				for b.Loop() {
					for _, p := range build(b, sz).build {
						if _, ok := phases[p.name]; !ok {
							names = append(names, p.name)
						}
						phases[p.name] = append(phases[p.name], p.kernel)
					}
				}
				for _, name := range names {
					reportKernel(b, phases[name], name+"-kernel-ms")
				}
			})
			bed := build(b, sz)
			for _, c := range bed.changes {
				b.Run(c.name, func(b *testing.B) { benchPair(b, c.do, c.undo) })
			}
		})
	}
}
