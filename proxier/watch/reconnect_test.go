package watch

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nftproxy/nftproxy/internal/testutil"
)

// Errors as client-go returns them.
var (
	errRefused = &url.Error{Op: "Get", URL: "https://10.10.0.1:6443/api/v1/services",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}
	errReset = &url.Error{Op: "Get", URL: "https://10.10.0.1:6443/api/v1/services",
		Err: &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}}
	errEOF          = &url.Error{Op: "Get", URL: "https://10.10.0.1:6443/api/v1/services", Err: io.EOF}
	errNoRoute      = &url.Error{Op: "Get", URL: "https://x", Err: &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}}
	errTimeout      = &url.Error{Op: "Get", URL: "https://x", Err: context.DeadlineExceeded}
	errGoaway       = errors.New("http2: server sent GOAWAY and closed the connection; LastStreamID=1")
	errThrottled    = apierrors.NewTooManyRequests("slow down", 1)
	errGone         = apierrors.NewGone("too old resource version: 41 (42)")
	errInternal     = apierrors.NewInternalError(errors.New("etcd"))
	errUnavailable  = apierrors.NewServiceUnavailable("starting")
	errForbidden    = apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "", errors.New("RBAC"))
	errNotFound     = apierrors.NewNotFound(schema.GroupResource{Resource: "servicecidrs"}, "")
	errUnauthorized = apierrors.NewUnauthorized("token")
	errCert         = &url.Error{Op: "Get", URL: "https://x", Err: x509.UnknownAuthorityError{}}
)

// TestUnreachable: transport failures are "unreachable", every answer of
// the server is not, and neither is the caller's own cancellation; a
// probe's answer other than 200 means "not ready".
func TestUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		unreachable bool
		probe       probeResult
	}{
		{"no error", nil, false, probeReady},
		{"connection refused", errRefused, true, probeUnreachable},
		{"connection reset", errReset, true, probeUnreachable},
		{"EOF", errEOF, true, probeUnreachable},
		{"no route to host", errNoRoute, true, probeUnreachable},
		{"timeout", errTimeout, true, probeUnreachable},
		{"GOAWAY", errGoaway, true, probeUnreachable},
		{"429", errThrottled, false, probeNotReady},
		{"500", errInternal, false, probeNotReady},
		{"503", errUnavailable, false, probeNotReady},
		{"403", errForbidden, false, probeNotReady},
		{"401", errUnauthorized, false, probeNotReady},
		{"404", errNotFound, false, probeNotReady},
		{"TLS", errCert, false, probeNotReady},
		{"wrapped refused", fmt.Errorf("list: %w", errRefused), true, probeUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := unreachable(context.Background(), tc.err); got != tc.unreachable {
				t.Errorf("unreachable = %v, want %v", got, tc.unreachable)
			}
			if got := classify(tc.err); got != tc.probe {
				t.Errorf("classify = %v, want %v", got, tc.probe)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if unreachable(ctx, errTimeout) {
		t.Error("an error after the caller's context ended counts as unreachable")
	}
}

// scriptedProbe answers with results in turn, then probeUnreachable, and
// tells each call on probed.
type scriptedProbe struct {
	mu      sync.Mutex
	results []probeResult
	calls   int
	probed  chan struct{}
}

func newScriptedProbe(results ...probeResult) *scriptedProbe {
	return &scriptedProbe{results: results, probed: make(chan struct{}, 100)}
}

func (p *scriptedProbe) probe(context.Context) probeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	res := probeUnreachable
	if p.calls < len(p.results) {
		res = p.results[p.calls]
	}
	p.calls++
	p.probed <- struct{}{}
	return res
}

func (p *scriptedProbe) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// waitForWaiter returns once something waits on clk (a goroutine blocked
// in clk.After).
func waitForWaiter(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	testutil.Eventually(t, "something to wait on the clock", clk.HasWaiters)
}

func isOpen(g *gate) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		return true
	default:
		return false
	}
}

// TestGate: once shut, the gate stays closed until a probe finds the
// server ready, or a server that answers without being ready has done so
// for the grace period; probes come one interval apart, from one prober.
func TestGate(t *testing.T) {
	const U, N, R = probeUnreachable, probeNotReady, probeReady
	for _, tc := range []struct {
		name   string
		probes []probeResult
		opens  bool // after the last probe
	}{
		{"ready at the first probe", []probeResult{R}, true},
		{"refused, then ready", []probeResult{U, U, U, R}, true},
		{"starting: refused, 403 and 500, then ready", []probeResult{U, N, N, R}, true},
		{"answering but never ready: open after the grace period", []probeResult{N, N, N, N}, true},
		{"unreachable again restarts the grace period", []probeResult{N, N, U, N, N, N, N}, true},
		{"unreachable stays closed", []probeResult{U, U, U, U, U, U}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clk := testingclock.NewFakeClock(start)
			p := newScriptedProbe(tc.probes...)
			g := newGate(clk, p.probe)
			g.jitter, g.spread, g.grace = 0, 0, 3*g.interval
			g.start(ctx)
			if !isOpen(g) {
				t.Fatal("a new gate is closed")
			}
			g.shut("test", "unreachable", errRefused)
			g.shut("test again", "unreachable", errRefused) // no second prober
			released := make(chan time.Time, 1)
			go func() {
				if g.wait(ctx) == nil {
					released <- clk.Now()
				}
			}()
			for i := range tc.probes {
				waitForWaiter(t, clk)
				if isOpen(g) {
					t.Fatalf("open before probe %d", i+1)
				}
				clk.Step(g.interval)
				<-p.probed
			}
			if !tc.opens {
				waitForWaiter(t, clk)
				if isOpen(g) {
					t.Fatal("open after probes that never found the server")
				}
				return
			}
			select {
			case at := <-released:
				if want := start.Add(time.Duration(len(tc.probes)) * g.interval); !at.Equal(want) {
					t.Errorf("released at %v, want %v", at.Sub(start), want.Sub(start))
				}
			case <-time.After(10 * time.Second):
				t.Fatal("wait not released")
			}
			if n := p.count(); n != len(tc.probes) {
				t.Errorf("%d probes, want %d", n, len(tc.probes))
			}
		})
	}
}

// TestGateSpreadsRelists: once the gate reopens, calls that resume go out
// at once, and relists wait until the moment of the spread window the
// reopening drew, so that a cluster's relists come spread over the window;
// a relist before any outage does not wait.
func TestGateSpreadsRelists(t *testing.T) {
	for _, draw := range []float64{0, 0.25, 0.999} {
		t.Run(fmt.Sprint(draw), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			clk := testingclock.NewFakeClock(start)
			p := newScriptedProbe(probeReady)
			g := newGate(clk, p.probe)
			g.jitter, g.random = 0, func() float64 { return draw }
			g.start(ctx)
			call := func(relist bool) <-chan time.Time {
				at := make(chan time.Time, 1)
				go func() {
					if g.do(ctx, "test", relist, func() error { return nil }) == nil {
						at <- clk.Now()
					}
				}()
				return at
			}
			if at := <-call(true); !at.Equal(start) {
				t.Errorf("a relist before any outage went out at %v, want at once", at.Sub(start))
			}
			g.shut("test", "unreachable", errRefused)
			resumed, relisted := call(false), call(true)
			waitForWaiter(t, clk)
			clk.Step(g.interval)
			<-p.probed
			reopened := start.Add(g.interval)
			if at := <-resumed; !at.Equal(reopened) {
				t.Errorf("a resumed watch went out %v after the start, want %v", at.Sub(start), reopened.Sub(start))
			}
			wantAt := reopened.Add(time.Duration(draw * float64(g.spread)))
			if draw > 0 {
				waitForWaiter(t, clk)
				clk.Step(wantAt.Sub(clk.Now()) - time.Nanosecond)
				select {
				case at := <-relisted:
					t.Fatalf("the relist went out at %v, before its moment %v", at.Sub(start), wantAt.Sub(start))
				case <-time.After(10 * time.Millisecond):
				}
				clk.Step(time.Nanosecond)
			}
			if at := <-relisted; !at.Equal(wantAt) {
				t.Errorf("the relist went out %v after the start, want %v", at.Sub(start), wantAt.Sub(start))
			}
			if at := <-call(true); !at.Equal(wantAt) {
				t.Errorf("a relist after the window went out at %v, want at once (%v)", at.Sub(start), wantAt.Sub(start))
			}
		})
	}
}

// TestGateWaitEndsWithContext: a caller waiting at a closed gate gets its
// context's error when the context ends.
func TestGateWaitEndsWithContext(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	g := newGate(clk, newScriptedProbe().probe)
	g.start(context.Background())
	g.shut("test", "unreachable", errRefused)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.wait(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("wait = %v, want context.Canceled", err)
	}
}

// stepUntil steps clk by step whenever something waits on it, until done
// is closed or it has stepped limit, and returns how far it stepped.
func stepUntil(t *testing.T, clk *testingclock.FakeClock, step, limit time.Duration, done <-chan struct{}) time.Duration {
	t.Helper()
	var stepped time.Duration
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		select {
		case <-done:
			return stepped
		default:
		}
		if stepped < limit && clk.HasWaiters() {
			clk.Step(step)
			stepped += step
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done after stepping %v", stepped)
		}
	}
}

// scriptedLW returns a gatedLW whose calls fail with errs in turn, then
// succeed, counting them.
func scriptedLW(g *gate, errs ...error) (*gatedLW, *int) {
	var mu sync.Mutex
	calls := new(int)
	next := func() error {
		mu.Lock()
		defer mu.Unlock()
		*calls++
		if *calls <= len(errs) {
			return errs[*calls-1]
		}
		return nil
	}
	lw := newGatedLW(g, "services", nil,
		func(context.Context, metav1.ListOptions) (kruntime.Object, error) {
			if err := next(); err != nil {
				return nil, err
			}
			return &metav1.List{}, nil
		},
		func(context.Context, metav1.ListOptions) (watch.Interface, error) {
			if err := next(); err != nil {
				return nil, err
			}
			return watch.NewEmptyWatch(), nil
		})
	return lw, calls
}

// TestGatedList: a List that finds the server unreachable waits at the
// gate and tries again once the server is ready, so that the reflector
// never sees the failure; answers of the server, errors included, pass
// at once, but a 403 from a server that is not ready (a restarted one
// whose authorizer has not loaded the RBAC rules) waits like an
// unreachable server, and passes once the grace period has opened the
// gate on a server that never became ready.
func TestGatedList(t *testing.T) {
	const N, R = probeNotReady, probeReady
	for _, tc := range []struct {
		name    string
		errs    []error
		probes  []probeResult // none: always ready
		wantErr error
		calls   int
		waited  int // probe intervals
	}{
		{"answer", nil, nil, nil, 1, 0},
		{"refused, then answer", []error{errRefused}, nil, nil, 2, 1},
		{"refused, reset, EOF, timeout, then answer", []error{errRefused, errReset, errEOF, errTimeout}, nil, nil, 5, 4},
		{"429 is client-go's", []error{errThrottled}, nil, errThrottled, 1, 0},
		{"500 is client-go's", []error{errInternal}, nil, errInternal, 1, 0},
		{"403 from a ready server is the reflector's", []error{errForbidden}, nil, errForbidden, 1, 0},
		{"refused, then 403 from a ready server", []error{errRefused, errForbidden}, nil, errForbidden, 2, 1},
		{"403 from a server not ready waits until it is", []error{errForbidden}, []probeResult{N, N, R}, nil, 2, 2},
		{"refused, then 403 before the RBAC rules, then answer", []error{errRefused, errForbidden}, []probeResult{R, N, R}, nil, 3, 2},
		{"403 from a server never ready passes after the grace period", []error{errForbidden, errForbidden},
			[]probeResult{N, N, N, N, N}, errForbidden, 2, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			clk := testingclock.NewFakeClock(time.Now())
			probes := tc.probes
			if probes == nil {
				probes = []probeResult{R, R, R, R}
			}
			g := newGate(clk, newScriptedProbe(probes...).probe)
			g.jitter, g.spread, g.grace = 0, 0, 3*g.interval
			g.start(ctx)
			lw, calls := scriptedLW(g, tc.errs...)
			done := make(chan struct{})
			var err error
			go func() {
				defer close(done)
				_, err = lw.ListWithContext(ctx, metav1.ListOptions{})
			}()
			waited := stepUntil(t, clk, g.interval, time.Hour, done)
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("List = %v, want %v", err, tc.wantErr)
			}
			if *calls != tc.calls || waited != time.Duration(tc.waited)*g.interval {
				t.Errorf("%d calls after waiting %v, want %d after %v", *calls, waited, tc.calls,
					time.Duration(tc.waited)*g.interval)
			}
			if !isOpen(g) {
				t.Error("gate closed after the List returned")
			}
		})
	}
}

// TestGatedWatch: a Watch that finds the server unreachable waits at the
// gate and asks again, for the same resource version, once the server is
// ready (a restarted server resumes a watch where it can); the reflector
// never sees the failure. Answers pass unchanged, a 410 too (the reflector
// relists then).
func TestGatedWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clk := testingclock.NewFakeClock(time.Now())
	g := newGate(clk, newScriptedProbe(probeUnreachable, probeReady, probeReady).probe)
	g.jitter, g.spread = 0, 0
	g.start(ctx)
	var asked []string
	errs := []error{errRefused, errReset, nil, errGone}
	lw := newGatedLW(g, "services", nil, nil,
		func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			asked = append(asked, o.ResourceVersion)
			err := errs[0]
			errs = errs[1:]
			if err != nil {
				return nil, err
			}
			return watch.NewEmptyWatch(), nil
		})
	done := make(chan struct{})
	var w watch.Interface
	var err error
	go func() {
		defer close(done)
		w, err = lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "42"})
	}()
	// Refused: the gate shuts, an unreachable probe, a ready one; reset:
	// it shuts again, a ready probe; then the watch is made.
	if waited := stepUntil(t, clk, g.interval, time.Hour, done); waited != 3*g.interval {
		t.Errorf("Watch waited %v, want 3 probe intervals", waited)
	}
	if err != nil || w == nil {
		t.Fatalf("Watch = %v, %v; want the watch made once the server was ready", w, err)
	}
	if len(asked) != 3 || asked[0] != "42" || asked[1] != "42" || asked[2] != "42" {
		t.Errorf("watches asked from resource versions %q, want 42 three times", asked)
	}
	if _, err := lw.WatchWithContext(ctx, metav1.ListOptions{ResourceVersion: "42"}); !apierrors.IsGone(err) {
		t.Errorf("Watch answered 410 = %v, want the 410 unchanged", err)
	}
}

// TestRelists: a Watch that streams the objects first is a relist; one
// from a resource version resumes.
func TestRelists(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		opts metav1.ListOptions
		want bool
	}{
		{metav1.ListOptions{ResourceVersion: "42"}, false},
		{metav1.ListOptions{ResourceVersion: "42", SendInitialEvents: &no}, false},
		{metav1.ListOptions{ResourceVersion: "", SendInitialEvents: &yes}, true},
		{metav1.ListOptions{ResourceVersion: "42", SendInitialEvents: &yes}, true},
		{metav1.ListOptions{ResourceVersion: ""}, true},
		{metav1.ListOptions{ResourceVersion: "0"}, true},
	} {
		if got := relists(tc.opts); got != tc.want {
			t.Errorf("relists(%+v) = %v, want %v", tc.opts, got, tc.want)
		}
	}
}
