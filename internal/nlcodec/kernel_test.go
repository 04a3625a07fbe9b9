package nlcodec

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// kernelError sends req on a new NETLINK_ROUTE socket with extended ACKs
// (not capped) in a network namespace of its own, and returns the kernel's
// reply. The namespace dies with the thread, which is never unlocked.
func kernelError(t *testing.T, req []byte) []byte {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a network namespace)")
	}
	type result struct {
		reply []byte
		err   error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with its namespace
		reply, err := func() ([]byte, error) {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return nil, err
			}
			fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
			if err != nil {
				return nil, err
			}
			defer unix.Close(fd)
			if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1); err != nil {
				return nil, err
			}
			tv := unix.Timeval{Sec: 10}
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				return nil, err
			}
			if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
				return nil, err
			}
			buf := make([]byte, 1<<16)
			n, _, err := unix.Recvfrom(fd, buf, 0)
			return buf[:n], err
		}()
		done <- result{reply, err}
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.reply
}

// TestParseAckFromKernel: a real kernel's error reply to a request whose
// length is not a multiple of 4 (RTM_NEWLINK of an unknown link kind, its
// last attribute left unpadded: 54 bytes) carries its message after the
// echoed request padded to 4 bytes; ParseAck finds it.
func TestParseAckFromKernel(t *testing.T) {
	var e Encoder
	// RTM_NEWLINK: nlmsghdr, then a struct ifinfomsg (16 bytes) of which
	// BeginMsg writes the first 4 bytes (family AF_UNSPEC).
	m := e.BeginMsg(unix.RTM_NEWLINK, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL, 1, 0, 0)
	e.Buf = append(e.Buf, make([]byte, 12)...)
	e.Str(unix.IFLA_IFNAME, "nfnl0")
	info := e.Nest(unix.IFLA_LINKINFO)
	e.AttrHeader(unix.IFLA_INFO_KIND, 2)
	e.Buf = append(e.Buf, 'x', 0) // kind "x", not padded
	e.EndNest(info)
	e.EndMsg(m)
	if len(e.Buf)%4 == 0 {
		t.Fatalf("request of %d bytes: want a length that is not a multiple of 4", len(e.Buf))
	}
	reply := kernelError(t, e.Buf)
	var got *Ack
	err := Messages(reply, func(h Header, payload []byte) error {
		if h.Type != unix.NLMSG_ERROR || h.Flags&unix.NLM_F_CAPPED != 0 || h.Flags&unix.NLM_F_ACK_TLVS == 0 {
			t.Fatalf("reply %+v: want an uncapped error with TLVs", h)
		}
		a := ParseAck(h.Flags, payload)
		got = &a
		return nil
	})
	if err != nil || got == nil {
		t.Fatalf("%+v, error %v (reply %x)", got, err, reply)
	}
	if got.Errno == 0 || got.Msg == "" || got.Malformed != nil {
		t.Errorf("%+v: want an errno and the kernel's message (reply %x)", *got, reply)
	}
	t.Logf("kernel: %v", got.Err())
}
