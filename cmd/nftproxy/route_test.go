package main

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
)

// TestRouteMessages: the request names the address with its family and
// full length; the output interface is read from the kernel's answer, and
// an answer without one, or an error, says so.
func TestRouteMessages(t *testing.T) {
	req := routeRequest(netip.MustParseAddr("fd00::1"))
	if got := binary.NativeEndian.Uint32(req); int(got) != len(req) {
		t.Errorf("length field %d, message %d bytes", got, len(req))
	}
	rtmsg := req[nlcodec.HeaderLen:]
	if rtmsg[0] != unix.AF_INET6 || rtmsg[1] != 128 {
		t.Errorf("rtmsg family %d, dst_len %d; want AF_INET6, 128", rtmsg[0], rtmsg[1])
	}
	answer := func(typ uint16, attrs ...[]byte) []byte {
		e := nlcodec.Encoder{Buf: make([]byte, nlcodec.HeaderLen)}
		binary.NativeEndian.PutUint16(e.Buf[4:], typ)
		e.Buf = append(e.Buf, make([]byte, unix.SizeofRtMsg)...)
		for i := 0; i+1 < len(attrs); i += 2 {
			e.Attr(binary.NativeEndian.Uint16(attrs[i]), attrs[i+1])
		}
		binary.NativeEndian.PutUint32(e.Buf, uint32(len(e.Buf)))
		return e.Buf
	}
	u16 := func(v uint16) []byte { return binary.NativeEndian.AppendUint16(nil, v) }
	u32 := func(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
	if i, err := routeOutputIndex(answer(unix.RTM_NEWROUTE, u16(unix.RTA_TABLE), u32(254), u16(unix.RTA_OIF), u32(7))); err != nil || i != 7 {
		t.Errorf("routeOutputIndex = %d, %v; want 7", i, err)
	}
	if _, err := routeOutputIndex(answer(unix.RTM_NEWROUTE, u16(unix.RTA_TABLE), u32(254))); err == nil {
		t.Error("an answer without RTA_OIF gave no error")
	}
	// NLMSG_ERROR: the errno, then the request's header echoed.
	errno := int32(unix.ENETUNREACH)
	nack := make([]byte, nlcodec.HeaderLen)
	binary.NativeEndian.PutUint16(nack[4:], unix.NLMSG_ERROR)
	nack = binary.NativeEndian.AppendUint32(nack, uint32(-errno))
	nack = append(nack, req[:nlcodec.HeaderLen]...)
	binary.NativeEndian.PutUint32(nack, uint32(len(nack)))
	if _, err := routeOutputIndex(nack); err != unix.ENETUNREACH {
		t.Errorf("an error answer gave %v, want ENETUNREACH", err)
	}
}
