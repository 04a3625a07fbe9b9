// Command probe is the traffic endpoint of the e2e test bed. It runs inside pod and node
// network namespaces (via `ip netns exec`) and prints one line per observation, so tests can
// assert on text without parsing packet captures.
//
//	probe serve --name NAME --port P [--tcp] [--udp] [--sctp-raw]
//	probe dial  --proto tcp|udp|sctp --addr HOST:PORT [--timeout 1s] [--count N]
//	            [--interval D] [--source-port N]
//	probe load  --addr HOST:PORT [--rate 100] [--hold N] ...   (load.go)
//	probe own-table --family ip --table NAME                  (owntable.go)
//	probe stuck-reader [--family ip] [--table T] [--set S]     (stuck.go)
//
// serve answers every TCP connection and UDP datagram with the line "NAME PEER", where PEER
// is the client address:port the server sees (IPv4-mapped IPv6 printed as plain IPv4). With
// neither --tcp, --udp nor --sctp-raw it serves TCP and UDP.
//
// dial prints, per attempt, the server's line or one of:
//
//	refused      TCP RST, or ICMP port unreachable (TCP, UDP and SCTP)
//	timeout      no answer within --timeout
//	unreachable  ICMP host/network unreachable or administratively prohibited
//	reset        the connection was reset after it was established (TCP)
//	error: ...   anything else
//
// The kernel on the test machine has no SCTP sockets, so SCTP is spoken over raw IP sockets:
// see sctp.go. dial always exits 0 after printing its lines; tests judge the lines.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serveMain(os.Args[2:])
	case "dial":
		err = dialMain(os.Args[2:])
	case "stream": // see stream.go
		err = streamMain(os.Args[2:])
	case "load": // see load.go
		err = loadMain(os.Args[2:])
	case "own-table": // see owntable.go
		err = ownTableMain(os.Args[2:])
	case "stuck-reader": // see stuck.go
		err = stuckReaderMain(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: probe serve --name NAME --port P [--tcp] [--udp] [--sctp-raw]")
	fmt.Fprintln(os.Stderr, "       probe dial --proto tcp|udp|sctp --addr HOST:PORT [--timeout 1s] [--count N] [--interval D] [--source-port N]")
	fmt.Fprintln(os.Stderr, "       probe stream --proto udp|sctp --addr HOST:PORT [--interval 10ms] [--duration D] [--sport N] [--gap 50ms]")
	fmt.Fprintln(os.Stderr, "       probe load --addr HOST:PORT [--rate 100] [--hold N] [--check 100ms] [--timeout 1s] [--duration D]")
	fmt.Fprintln(os.Stderr, "       probe own-table --family ip|ip6 --table NAME")
	fmt.Fprintln(os.Stderr, "       probe stuck-reader [--family ip|ip6] [--table T] [--set S]")
	os.Exit(2)
}
