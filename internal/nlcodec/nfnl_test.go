package nlcodec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestEncodeDecode: what the encoder writes, the message walker and the
// attribute decoder read back, nests, padding and byte orders included.
func TestEncodeDecode(t *testing.T) {
	var e Encoder
	m := e.BeginMsg(0x0a01, unix.NLM_F_REQUEST, 7, unix.AF_INET, 0x1234)
	e.Str(1, "abc")
	n := e.Nest(2)
	e.U8(1, 0xfe)
	e.BE16(2, 0x0102)
	e.BE32(3, 0x01020304)
	e.U32(4, 0x01020304)
	e.BE64(5, 0x0102030405060708)
	e.Attr(6, []byte{9, 9, 9, 9, 9})
	e.EndNest(n)
	e.EndMsg(m)
	if e.Err() != nil || len(e.Buf)%4 != 0 {
		t.Fatalf("encoded %d bytes, error %v", len(e.Buf), e.Err())
	}
	var msgs int
	err := Messages(slices.Concat(e.Buf, e.Buf), func(h Header, payload []byte) error {
		msgs++
		if h.Type != 0x0a01 || h.Flags != unix.NLM_F_REQUEST || h.Seq != 7 || int(h.Len) != len(e.Buf) {
			t.Errorf("header %+v", h)
		}
		if !bytes.Equal(payload[:GenHeaderLen], []byte{unix.AF_INET, 0, 0x12, 0x34}) {
			t.Errorf("nfgenmsg %x", payload[:GenHeaderLen])
		}
		var d Decoder
		var got []any
		d.Attrs(payload[GenHeaderLen:], func(typ uint16, data []byte) {
			switch typ {
			case 1:
				got = append(got, String(data))
			case 2:
				d.Attrs(data, func(typ uint16, data []byte) {
					switch typ {
					case 1:
						got = append(got, d.U8(data))
					case 2:
						got = append(got, d.BE16(data))
					case 3:
						got = append(got, d.BE32(data))
					case 4:
						got = append(got, binary.NativeEndian.Uint32(data))
					case 5:
						got = append(got, d.BE64(data))
					case 6:
						got = append(got, len(data))
					}
				})
			}
		})
		want := []any{"abc", uint8(0xfe), uint16(0x0102), uint32(0x01020304), uint32(0x01020304), uint64(0x0102030405060708), 5}
		if d.Err() != nil || !slices.Equal(got, want) {
			t.Errorf("decoded %v (error %v), want %v", got, d.Err(), want)
		}
		return nil
	})
	if err != nil || msgs != 2 {
		t.Errorf("%d messages, error %v", msgs, err)
	}
}

// TestEncoderTooLong: an attribute or nest longer than nla_len can say is
// an error, not a wrapped length.
func TestEncoderTooLong(t *testing.T) {
	var e Encoder
	e.Attr(1, make([]byte, MaxAttrLen))
	if e.Err() == nil {
		t.Error("an attribute of 64 KiB was encoded")
	}
	e = Encoder{}
	n := e.Nest(1)
	for range 20 {
		e.Attr(2, make([]byte, 4000))
	}
	e.EndNest(n)
	if e.Err() == nil {
		t.Error("a nest of 80 KB was encoded")
	}
}

// TestAttrsMalformed: every way attributes can fail to fit is reported,
// after the attributes before it.
func TestAttrsMalformed(t *testing.T) {
	var e Encoder
	e.BE32(1, 1)
	good := e.Buf
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"trailing bytes", slices.Concat(good, []byte{1, 2})},
		{"length past the end", slices.Concat(good, []byte{12, 0, 1, 0, 0, 0, 0, 0})},
		{"length below the header", slices.Concat(good, []byte{3, 0, 1, 0})},
	} {
		var seen int
		err := Attrs(tc.b, func(uint16, []byte) { seen++ })
		if !errors.Is(err, ErrMalformed) || seen != 1 {
			t.Errorf("%s: %d attributes, error %v", tc.name, seen, err)
		}
		var d Decoder
		d.Attrs(tc.b, func(uint16, []byte) {})
		if !errors.Is(d.Err(), ErrMalformed) {
			t.Errorf("%s: Decoder error %v", tc.name, d.Err())
		}
	}
	if err := Attrs(nil, func(uint16, []byte) {}); err != nil {
		t.Errorf("no attributes: %v", err)
	}
}

// TestDecoderSizes: a fixed-size value of the wrong size is an error, and
// the first error is the one kept.
func TestDecoderSizes(t *testing.T) {
	var d Decoder
	if v := d.BE32([]byte{1, 2, 3}); v != 0 || d.Err() == nil {
		t.Errorf("BE32 of 3 bytes: %d, error %v", v, d.Err())
	}
	first := d.Err()
	d.BE16([]byte{1})
	d.U8(nil)
	d.BE64(make([]byte, 4))
	if d.Err() != first {
		t.Errorf("error %v, want the first %v", d.Err(), first)
	}
}

func TestMessagesMalformed(t *testing.T) {
	var e Encoder
	e.EndMsg(e.BeginMsg(1, 0, 1, 0, 0))
	for _, b := range [][]byte{
		slices.Concat(e.Buf, []byte{1, 2, 3}),
		slices.Concat(e.Buf, binary.NativeEndian.AppendUint32(make([]byte, 0, 16), 64), make([]byte, 12)),
	} {
		if err := Messages(b, func(Header, []byte) error { return nil }); !errors.Is(err, ErrMalformed) {
			t.Errorf("%x: error %v", b, err)
		}
	}
}

func TestStringCutsAtNUL(t *testing.T) {
	for in, want := range map[string]string{"abc\x00": "abc", "abc": "abc", "abc\x00\x00": "abc", "ab\x00c\x00": "ab", "": ""} {
		if got := String([]byte(in)); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
}

// errorMessage builds an NLMSG_ERROR payload laid out as netlink_ack
// writes it for a failed request of reqLen bytes (header included): the
// errno, the request's header, its payload unless capped (padded to
// NLMSG_ALIGN, as nlmsg_append pads it), then the TLVs.
func errorMessage(errno unix.Errno, reqLen int, capped bool, msg string) (flags uint16, payload []byte) {
	payload = binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno)))
	payload = binary.NativeEndian.AppendUint32(payload, uint32(reqLen))
	payload = append(payload, make([]byte, HeaderLen-4)...)
	if capped {
		flags |= unix.NLM_F_CAPPED
	} else {
		payload = append(payload, make([]byte, Align(reqLen-HeaderLen))...)
		for i := HeaderLen + 4; i < len(payload); i++ {
			payload[i] = 0xaa // the request's bytes, not zeros
		}
		for i := 4 + reqLen; i < len(payload); i++ {
			payload[i] = 0 // nlmsg_append's padding
		}
	}
	if msg != "" {
		flags |= unix.NLM_F_ACK_TLVS
		e := Encoder{Buf: payload}
		e.Str(unix.NLMSGERR_ATTR_MSG, msg)
		e.BE32(unix.NLMSGERR_ATTR_OFFS, 20)
		payload = e.Buf
	}
	return flags, payload
}

// TestParseAck: the extended ACK's message is found after an echoed
// request of any length; an odd one (here 21 and 23 bytes) is padded to 4
// bytes before the TLVs, which a parser that does not round misreads.
func TestParseAck(t *testing.T) {
	for _, tc := range []struct {
		name   string
		errno  unix.Errno
		reqLen int
		capped bool
		msg    string
	}{
		{"ACK", 0, 20, true, ""},
		{"capped with message", unix.EINVAL, 37, true, "bad tuple"},
		{"uncapped, aligned request", unix.EINVAL, 100, false, "bad tuple"},
		{"uncapped, 21-byte request", unix.ENOENT, 21, false, "no such set"},
		{"uncapped, 23-byte request", unix.EEXIST, 23, false, "exists"},
		{"uncapped without TLVs", unix.EPERM, 21, false, ""},
	} {
		flags, payload := errorMessage(tc.errno, tc.reqLen, tc.capped, tc.msg)
		a := ParseAck(flags, payload)
		if a.Malformed != nil || a.Errno != tc.errno || a.Msg != tc.msg {
			t.Errorf("%s: %+v; want %v %q", tc.name, a, tc.errno, tc.msg)
		}
	}
	if a := ParseAck(0, []byte{1, 2}); !errors.Is(a.Malformed, ErrMalformed) || a.Errno != unix.EBADMSG {
		t.Errorf("short: %+v", a)
	}
	flags, payload := errorMessage(unix.EINVAL, 64, false, "x")
	if a := ParseAck(flags, payload[:40]); !errors.Is(a.Malformed, ErrMalformed) || a.Errno != unix.EINVAL {
		t.Errorf("request longer than the message: %+v", a)
	}
	// TLVs that do not fit: the errno stands, the malformation is told.
	flags, payload = errorMessage(unix.ENOENT, 20, true, "no such table")
	a := ParseAck(flags, payload[:len(payload)-12])
	if !errors.Is(a.Malformed, ErrMalformed) || !errors.Is(a.Err(), unix.ENOENT) || !errors.Is(a.Err(), ErrMalformed) {
		t.Errorf("truncated TLVs: %+v, error %v", a, a.Err())
	}
}

func TestAckErr(t *testing.T) {
	if err := (Ack{Malformed: ErrMalformed}).Err(); err != nil {
		t.Errorf("a success with malformed TLVs: %v", err)
	}
	err := Ack{Errno: unix.ENOENT, Msg: "no such chain"}.Err()
	if !errors.Is(err, unix.ENOENT) || err.Error() != "no such file or directory (kernel: no such chain)" {
		t.Errorf("%v", err)
	}
}

func TestDoneErr(t *testing.T) {
	code := -int32(unix.EINTR)
	neg := binary.NativeEndian.AppendUint32(nil, uint32(code))
	if err := DoneErr(neg); err != unix.EINTR {
		t.Errorf("%v", err)
	}
	if err := DoneErr(make([]byte, 4)); err != nil {
		t.Errorf("%v", err)
	}
}

// TestSeqs: numbers start at 1, restart there before 2³¹, and are never 0.
func TestSeqs(t *testing.T) {
	for _, next := range []uint32{0, 1<<31 - 1, 1 << 31, ^uint32(0)} {
		s := Seqs{next: next}
		first := s.Next(10)
		if first == 0 || first > 1<<31 || s.next != first+10 {
			t.Errorf("from %d: first %d, next %d", next, first, s.next)
		}
	}
	var s Seqs
	if first, next := s.Next(3), s.Next(0); first != 1 || next != 4 {
		t.Errorf("first %d, then %d", first, next)
	}
}

// rawMessage is a netlink message of type typ, sequence seq and payload.
func rawMessage(typ, flags uint16, seq uint32, payload []byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(HeaderLen+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, payload...)
	return append(b, make([]byte, Align(len(b))-len(b))...)
}

// TestDumpMessages: a dump's messages reach fn but those of other
// requests; NLMSG_DONE and NLMSG_ERROR end it with their errors; fn's
// error stops it.
func TestDumpMessages(t *testing.T) {
	data := func(s string) []byte { return rawMessage(0x100, unix.NLM_F_MULTI, 5, []byte(s)) }
	done := func(errno unix.Errno) []byte {
		return rawMessage(unix.NLMSG_DONE, unix.NLM_F_MULTI, 5, binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno))))
	}
	ackFlags, ackPayload := errorMessage(unix.EPERM, HeaderLen, true, "")
	failed := errors.New("fn failed")
	tests := []struct {
		name     string
		b        []byte
		fnErr    error
		want     string
		wantDone bool
		wantErr  error
	}{
		{"messages, no end yet", slices.Concat(data("a"), data("b")), nil, "ab", false, nil},
		{"another request's messages are skipped", slices.Concat(rawMessage(0x100, 0, 4, []byte("x")), data("a")), nil, "a", false, nil},
		{"done", slices.Concat(data("a"), done(0)), nil, "a", true, nil},
		{"done with an error", done(unix.EINTR), nil, "", true, unix.EINTR},
		{"error", rawMessage(unix.NLMSG_ERROR, ackFlags, 5, ackPayload), nil, "", true, unix.EPERM},
		{"fn's error", slices.Concat(data("a"), data("b")), failed, "a", false, failed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got strings.Builder
			d, err := DumpMessages(tt.b, 5, func(h Header, payload []byte) error {
				got.Write(bytes.TrimRight(payload, "\x00"))
				return tt.fnErr
			})
			if got.String() != tt.want || d != tt.wantDone || !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Errorf("DumpMessages: fn saw %q, done %v, err %v; want %q, %v, %v", got.String(), d, err, tt.want, tt.wantDone, tt.wantErr)
			}
		})
	}
}
