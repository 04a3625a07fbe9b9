package scenarios

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// switchTraffic is the traffic of a switch-over test: from one client pod,
// a new TCP connection through a Service's ClusterIPs every
// switchDialInterval (IPv4 and IPv6 in turn), and switchHeld long-lived
// connections per family that exchange a line every switchHeldInterval.
// Every attempt and round trip is counted under the step that was current
// when it began.
type switchTraffic struct {
	t       *testing.T
	from    testbed.Netns
	oneShot []netip.AddrPort // the ClusterIPs' port answered once per connection
	held    []netip.AddrPort // the port whose connections stay open

	mu    sync.Mutex
	steps []*switchStep

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// switchStep counts what happened to the traffic during one step.
type switchStep struct {
	name     string
	start    time.Time
	took     time.Duration // from start to the next step
	attempts int           // new connections tried
	failures map[string]int
	answered map[string]int // by backend name
	trips    int            // round trips over long-lived connections
	broken   map[string]int // long-lived connections that failed, by error
}

const (
	switchDialInterval = 20 * time.Millisecond
	switchHeldInterval = 100 * time.Millisecond
	switchHeld         = 2 // per family
	// switchTimeout bounds a connection attempt and a round trip: far
	// above the milliseconds they take, so that a loaded machine does not
	// pass for a dropped packet.
	switchTimeout = 2 * time.Second
)

// startSwitchTraffic starts the traffic under step first. oneShot and held
// are the Service's ports on each ClusterIP.
func startSwitchTraffic(t *testing.T, from testbed.Netns, oneShot, held []netip.AddrPort, first string) *switchTraffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &switchTraffic{t: t, from: from, oneShot: oneShot, held: held, cancel: cancel}
	tr.Step(first)
	tr.wg.Add(1)
	go func() {
		defer tr.wg.Done()
		tr.dialLoop(ctx)
	}()
	for _, addr := range held {
		for range switchHeld {
			tr.wg.Add(1)
			go func() {
				defer tr.wg.Done()
				tr.holdLoop(ctx, addr)
			}()
		}
	}
	t.Cleanup(tr.stop)
	return tr
}

// Step starts counting under a new step.
func (tr *switchTraffic) Step(name string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	now := time.Now()
	if n := len(tr.steps); n > 0 {
		tr.steps[n-1].took = now.Sub(tr.steps[n-1].start)
	}
	tr.steps = append(tr.steps, &switchStep{name: name, start: now, failures: map[string]int{},
		answered: map[string]int{}, broken: map[string]int{}})
	tr.t.Logf("SWITCH step %d: %s", len(tr.steps)-1, name)
}

// Stop ends the traffic and returns the steps.
func (tr *switchTraffic) Stop() []*switchStep {
	tr.stop()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.steps
}

func (tr *switchTraffic) stop() {
	tr.cancel()
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if last := tr.steps[len(tr.steps)-1]; last.took == 0 {
		last.took = time.Since(last.start)
	}
}

// current returns the step under way.
func (tr *switchTraffic) current() *switchStep {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.steps[len(tr.steps)-1]
}

// record runs fn on step s under the lock.
func (tr *switchTraffic) record(s *switchStep, fn func(s *switchStep)) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	fn(s)
}

// Answered reports how many new connections of the current step backend
// answered.
func (tr *switchTraffic) Answered(backend string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.steps[len(tr.steps)-1].answered[backend]
}

// dialLoop starts a connection attempt every switchDialInterval, each in
// a goroutine of its own, so that an attempt waiting for its timeout does
// not hold the next ones back.
func (tr *switchTraffic) dialLoop(ctx context.Context) {
	var attempts sync.WaitGroup
	defer attempts.Wait()
	tick := time.NewTicker(switchDialInterval)
	defer tick.Stop()
	for i := 0; ; i++ {
		addr := tr.oneShot[i%len(tr.oneShot)]
		s := tr.current()
		attempts.Go(func() {
			name, err := tr.dialOnce(ctx, addr)
			if ctx.Err() != nil {
				return // stopped during the attempt: not the proxy's doing
			}
			tr.record(s, func(s *switchStep) {
				s.attempts++
				if err != nil {
					s.failures[fmt.Sprintf("%s: %s", addr, switchClassify(err))]++
				} else {
					s.answered[name]++
				}
			})
		})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// dialOnce opens a connection to addr, reads the backend's line and
// returns the backend's name.
func (tr *switchTraffic) dialOnce(ctx context.Context, addr netip.AddrPort) (string, error) {
	dctx, cancel := context.WithTimeout(ctx, switchTimeout)
	defer cancel()
	c, err := tr.from.DialContext(dctx, "tcp", addr.String())
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(switchTimeout))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	name, _, _ := strings.Cut(line, " ")
	return name, nil
}

// holdLoop keeps a connection to addr open and exchanges a line over it
// every switchHeldInterval; when a round trip fails, the connection counts
// as broken and a new one is opened.
func (tr *switchTraffic) holdLoop(ctx context.Context, addr netip.AddrPort) {
	var c net.Conn
	var r *bufio.Reader
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for ctx.Err() == nil {
		s := tr.current()
		var err error
		if c == nil {
			dctx, cancel := context.WithTimeout(ctx, switchTimeout)
			c, err = tr.from.DialContext(dctx, "tcp", addr.String())
			cancel()
			if err == nil {
				r = bufio.NewReader(c)
				_ = c.SetDeadline(time.Now().Add(switchTimeout))
				_, err = r.ReadString('\n') // the greeting
			}
		} else {
			_ = c.SetDeadline(time.Now().Add(switchTimeout))
			if _, err = c.Write([]byte("ping\n")); err == nil {
				_, err = r.ReadString('\n')
			}
		}
		if ctx.Err() != nil {
			return
		}
		tr.record(s, func(s *switchStep) {
			if err != nil {
				s.broken[fmt.Sprintf("%s: %s", addr, switchClassify(err))]++
			} else {
				s.trips++
			}
		})
		if err != nil && c != nil {
			c.Close()
			c = nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(switchHeldInterval):
		}
	}
}

func switchClassify(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return err.Error()
}

// switchReport prints the steps as a table and fails the test for every
// step with a failed new connection or a broken long-lived one, and for
// a step without traffic of both kinds.
func switchReport(t *testing.T, steps []*switchStep) {
	var b strings.Builder
	fmt.Fprintf(&b, "%-58s %7s %9s %7s %7s %7s  %s\n", "step", "time", "attempts", "failed", "trips", "broken", "answered by")
	for _, s := range steps {
		fmt.Fprintf(&b, "%-58s %7s %9d %7d %7d %7d  %v\n", s.name, s.took.Round(10*time.Millisecond), s.attempts,
			sum(s.failures), s.trips, sum(s.broken), s.answered)
	}
	t.Log("\n" + b.String())
	for _, s := range steps {
		if len(s.failures) > 0 || len(s.broken) > 0 {
			t.Errorf("step %q: failed new connections %v, broken long-lived connections %v", s.name, s.failures, s.broken)
		}
		if s.attempts == 0 || s.trips == 0 {
			t.Errorf("step %q: %d new connections and %d round trips over long-lived ones, want some of both", s.name, s.attempts, s.trips)
		}
	}
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
