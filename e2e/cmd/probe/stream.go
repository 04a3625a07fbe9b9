package main

// `probe stream`: one long-lived flow, the situation of a DNS client.
//
// A UDP stream sends a datagram every --interval from one socket bound to one source port,
// so conntrack keeps a single flow for the whole run, and reads the servers' "NAME PEER"
// answers. An SCTP stream sends an INIT every --interval from one source port with one
// initiate tag and reads the INIT-ACKs (their State Cookie is "NAME PEER"); it never
// completes or aborts the association, so conntrack keeps one entry as well.
//
// Output, one event per line, "EVENT key=value ...", times as Unix nanoseconds (the test
// process shares the clock):
//
//	start proto=udp local=IP:PORT remote=IP:PORT interval=10ms at=T
//	first name=NAME peer=PEER seq=N at=T      first answer from a backend NAME
//	switch from=X to=Y since=T0 at=T          the outcome changed: X and Y are backend
//	                                          names, "refused" (ICMP port unreachable or
//	                                          SCTP ABORT) or "none" (before any outcome);
//	                                          T0 is the last time X was seen (0 for none)
//	gap ms=N from=T1 to=T2                    no answer between T1 and T2, N >= --gap
//	error msg=... at=T                        first occurrence of an unexpected error text
//	summary sent=N answers=N refused=N errors=N longest_gap_ms=N last=NAME last_at=T
//	        counts=a:N,b:N lasts=a:T,b:T at=T     (one line; lasts: last answer per name)
//
// The summary is printed when --duration is over or on SIGTERM/SIGINT; longest_gap_ms
// includes the gap still open at the end.

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func streamMain(args []string) error {
	fs := flag.NewFlagSet("stream", flag.ExitOnError)
	proto := fs.String("proto", "udp", "udp or sctp")
	addr := fs.String("addr", "", "HOST:PORT to send to; HOST must be an IP address (required)")
	interval := fs.Duration("interval", 10*time.Millisecond, "pause between datagrams (INITs)")
	duration := fs.Duration("duration", 0, "how long to run (0: until SIGTERM or SIGINT)")
	sport := fs.Int("sport", 0, "fixed source port (0: one chosen once for the whole run)")
	gap := fs.Duration("gap", 50*time.Millisecond, "report periods without an answer at least this long")
	fs.Parse(args)
	ap, err := netip.ParseAddrPort(*addr)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	if *interval <= 0 {
		return errors.New("--interval must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	var s streamer
	switch *proto {
	case "udp":
		s, err = newUDPStreamer(ap, *sport)
	case "sctp":
		s, err = newSCTPStreamer(ap, *sport)
	default:
		return fmt.Errorf("--proto %q: want udp or sctp", *proto)
	}
	if err != nil {
		return err
	}
	r := &recorder{gapMin: *gap, counts: map[string]int{}, errs: map[string]bool{}, last: "none",
		lastSeen: map[string]time.Time{}}
	r.start = time.Now()
	r.lastAnswer = r.start
	r.printf("start proto=%s local=%s remote=%s interval=%s at=%d", *proto, s.local(), ap, *interval, r.start.UnixNano())
	go s.receive(r)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for seq := 0; ; seq++ {
		r.sent(seq)
		if err := s.send(seq); err != nil {
			r.failure(err)
		}
		select {
		case <-ctx.Done():
			s.close()
			r.summary()
			return nil
		case <-tick.C:
		}
	}
}

// streamer is one protocol's side of a stream: send a request, feed answers to a recorder.
type streamer interface {
	local() string
	send(seq int) error
	receive(r *recorder) // until close
	close()
}

// recorder turns answers and errors into the lines documented above.
type recorder struct {
	mu         sync.Mutex
	gapMin     time.Duration
	start      time.Time
	nSent      int
	seq        int // last sequence number sent
	answers    int
	refused    int
	errors     int
	counts     map[string]int
	errs       map[string]bool
	last       string               // last outcome: backend name, "refused" or "none"
	lastSeen   map[string]time.Time // per outcome
	lastAnswer time.Time
	lastName   string
	longest    time.Duration
}

func (r *recorder) printf(format string, args ...any) {
	// One write per line: the log file is shared with nobody, but keep lines whole.
	os.Stdout.WriteString(fmt.Sprintf(format, args...) + "\n")
}

func (r *recorder) sent(seq int) {
	r.mu.Lock()
	r.nSent++
	r.seq = seq
	r.mu.Unlock()
}

func (r *recorder) outcome(now time.Time, what string) {
	if what != r.last {
		since := int64(0)
		if t, ok := r.lastSeen[r.last]; ok {
			since = t.UnixNano()
		}
		r.printf("switch from=%s to=%s since=%d at=%d", r.last, what, since, now.UnixNano())
		r.last = what
	}
	r.lastSeen[what] = now
}

// answer records an answer line "NAME PEER" from a server.
func (r *recorder) answer(line string) {
	now := time.Now()
	f := strings.Fields(line)
	if len(f) != 2 {
		r.failure(fmt.Errorf("unexpected answer %q", line))
		return
	}
	name, peer := f[0], f[1]
	r.mu.Lock()
	defer r.mu.Unlock()
	if d := now.Sub(r.lastAnswer); d >= r.gapMin {
		r.printf("gap ms=%d from=%d to=%d", d.Milliseconds(), r.lastAnswer.UnixNano(), now.UnixNano())
	}
	if d := now.Sub(r.lastAnswer); d > r.longest {
		r.longest = d
	}
	r.lastAnswer, r.lastName = now, name
	r.answers++
	if r.counts[name] == 0 {
		r.printf("first name=%s peer=%s seq=%d at=%d", name, peer, r.seq, now.UnixNano())
	}
	r.counts[name]++
	r.outcome(now, name)
}

// failure records an error of a send or receive: refusals are counted as an outcome,
// anything else is printed once per distinct text.
func (r *recorder) failure(err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if errors.Is(err, unix.ECONNREFUSED) {
		r.refused++
		r.outcome(now, "refused")
		return
	}
	r.errors++
	msg := strings.ReplaceAll(err.Error(), " ", "_")
	if !r.errs[msg] {
		r.errs[msg] = true
		r.printf("error msg=%s at=%d", msg, now.UnixNano())
	}
}

func (r *recorder) summary() {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	longest := max(r.longest, now.Sub(r.lastAnswer))
	names := make([]string, 0, len(r.counts))
	for n := range r.counts {
		names = append(names, n)
	}
	slices.Sort(names)
	counts, lasts := make([]string, len(names)), make([]string, len(names))
	for i, n := range names {
		counts[i] = fmt.Sprintf("%s:%d", n, r.counts[n])
		lasts[i] = fmt.Sprintf("%s:%d", n, r.lastSeen[n].UnixNano())
	}
	lastName, lastAt := r.lastName, r.lastAnswer.UnixNano()
	if lastName == "" {
		lastName, lastAt = "none", 0
	}
	r.printf("summary sent=%d answers=%d refused=%d errors=%d longest_gap_ms=%d last=%s last_at=%d counts=%s lasts=%s at=%d",
		r.nSent, r.answers, r.refused, r.errors, longest.Milliseconds(), lastName, lastAt,
		strings.Join(counts, ","), strings.Join(lasts, ","), now.UnixNano())
}

// udpStreamer uses one connected UDP socket: the kernel then reports ICMP port unreachable
// as ECONNREFUSED on the next read or write.
type udpStreamer struct {
	c *net.UDPConn
}

func newUDPStreamer(ap netip.AddrPort, sport int) (*udpStreamer, error) {
	d := net.Dialer{Control: reuseAddr}
	if sport != 0 {
		d.LocalAddr = &net.UDPAddr{Port: sport}
	}
	c, err := d.Dial("udp", ap.String())
	if err != nil {
		return nil, err
	}
	return &udpStreamer{c: c.(*net.UDPConn)}, nil
}

func (u *udpStreamer) local() string { return u.c.LocalAddr().String() }

func (u *udpStreamer) send(seq int) error {
	_, err := u.c.Write(fmt.Appendf(nil, "stream %d\n", seq))
	return err
}

func (u *udpStreamer) receive(r *recorder) {
	buf := make([]byte, 2048)
	for {
		n, err := u.c.Read(buf)
		switch {
		case errors.Is(err, net.ErrClosed):
			return
		case err != nil:
			r.failure(err)
		default:
			r.answer(strings.TrimSpace(string(buf[:n])))
		}
	}
}

func (u *udpStreamer) close() { u.c.Close() }

// sctpStreamer sends INITs over a raw socket (see sctp.go), all with the same source port
// and initiate tag: to conntrack one association being (re)initiated, one entry.
type sctpStreamer struct {
	fd     int
	dst    netip.AddrPort
	sport  uint16
	tag    uint32
	closed chan struct{}
}

func newSCTPStreamer(ap netip.AddrPort, sport int) (*sctpStreamer, error) {
	fd, err := rawSCTPSocket(ap.Addr().Is4())
	if err != nil {
		return nil, err
	}
	if ap.Addr().Is4() {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
	}
	if err == nil {
		err = unix.Connect(fd, sockaddr(ap.Addr()))
	}
	if err == nil {
		// Wake the receiver now and then so that it notices close.
		tv := unix.NsecToTimeval((100 * time.Millisecond).Nanoseconds())
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	if sport == 0 {
		sport = 32768 + rand.IntN(28232)
	}
	return &sctpStreamer{fd: fd, dst: ap, sport: uint16(sport), tag: rand.Uint32() | 1, closed: make(chan struct{})}, nil
}

func (s *sctpStreamer) local() string { return fmt.Sprintf(":%d", s.sport) }

func (s *sctpStreamer) send(int) error {
	init := sctpPacket{srcPort: s.sport, dstPort: s.dst.Port(), chunks: [][]byte{initChunk(chunkInit, s.tag, nil)}}
	_, err := unix.Write(s.fd, init.marshal())
	return err
}

func (s *sctpStreamer) receive(r *recorder) {
	buf := make([]byte, 65536)
	for {
		select {
		case <-s.closed:
			return
		default:
		}
		n, err := unix.Read(s.fd, buf)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			select {
			case <-s.closed:
				return
			default:
			}
			r.failure(err)
			continue
		}
		payload := buf[:n]
		if s.dst.Addr().Is4() { // IPv4 raw sockets deliver the IP header too
			if n < 20 || n < int(buf[0]&0x0f)*4 {
				continue
			}
			payload = buf[int(buf[0]&0x0f)*4 : n]
		}
		p, err := parseSCTP(payload)
		if err != nil || p.srcPort != s.dst.Port() || p.dstPort != s.sport || p.vtag != s.tag || len(p.chunks) == 0 {
			continue
		}
		switch c := p.chunks[0]; c[0] {
		case chunkAbort:
			r.failure(unix.ECONNREFUSED)
		case chunkInitAck:
			if len(c) < initChunkLen || binary.BigEndian.Uint16(c[2:]) < initChunkLen {
				continue
			}
			if cookie, ok := stateCookie(c); ok {
				r.answer(string(cookie))
			} else {
				r.failure(errors.New("INIT-ACK without state cookie"))
			}
		}
	}
}

func (s *sctpStreamer) close() {
	close(s.closed)
	// The receiver wakes up within SO_RCVTIMEO and returns; the process exits right after
	// the summary anyway, so the socket is not closed under a pending read.
}
