package main

// SCTP over raw IP sockets.
//
// The test machine's kernel has no SCTP sockets (socket(..., IPPROTO_SCTP) fails with
// EPROTONOSUPPORT) but its conntrack and NAT do understand SCTP, which is what a service
// proxy needs to be tested against. So the probe speaks just enough SCTP itself (RFC 9260):
// the dialer sends an INIT, the responder answers with an INIT-ACK whose State Cookie
// carries "NAME PEER", and the dialer ends the half-open association with an ABORT so
// conntrack does not keep it. Conntrack tracks INIT → INIT-ACK like a real handshake and
// checks the verification tags, so a correct tag and CRC32c matter.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// SCTP chunk types and parameter types used here (RFC 9260 section 3.2).
const (
	chunkInit        = 1
	chunkInitAck     = 2
	chunkAbort       = 6
	paramStateCookie = 7

	sctpHeaderLen = 12
	initChunkLen  = 20 // fixed part of INIT and INIT-ACK
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sctpPacket is a parsed SCTP common header plus its chunks (type → value incl. header).
type sctpPacket struct {
	srcPort, dstPort uint16
	vtag             uint32
	chunks           [][]byte
}

// marshal builds the packet and fills in the CRC32c checksum. The checksum is stored
// little-endian: that is how Linux (and every other stack) puts the reflected CRC32c on
// the wire, and conntrack drops SCTP with a bad checksum as invalid.
func (p sctpPacket) marshal() []byte {
	b := make([]byte, sctpHeaderLen, 64)
	binary.BigEndian.PutUint16(b[0:], p.srcPort)
	binary.BigEndian.PutUint16(b[2:], p.dstPort)
	binary.BigEndian.PutUint32(b[4:], p.vtag)
	for _, c := range p.chunks {
		b = append(b, c...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
	}
	binary.LittleEndian.PutUint32(b[8:], crc32.Checksum(b, castagnoli))
	return b
}

// parseSCTP parses and checks an SCTP packet (without IP header).
func parseSCTP(b []byte) (sctpPacket, error) {
	if len(b) < sctpHeaderLen {
		return sctpPacket{}, errors.New("short SCTP packet")
	}
	want := binary.LittleEndian.Uint32(b[8:])
	zeroed := append([]byte(nil), b...)
	binary.LittleEndian.PutUint32(zeroed[8:], 0)
	if crc32.Checksum(zeroed, castagnoli) != want {
		return sctpPacket{}, errors.New("bad SCTP checksum")
	}
	p := sctpPacket{
		srcPort: binary.BigEndian.Uint16(b[0:]),
		dstPort: binary.BigEndian.Uint16(b[2:]),
		vtag:    binary.BigEndian.Uint32(b[4:]),
	}
	for rest := b[sctpHeaderLen:]; len(rest) >= 4; {
		n := int(binary.BigEndian.Uint16(rest[2:]))
		if n < 4 || n > len(rest) {
			return sctpPacket{}, errors.New("bad SCTP chunk length")
		}
		p.chunks = append(p.chunks, rest[:n])
		rest = rest[min((n+3)&^3, len(rest)):]
	}
	return p, nil
}

// initChunk builds an INIT (or INIT-ACK, with a State Cookie) chunk.
func initChunk(typ byte, initiateTag uint32, cookie []byte) []byte {
	c := make([]byte, initChunkLen)
	c[0] = typ
	binary.BigEndian.PutUint32(c[4:], initiateTag)
	binary.BigEndian.PutUint32(c[8:], 65536) // advertised receiver window
	binary.BigEndian.PutUint16(c[12:], 1)    // outbound streams
	binary.BigEndian.PutUint16(c[14:], 1)    // inbound streams
	binary.BigEndian.PutUint32(c[16:], rand.Uint32())
	if cookie != nil {
		param := make([]byte, 4, 4+len(cookie)+3)
		binary.BigEndian.PutUint16(param[0:], paramStateCookie)
		binary.BigEndian.PutUint16(param[2:], uint16(4+len(cookie)))
		param = append(param, cookie...)
		c = append(c, param...)
	}
	binary.BigEndian.PutUint16(c[2:], uint16(len(c)))
	return c
}

// stateCookie returns the State Cookie parameter of an INIT-ACK chunk.
func stateCookie(chunk []byte) ([]byte, bool) {
	for rest := chunk[min(initChunkLen, len(chunk)):]; len(rest) >= 4; {
		typ, n := binary.BigEndian.Uint16(rest), int(binary.BigEndian.Uint16(rest[2:]))
		if n < 4 || n > len(rest) {
			return nil, false
		}
		if typ == paramStateCookie {
			return rest[4:n], true
		}
		rest = rest[min((n+3)&^3, len(rest)):]
	}
	return nil, false
}

// rawSCTPSocket opens a raw IP socket for protocol 132 in the address's family.
func rawSCTPSocket(v4 bool) (int, error) {
	family := unix.AF_INET6
	if v4 {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return -1, fmt.Errorf("raw SCTP socket: %w", err)
	}
	return fd, nil
}

func sockaddr(a netip.Addr) unix.Sockaddr {
	if a.Is4() {
		return &unix.SockaddrInet4{Addr: a.As4()}
	}
	return &unix.SockaddrInet6{Addr: a.As16()}
}

// dialSCTP sends an INIT and waits for the matching INIT-ACK. The raw socket is connected
// to the destination so that (with IP_RECVERR) an ICMP error about our INIT — e.g. port
// unreachable from an nft reject — comes back as an error from read.
func dialSCTP(o dialOptions) string {
	dst := o.addr.Addr().Unmap()
	fd, err := rawSCTPSocket(dst.Is4())
	if err != nil {
		return classify(err)
	}
	defer unix.Close(fd)
	if dst.Is4() {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1)
	}
	if err != nil {
		return classify(err)
	}
	if err := unix.Connect(fd, sockaddr(dst)); err != nil {
		return classify(err)
	}
	srcPort := uint16(o.sourcePort)
	if srcPort == 0 {
		srcPort = uint16(32768 + rand.IntN(28232)) // Linux's default ephemeral range
	}
	tag := rand.Uint32() | 1 // an initiate tag must not be 0
	init := sctpPacket{srcPort: srcPort, dstPort: o.addr.Port(), chunks: [][]byte{initChunk(chunkInit, tag, nil)}}
	if _, err := unix.Write(fd, init.marshal()); err != nil {
		return classify(err)
	}
	deadline := time.Now().Add(o.timeout)
	buf := make([]byte, 65536)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return "timeout"
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return classify(err)
		}
		if pfd[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(fd, buf)
		if err != nil {
			return classify(err)
		}
		payload := buf[:n]
		if dst.Is4() { // IPv4 raw sockets deliver the IP header too
			if n < 20 || n < int(buf[0]&0x0f)*4 {
				continue
			}
			payload = buf[int(buf[0]&0x0f)*4 : n]
		}
		p, err := parseSCTP(payload)
		if err != nil || p.srcPort != o.addr.Port() || p.dstPort != srcPort || p.vtag != tag || len(p.chunks) == 0 {
			continue
		}
		c := p.chunks[0]
		switch c[0] {
		case chunkAbort:
			return "refused"
		case chunkInitAck:
			if len(c) < initChunkLen {
				continue
			}
			peerTag := binary.BigEndian.Uint32(c[4:])
			abort := sctpPacket{srcPort: srcPort, dstPort: o.addr.Port(), vtag: peerTag, chunks: [][]byte{{chunkAbort, 0, 0, 4}}}
			unix.Write(fd, abort.marshal())
			cookie, ok := stateCookie(c)
			if !ok {
				return "error: INIT-ACK without state cookie"
			}
			return string(cookie)
		}
	}
}

// sctpResponder answers INITs to one port with INIT-ACKs, on both address families.
// Without SCTP in the kernel nothing else answers, and because a raw socket received the
// packet the kernel also does not send "protocol unreachable".
type sctpResponder struct {
	name     string
	port     uint16
	fd4, fd6 int
}

func newSCTPResponder(name string, port uint16) (*sctpResponder, error) {
	fd4, err := rawSCTPSocket(true)
	if err != nil {
		return nil, err
	}
	fd6, err := rawSCTPSocket(false)
	if err != nil {
		unix.Close(fd4)
		return nil, err
	}
	// IPv6 raw sockets do not deliver the IP header; PKTINFO tells us the destination.
	if err := unix.SetsockoptInt(fd6, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1); err != nil {
		return nil, fmt.Errorf("IPV6_RECVPKTINFO: %w", err)
	}
	return &sctpResponder{name: name, port: port, fd4: fd4, fd6: fd6}, nil
}

func (s *sctpResponder) serve() error {
	errc := make(chan error, 2)
	go func() { errc <- s.loop(s.fd4, true) }()
	go func() { errc <- s.loop(s.fd6, false) }()
	return <-errc
}

// loop reads packets from one raw socket and answers INITs to our port. The reply is
// sent from the address the INIT was sent to (PKTINFO), so conntrack can reverse the
// DNAT of a Service even on a namespace with several addresses.
func (s *sctpResponder) loop(fd int, v4 bool) error {
	buf, oob := make([]byte, 65536), make([]byte, 256)
	for {
		n, oobn, _, from, err := unix.Recvmsg(fd, buf, oob, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("recvmsg: %w", err)
		}
		src, dst, payload, ok := s.addresses(v4, buf[:n], oob[:oobn], from)
		if !ok {
			continue
		}
		p, err := parseSCTP(payload)
		if err != nil || p.dstPort != s.port || p.vtag != 0 || len(p.chunks) == 0 ||
			p.chunks[0][0] != chunkInit || len(p.chunks[0]) < initChunkLen {
			continue
		}
		peer := netip.AddrPortFrom(src, p.srcPort)
		cookie := []byte(fmt.Sprintf("%s %s", s.name, peer))
		initTag := binary.BigEndian.Uint32(p.chunks[0][4:])
		ack := sctpPacket{srcPort: s.port, dstPort: p.srcPort, vtag: initTag,
			chunks: [][]byte{initChunk(chunkInitAck, rand.Uint32()|1, cookie)}}
		var info []byte
		if v4 {
			info = unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: dst.As4()})
		} else {
			info = unix.PktInfo6(&unix.Inet6Pktinfo{Addr: dst.As16()})
		}
		if err := unix.Sendmsg(fd, ack.marshal(), info, sockaddr(src), 0); err != nil {
			fmt.Printf("send INIT-ACK to %s: %v\n", peer, err)
		}
	}
}

// addresses extracts source, destination and SCTP payload from a received packet.
func (s *sctpResponder) addresses(v4 bool, pkt, oob []byte, from unix.Sockaddr) (src, dst netip.Addr, payload []byte, ok bool) {
	if v4 {
		if len(pkt) < 20 || len(pkt) < int(pkt[0]&0x0f)*4 {
			return src, dst, nil, false
		}
		src = netip.AddrFrom4([4]byte(pkt[12:16]))
		dst = netip.AddrFrom4([4]byte(pkt[16:20]))
		return src, dst, pkt[int(pkt[0]&0x0f)*4:], true
	}
	sa, isV6 := from.(*unix.SockaddrInet6)
	if !isV6 {
		return src, dst, nil, false
	}
	src = netip.AddrFrom16(sa.Addr)
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return src, dst, nil, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_PKTINFO && len(m.Data) >= 16 {
			dst = netip.AddrFrom16([16]byte(m.Data[:16]))
		}
	}
	return src, dst, pkt, dst.IsValid()
}
