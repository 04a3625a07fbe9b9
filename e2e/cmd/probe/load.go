package main

// `probe load`: a steady stream of new TCP connections and a number of long-lived ones to
// one address, counting every one that fails: the load a fault test runs while it breaks
// things.
//
// New connections are opened at --rate per second, each from a new source port; one
// succeeds when the server's "NAME PEER" line arrives within --timeout. Long-lived
// connections (--hold of them, opened at the start) send "ping" every --check and must get
// it echoed (serve --echo) within --timeout; one that fails is broken and not reopened.
//
// Output, one event per line, times as Unix nanoseconds:
//
//	ready held=N at=T                  the long-lived connections are open
//	fail outcome=WORD at=T             a new connection failed (refused, timeout, reset, ...)
//	broken conn=I err=TEXT at=T        a long-lived connection broke
//	summary attempted=N answered=N failed=N held=N broken=N at=T
//
// The summary is printed when --duration is over or on SIGTERM/SIGINT, after the attempts
// under way have finished.

import (
	"bufio"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func loadMain(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	addr := fs.String("addr", "", "HOST:PORT of a TCP server (serve --echo for --hold); HOST an IP address (required)")
	rate := fs.Float64("rate", 100, "new connections per second")
	hold := fs.Int("hold", 0, "long-lived connections")
	check := fs.Duration("check", 100*time.Millisecond, "pause between pings on a long-lived connection")
	timeout := fs.Duration("timeout", time.Second, "how long to wait for each answer")
	duration := fs.Duration("duration", 0, "how long to run (0: until SIGTERM or SIGINT)")
	fs.Parse(args)
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	if *rate <= 0 {
		return fmt.Errorf("--rate %v: must be positive", *rate)
	}
	l := &loader{addr: ap, timeout: *timeout, check: *check, stop: make(chan struct{})}
	if err := l.openHeld(*hold); err != nil {
		return err
	}
	l.printf("ready held=%d", *hold)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	var end <-chan time.Time
	if *duration > 0 {
		end = time.After(*duration)
	}
	tick := time.NewTicker(time.Duration(float64(time.Second) / *rate))
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-tick.C:
			l.attempts.Add(1)
			go l.attempt()
		case <-sig:
			running = false
		case <-end:
			running = false
		}
	}
	close(l.stop)
	l.wg.Wait()
	l.printf("summary attempted=%d answered=%d failed=%d held=%d broken=%d",
		l.done.Load(), l.answered.Load(), l.done.Load()-l.answered.Load(), *hold, l.broken.Load())
	return nil
}

type loader struct {
	addr           netip.AddrPort
	timeout, check time.Duration
	stop           chan struct{}
	wg             sync.WaitGroup
	out            sync.Mutex
	attempts       atomic.Int64 // started
	done, answered atomic.Int64 // finished, and of those answered
	broken         atomic.Int64
}

func (l *loader) printf(format string, args ...any) {
	l.out.Lock()
	defer l.out.Unlock()
	fmt.Printf(format+" at=%d\n", append(args, time.Now().UnixNano())...)
}

// attempt opens one new connection and waits for the server's line.
func (l *loader) attempt() {
	l.wg.Add(1)
	defer l.wg.Done()
	got := dialTCP(dialOptions{proto: "tcp", addr: l.addr, timeout: l.timeout})
	l.done.Add(1)
	if f := strings.Fields(got); len(f) == 2 && f[0] != "error:" {
		l.answered.Add(1)
		return
	}
	l.printf("fail outcome=%s", strings.ReplaceAll(got, " ", "_"))
}

// openHeld opens n long-lived connections (each must answer at once) and
// starts checking them.
func (l *loader) openHeld(n int) error {
	for i := range n {
		c, err := net.DialTimeout("tcp", l.addr.String(), l.timeout)
		if err != nil {
			return fmt.Errorf("long-lived connection %d: %w", i, err)
		}
		r := bufio.NewReader(c)
		c.SetReadDeadline(time.Now().Add(l.timeout))
		if _, err := r.ReadString('\n'); err != nil {
			return fmt.Errorf("long-lived connection %d: no greeting: %w", i, err)
		}
		l.wg.Add(1)
		go l.keep(i, c, r)
	}
	return nil
}

// keep pings one long-lived connection until the load stops or it breaks.
func (l *loader) keep(i int, c net.Conn, r *bufio.Reader) {
	defer l.wg.Done()
	defer c.Close()
	t := time.NewTicker(l.check)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		c.SetDeadline(time.Now().Add(l.timeout))
		_, err := c.Write([]byte("ping\n"))
		var echo string
		if err == nil {
			echo, err = r.ReadString('\n')
		}
		if err == nil && echo != "ping\n" {
			err = fmt.Errorf("echo %q", echo)
		}
		if err != nil {
			l.broken.Add(1)
			l.printf("broken conn=%d err=%s", i, strings.ReplaceAll(classify(err), " ", "_"))
			return
		}
	}
}
