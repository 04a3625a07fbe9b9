package watch

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Getting the informers back quickly after the API server was unreachable.
//
// client-go's reflector retries a List or Watch that failed to connect
// after a delay that doubles from 0.8 s to a 30 s cap, plus up to as much
// again of jitter, and forgets the delay only 2 minutes after its last
// reset: after a minute-long outage, a change waited tens of seconds after
// the server was back before it reached the proxy. The informers' calls
// therefore go through a gate (gatedLW): when a call finds the server
// unreachable the gate closes, every later call waits at it instead of
// failing into the reflector's backoff, and one prober asks /readyz until
// the server is ready, then opens it. A watch that waited asks again from
// its resource version, which the server resumes where it can: after an
// outage, only the watches it cannot resume relist (listwatch.go).
//
// Every node of a cluster runs a gate, and all of them see the server ready
// within a probe interval of one another, when its watch cache has just
// been filled. Resumed watches cost the server little and go out at once;
// a relist (a List, or a Watch that streams the objects first) costs it
// every object, so one that comes soon after the gate's reopening waits
// until a moment of the resumeSpread after it, drawn at the reopening: a
// cluster's relists come spread over the window rather than together, and
// a node still sees a change within a couple of seconds.
//
// Answers with a status (429, 5xx, 403, …) are not "unreachable": they
// stay client-go's and the reflector's (429 and 5xx with Retry-After are
// retried after the delay the server asked for), and a busy server is not
// asked harder. One answer is held like an unreachable server: a 403 from
// a server that is not ready. A restarted server refuses every call until
// its authorizer has loaded the RBAC rules, and a refused watch makes the
// reflector relist; so a 403 is checked with one probe, and the call waits
// at the gate unless the server is ready (then the 403 is its answer).
// After the grace period has opened the gate on a server that never became
// ready, 403s pass until a probe finds it ready again: a server that
// refuses both us and our probes is not waited on forever.
const (
	// probeInterval is the pause before each readiness probe while the
	// gate is closed, plus up to probeJitter of it at random (so that the
	// proxies of a cluster spread their probes and their relists).
	probeInterval = 500 * time.Millisecond
	probeJitter   = 0.2
	// probeTimeout bounds one probe (a blackholed server never answers).
	probeTimeout = 2 * time.Second
	// resumeSpread is the window after the gate's reopening that relists
	// are spread over.
	resumeSpread = 2 * time.Second
	// notReadyGrace is how long a server that is reachable but not ready
	// (its /readyz fails, and a check unrelated to what we read may fail
	// for long, or refuses us) holds the calls before they go out anyway.
	notReadyGrace = 10 * time.Second
)

// probeResult is what a readiness probe found.
type probeResult int

const (
	probeUnreachable probeResult = iota // no answer: connection refused, reset, timeout
	probeNotReady                       // any other answer or error
	probeReady                          // 200
)

// gate holds calls while the API server is unreachable. It is open at
// first: a call finding the server unreachable closes it.
type gate struct {
	clock    clock.Clock
	probe    func(context.Context) probeResult
	interval time.Duration
	jitter   float64        // fraction of interval added at random
	spread   time.Duration  // see resumeSpread
	random   func() float64 // in [0, 1)
	grace    time.Duration  // see notReadyGrace

	mu       sync.Mutex
	ctx      context.Context // the prober's lifetime, from start
	open     chan struct{}   // closed while calls may go out
	closed   time.Time       // when the gate last closed
	relistAt time.Time       // relists wait until then (see resumeSpread)
	// graceOpened: the last reopening was by the grace period, not by a
	// ready probe; 403s pass until the next one.
	graceOpened bool
}

func newGate(clk clock.Clock, probe func(context.Context) probeResult) *gate {
	g := &gate{clock: clk, probe: probe, interval: probeInterval, jitter: probeJitter, spread: resumeSpread, random: rand.Float64,
		grace: notReadyGrace, ctx: context.Background(), open: make(chan struct{})}
	close(g.open)
	return g
}

// start sets the lifetime of the probers the gate starts.
func (g *gate) start(ctx context.Context) {
	g.mu.Lock()
	g.ctx = ctx
	g.mu.Unlock()
}

// wait blocks while the gate is closed.
func (g *gate) wait(ctx context.Context) error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// shut records that a call (what) found the server unreachable, or not
// ready (why): later calls wait until a probe finds it ready.
func (g *gate) shut(what, why string, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		return // closed already; its prober runs
	}
	g.open = make(chan struct{})
	g.closed = g.clock.Now()
	klog.InfoS("API server "+why+"; holding the watches until it is ready", "call", what, "err", err)
	go g.probeUntilReady(g.ctx, g.open)
}

// holdRefused reports whether a call (what) refused with err (a 403)
// should wait at the gate: when one probe finds the server not ready, it
// shuts the gate and does.
func (g *gate) holdRefused(ctx context.Context, what string, err error) bool {
	g.mu.Lock()
	graceOpened := g.graceOpened
	g.mu.Unlock()
	if graceOpened || g.probe(ctx) == probeReady {
		return false
	}
	g.shut(what, "not ready", err)
	return true
}

// probeUntilReady probes every interval until the server is ready, or has
// been reachable but not ready for the grace period, and opens the gate.
func (g *gate) probeUntilReady(ctx context.Context, open chan struct{}) {
	var answering time.Time // since when probes reach the server; zero: they do not
	for {
		delay := g.interval + time.Duration(g.jitter*g.random()*float64(g.interval))
		select {
		case <-ctx.Done():
			return
		case <-g.clock.After(delay):
		}
		res := g.probe(ctx)
		now := g.clock.Now()
		switch {
		case res == probeReady:
			g.reopen(open, now, false)
			return
		case res == probeUnreachable:
			answering = time.Time{}
		case answering.IsZero():
			answering = now
		}
		if !answering.IsZero() && now.Sub(answering) >= g.grace {
			g.reopen(open, now, true)
			return
		}
	}
}

// reopen opens the gate, ready or by the grace period, and draws the
// moment of the spread window from which relists may go out.
func (g *gate) reopen(open chan struct{}, now time.Time, grace bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.relistAt = now.Add(time.Duration(g.random() * float64(g.spread)))
	g.graceOpened = grace
	close(open)
	why := "ready"
	if grace {
		why = "reachable but not ready"
	}
	klog.InfoS("API server back; resuming the watches", "server", why, "after", now.Sub(g.closed),
		"relistsFrom", g.relistAt.Sub(now))
}

// waitRelist blocks a relist until the moment the last reopening drew.
func (g *gate) waitRelist(ctx context.Context) error {
	g.mu.Lock()
	at := g.relistAt
	g.mu.Unlock()
	d := at.Sub(g.clock.Now())
	if d <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-g.clock.After(d):
		return nil
	}
}

// do calls call until it returns something other than an unreachable
// server or a refusal from a server that is not ready, waiting at the gate
// before each attempt, and a relist also for its moment of the spread
// window.
func (g *gate) do(ctx context.Context, what string, relist bool, call func() error) error {
	for {
		if err := g.wait(ctx); err != nil {
			return err
		}
		if relist {
			if err := g.waitRelist(ctx); err != nil {
				return err
			}
		}
		err := call()
		switch {
		case unreachable(ctx, err):
			g.shut(what, "unreachable", err)
		case ctx.Err() == nil && apierrors.IsForbidden(err) && g.holdRefused(ctx, what, err):
		default:
			return err
		}
	}
}

// unreachable reports whether err says the API server could not be
// reached, or the connection to it broke, rather than that it answered.
// Errors after ctx ended are the caller's own.
func unreachable(ctx context.Context, err error) bool {
	return ctx.Err() == nil && transportError(err)
}

// transportError reports whether err is a failure to reach the server or a
// broken connection, not an answer.
func transportError(err error) bool {
	if err == nil {
		return false
	}
	if answer(err) != nil {
		return false
	}
	for _, errno := range []syscall.Errno{syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EHOSTUNREACH,
		syscall.ENETUNREACH, syscall.ETIMEDOUT, syscall.EPIPE} {
		if errors.Is(err, errno) {
			return true
		}
	}
	if utilnet.IsProbableEOF(err) || utilnet.IsHTTP2ConnectionLost(err) {
		return true
	}
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// answer returns the status the server answered with, if err holds one.
func answer(err error) apierrors.APIStatus {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status
	}
	return nil
}

// classify turns the error of a readiness probe into its result: only a
// 200 is ready. Any status but 200 is not: a starting server answers 403
// before its authorizer has loaded the RBAC rules, and the calls would be
// refused too. Neither is an error that is no answer and no transport
// failure (TLS, DNS): the calls would likely fail alike. A server that
// always refuses /readyz to us, or such an error that persists, costs
// notReadyGrace at each outage.
func classify(err error) probeResult {
	switch {
	case err == nil:
		return probeReady
	case transportError(err): // the probe's own timeout included
		return probeUnreachable
	default:
		return probeNotReady
	}
}

// readyzProbe asks the API server's /readyz, which every authenticated
// user may read (ClusterRole system:public-info-viewer). Clients without a
// REST client (fakes) are asked for their version instead.
func readyzProbe(client kubernetes.Interface) func(context.Context) probeResult {
	rc := client.Discovery().RESTClient()
	if rc == nil {
		return func(context.Context) probeResult {
			_, err := client.Discovery().ServerVersion()
			return classify(err)
		}
	}
	return func(ctx context.Context) probeResult {
		ctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		err := rc.Get().AbsPath("/readyz").Do(ctx).Error()
		klog.V(4).InfoS("Probed the API server's /readyz", "err", err)
		return classify(err)
	}
}
