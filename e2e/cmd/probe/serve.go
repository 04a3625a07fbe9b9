package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// serveMain runs the requested servers until the process is killed.
func serveMain(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	name := fs.String("name", "", "name to put in every reply (required)")
	port := fs.Int("port", 0, "port to listen on (required)")
	tcp := fs.Bool("tcp", false, "serve TCP")
	udp := fs.Bool("udp", false, "serve UDP")
	sctp := fs.Bool("sctp-raw", false, "answer SCTP INIT with INIT-ACK over raw sockets")
	echo := fs.Bool("echo", false, "after the line, echo what a TCP client sends until it closes (long-lived connections: probe load --hold)")
	fs.Parse(args)
	if *name == "" || *port <= 0 || *port > 65535 {
		return errors.New("serve needs --name and --port")
	}
	if !*tcp && !*udp && !*sctp {
		*tcp, *udp = true, true
	}
	errc := make(chan error, 3)
	if *tcp {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(*port))
		if err != nil {
			return err
		}
		go func() { errc <- serveTCP(ln, *name, *echo) }()
	}
	if *udp {
		v4, v6, err := listenUDP(*port)
		if err != nil {
			return err
		}
		go func() { errc <- serveUDP4(v4, *name) }()
		go func() { errc <- serveUDP6(v6, *name) }()
	}
	if *sctp {
		s, err := newSCTPResponder(*name, uint16(*port))
		if err != nil {
			return err
		}
		go func() { errc <- s.serve() }()
	}
	// Tests wait for this line before dialing.
	fmt.Fprintf(os.Stderr, "ready %s port %d tcp=%v udp=%v sctp-raw=%v\n", *name, *port, *tcp, *udp, *sctp)
	return <-errc
}

// replyLine is what every server sends back: who answered, and whom it saw.
func replyLine(name string, peer netip.AddrPort) string {
	peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	return fmt.Sprintf("%s %s\n", name, peer)
}

func serveTCP(ln net.Listener, name string, echo bool) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			peer := c.RemoteAddr().(*net.TCPAddr).AddrPort()
			c.Write([]byte(replyLine(name, peer)))
			if echo {
				io.Copy(c, c)
			}
		}()
	}
}

// listenUDP opens one socket per family instead of one dual-stack socket, because each
// reply must leave from the address the request was sent to (for conntrack to un-DNAT it),
// and the per-family PKTINFO control messages are the simplest way to get that right on
// hosts with several addresses (node namespaces).
func listenUDP(port int) (*ipv4.PacketConn, *ipv6.PacketConn, error) {
	c4, err := net.ListenUDP("udp4", &net.UDPAddr{Port: port})
	if err != nil {
		return nil, nil, err
	}
	c6, err := net.ListenUDP("udp6", &net.UDPAddr{Port: port})
	if err != nil {
		c4.Close()
		return nil, nil, err
	}
	p4, p6 := ipv4.NewPacketConn(c4), ipv6.NewPacketConn(c6)
	if err := p4.SetControlMessage(ipv4.FlagDst, true); err != nil {
		return nil, nil, err
	}
	if err := p6.SetControlMessage(ipv6.FlagDst, true); err != nil {
		return nil, nil, err
	}
	return p4, p6, nil
}

func serveUDP4(p *ipv4.PacketConn, name string) error {
	buf := make([]byte, 64<<10)
	for {
		_, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			return err
		}
		var reply *ipv4.ControlMessage
		if cm != nil {
			reply = &ipv4.ControlMessage{Src: cm.Dst}
		}
		peer := src.(*net.UDPAddr).AddrPort()
		p.WriteTo([]byte(replyLine(name, peer)), reply, src)
	}
}

func serveUDP6(p *ipv6.PacketConn, name string) error {
	buf := make([]byte, 64<<10)
	for {
		_, cm, src, err := p.ReadFrom(buf)
		if err != nil {
			return err
		}
		var reply *ipv6.ControlMessage
		if cm != nil {
			reply = &ipv6.ControlMessage{Src: cm.Dst}
		}
		peer := src.(*net.UDPAddr).AddrPort()
		p.WriteTo([]byte(replyLine(name, peer)), reply, src)
	}
}
