package main

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// nlCounter counts the nftables change notifications a namespace's kernel
// sends (what `nft monitor` prints): one per table, chain, rule, set, set
// element or object added or deleted, and one NEWGEN per committed
// transaction. It measures what a proxy changed in the kernel, whatever tool
// it used, so it works for upstream kube-proxy's `nft` runs too. The kernel
// only builds notifications while someone listens, which costs the proxy
// time: use it only around changes that are not timed otherwise.
type nlCounter struct {
	fd      int
	stopped atomic.Bool
	done    chan struct{}
	mu      sync.Mutex
	objects int // notifications other than NEWGEN
	gens    int // NEWGEN: transactions
	lost    int // ENOBUFS: the socket buffer overflowed, counts are low
}

const nftMsgNewGen = 15 // NFT_MSG_NEWGEN

func startNLCounter(ns string) (*nlCounter, error) {
	t, err := newNSThread(ns)
	if err != nil {
		return nil, err
	}
	defer t.close()
	fd := -1
	t.do(func() {
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	})
	if err != nil {
		return nil, err
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20)
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (unix.NFNLGRP_NFTABLES - 1)}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	c := &nlCounter{fd: fd, done: make(chan struct{})}
	go c.loop()
	return c, nil
}

func (c *nlCounter) loop() {
	defer close(c.done)
	buf := make([]byte, 1<<20)
	for !c.stopped.Load() {
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		switch {
		case errors.Is(err, unix.ENOBUFS):
			c.mu.Lock()
			c.lost++
			c.mu.Unlock()
			continue
		case err != nil:
			continue // timeout (checks stopped) or EINTR
		}
		objects, gens := 0, 0
		for b := buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			typ := binary.NativeEndian.Uint16(b[4:6])
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				break
			}
			if typ>>8 == unix.NFNL_SUBSYS_NFTABLES {
				if typ&0xff == nftMsgNewGen {
					gens++
				} else {
					objects++
				}
			}
			l = (l + unix.NLMSG_ALIGNTO - 1) &^ (unix.NLMSG_ALIGNTO - 1)
			if l > len(b) {
				break
			}
			b = b[l:]
		}
		c.mu.Lock()
		c.objects += objects
		c.gens += gens
		c.mu.Unlock()
	}
}

// read returns the counts so far.
func (c *nlCounter) read() (objects, gens, lost int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.objects, c.gens, c.lost
}

func (c *nlCounter) stop() {
	c.stopped.Store(true)
	<-c.done
	unix.Close(c.fd)
}
