package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Neighbours: other processes on the node that read the ruleset, each
// while the churn runs, and single changes timed meanwhile
// (docs/operations.md, "A busy node"). A proxy that waits for readers
// must not let one that never ends, or one stuck in the middle of a dump,
// hold its changes; and the listings it waits for must still finish.

// neighbour is one case: its name, and how to start it on the proxy's
// node (stop ends it).
type neighbour struct {
	name  string
	start func(b *bench, s *started, r *result) (stop func() neighbourListings)
}

// neighbourListings are the `nft list ruleset` runs of a neighbour that
// lists: their durations, and how many did not finish within the limit.
type neighbourListings struct {
	seconds  []time.Duration
	timeouts int
}

// neighbourResult is what one case measured.
type neighbourResult struct {
	name     string
	changes  []time.Duration
	listings neighbourListings
}

var neighbours = []neighbour{
	{"nft monitor (listens, never dumps)", func(b *bench, s *started, r *result) func() neighbourListings {
		p := s.node.Start("nft", "monitor")
		return func() neighbourListings { p.Stop(5 * time.Second); return neighbourListings{} }
	}},
	{"nft list ruleset every 2 s", func(b *bench, s *started, r *result) func() neighbourListings {
		return b.lister(s, 2*time.Second, r.rulesetIdle)
	}},
	{"nft list ruleset back to back", func(b *bench, s *started, r *result) func() neighbourListings {
		return b.lister(s, 0, r.rulesetIdle)
	}},
	{"a reader stuck in the middle of a dump", func(b *bench, s *started, r *result) func() neighbourListings {
		p := b.stuckReader(s)
		return func() neighbourListings { p(); return neighbourListings{} }
	}},
}

// measureNeighbours runs every case on s's node: the neighbour starts,
// 2 s later the changes are timed (each after a random pause of up to a
// second, not in step with the proxy's syncs or the listings), then it
// stops. The churn must be running, and r.rulesetIdle measured.
func (b *bench) measureNeighbours(s *started, r *result) {
	rnd := rand.New(rand.NewPCG(3, 4))
	for _, nb := range neighbours {
		stop := nb.start(b, s, r)
		time.Sleep(2 * time.Second)
		res := neighbourResult{name: nb.name}
		for range b.c.NeighbourChanges {
			lat, failures, err := b.move(s.client)
			must(b.tb, err)
			r.probeFailures = r.probeFailures.merge(failures)
			res.changes = append(res.changes, lat)
			time.Sleep(time.Duration(rnd.Int64N(int64(time.Second))))
		}
		res.listings = stop()
		r.neighbours = append(r.neighbours, res)
		fmt.Printf("with %s: changes p50 %v max %v", nb.name, pct(res.changes, 0.5), pct(res.changes, 1))
		if l := res.listings.seconds; len(l) > 0 {
			fmt.Printf("; %d nft list ruleset: median %v, max %v, %d unfinished (idle %v)", len(l), pct(l, 0.5).Round(time.Millisecond),
				pct(l, 1).Round(time.Millisecond), res.listings.timeouts, r.rulesetIdle.Round(time.Millisecond))
		}
		fmt.Println()
	}
}

// lister runs `nft list ruleset` on s's node, every interval (0: one after
// the other), each for at most listTimeout(idle), until the returned
// function is called. The listing under way then is stopped, and counted
// unfinished if it already ran for twice idle, and for a second at least:
// at a few Services a listing takes milliseconds, and one that the stop
// catches a few milliseconds late has not failed to finish.
func (b *bench) lister(s *started, interval, idle time.Duration) func() neighbourListings {
	var mu sync.Mutex
	var out neighbourListings
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			begun := time.Now()
			lctx, lcancel := context.WithTimeout(ctx, listTimeout(idle))
			_, err := s.node.Exec(lctx, "nft", "list", "ruleset")
			d := time.Since(begun)
			lcancel()
			mu.Lock()
			switch {
			case err == nil:
				out.seconds = append(out.seconds, d)
			case ctx.Err() == nil || d >= max(2*idle, time.Second):
				out.seconds = append(out.seconds, d)
				out.timeouts++
			}
			mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(max(interval-d, 0)):
			}
		}
	}()
	return func() neighbourListings {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return out
	}
}

// listRuleset times one `nft list ruleset` on s's node.
func (b *bench) listRuleset(s *started) time.Duration {
	start := time.Now()
	if _, err := s.node.Exec(context.Background(), "nft", "list", "ruleset"); err != nil {
		b.tb.Fatalf("%s: nft list ruleset: %v", s.kind, err)
	}
	return time.Since(start)
}

// stuckReader starts a process on s's node that asks for a dump of the
// proxy's service-ips map, reads the first datagram and stops reading;
// the returned function ends it.
func (b *bench) stuckReader(s *started) func() {
	p := s.node.Start(b.probeBin, "stuck-reader", "--family", "ip", "--table", proxyTable(s.kind), "--set", "service-ips")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must(b.tb, p.WaitForLog(ctx, "stuck"))
	return func() { p.Stop(5 * time.Second) }
}

// rulesetIdle times `nft list ruleset` on the idle node (median of
// listings).
func (b *bench) rulesetIdle(s *started, r *result) {
	var ds []time.Duration
	for range listings {
		ds = append(ds, b.listRuleset(s))
	}
	r.rulesetIdle = pct(ds, 0.5)
	fmt.Printf("nft list ruleset, idle: median %v\n", r.rulesetIdle.Round(time.Millisecond))
}

// repairWithStuckReader is the last phase: the proxy starts again on its
// node, with tables another process may change (nftproxy:
// --own-tables=false, as on kernels before 6.9; kube-proxy's never are
// owned), the churn runs, a reader is stuck in the middle of a dump, and
// the proxy's table is deleted: the time until svc-0 answers again
// through its ClusterIP.
func (b *bench) repairWithStuckReader(node *started, r *result) {
	s := &started{kind: node.kind, node: node.node, client: node.client, t0: time.Now()}
	args := b.command(s.kind, s.node)
	if s.kind == "nftproxy" {
		args = append(args, "--own-tables=false")
	}
	s.proc = s.node.Start(args...)
	defer s.proc.Stop(10 * time.Second)
	b.waitFirstSync(s)
	_, _, err := s.client.waitAnswer(b.stableAddr, "srv-0", time.Now(), 100*time.Millisecond, 2*time.Millisecond, time.Minute)
	must(b.tb, err)
	ch := b.startChurn(b.c.ChurnRate)
	stop := b.stuckReader(s)
	time.Sleep(3 * time.Second)
	deleted := time.Now()
	if out, err := s.node.Exec(context.Background(), "nft", "delete", "table", "ip", proxyTable(s.kind)); err != nil {
		b.tb.Fatalf("%s: nft delete table: %v\n%s", s.kind, err, out)
	}
	r.repairStuck, _, err = s.client.waitAnswer(b.stableAddr, "srv-0", deleted, 100*time.Millisecond, 2*time.Millisecond, 5*time.Minute)
	must(b.tb, err)
	stop()
	if _, failures, _ := ch.stop(); failures > 0 {
		b.tb.Fatalf("%d churn updates failed", failures)
	}
	fmt.Printf("table deleted under churn, a reader stuck in a dump: svc-0 answered again %v later\n", r.repairStuck.Round(time.Millisecond))
}
