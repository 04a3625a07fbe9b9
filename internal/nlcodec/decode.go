package nlcodec

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// ErrMalformed is wrapped by every error the decoder reports.
var ErrMalformed = errors.New("malformed netlink data")

// Attrs calls fn with the type (without NLA_F_NESTED and
// NLA_F_NET_BYTEORDER) and the data of each attribute of b, and returns an
// error, after the attributes before it, at the first that does not fit
// in b: trailing bytes too short for a header, or a length that is too
// short or runs past the end. The data is a view of b.
func Attrs(b []byte, fn func(typ uint16, data []byte)) error {
	for len(b) > 0 {
		if len(b) < AttrLen {
			return fmt.Errorf("%w: %d trailing bytes after the attributes", ErrMalformed, len(b))
		}
		l := int(binary.NativeEndian.Uint16(b))
		if l < AttrLen || l > len(b) {
			return fmt.Errorf("%w: attribute of %d bytes in %d", ErrMalformed, l, len(b))
		}
		fn(binary.NativeEndian.Uint16(b[2:])&attrTypeMask, b[AttrLen:l])
		b = b[min(Align(l), len(b)):]
	}
	return nil
}

// Decoder decodes nested attributes and fixed-size values, and remembers
// malformed input (Err): a decoding callback reads on as if nothing
// happened, and its caller checks Err once at the end. Attrs and the value
// methods are small enough to be inlined with their callbacks (a table
// read back decodes millions of attributes), so Attrs only keeps the
// bytes that did not fit and Err builds the error.
type Decoder struct {
	err error
	// rest is a run of attributes that did not fit, not yet an error.
	rest []byte
}

// Err returns the first malformation met.
func (d *Decoder) Err() error {
	if d.err == nil && d.rest != nil {
		d.err = Attrs(d.rest, func(uint16, []byte) {})
	}
	return d.err
}

// Fail records err unless an error was recorded already.
func (d *Decoder) Fail(err error) {
	if d.Err() == nil {
		d.err = err
	}
}

// Attrs is the function Attrs, recording its error.
func (d *Decoder) Attrs(b []byte, fn func(typ uint16, data []byte)) {
	for len(b) >= AttrLen {
		l := int(binary.NativeEndian.Uint16(b))
		if l < AttrLen || l > len(b) {
			break
		}
		fn(binary.NativeEndian.Uint16(b[2:])&attrTypeMask, b[AttrLen:l])
		b = b[min(Align(l), len(b)):]
	}
	if len(b) != 0 {
		d.rest = b
	}
}

// wrongSize records a fixed-size value of the wrong size.
func (d *Decoder) wrongSize(b []byte, n int) {
	d.Fail(fmt.Errorf("%w: a %d-byte value in %d bytes", ErrMalformed, n, len(b)))
}

// U8 decodes a one-byte attribute's data.
func (d *Decoder) U8(b []byte) uint8 {
	if len(b) != 1 {
		d.wrongSize(b, 1)
		return 0
	}
	return b[0]
}

// BE16 decodes a big-endian u16 attribute's data.
func (d *Decoder) BE16(b []byte) uint16 {
	if len(b) != 2 {
		d.wrongSize(b, 2)
		return 0
	}
	return binary.BigEndian.Uint16(b)
}

// BE32 decodes a big-endian u32 attribute's data.
func (d *Decoder) BE32(b []byte) uint32 {
	if len(b) != 4 {
		d.wrongSize(b, 4)
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

// BE64 decodes a big-endian u64 attribute's data.
func (d *Decoder) BE64(b []byte) uint64 {
	if len(b) != 8 {
		d.wrongSize(b, 8)
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

// StringBytes returns a string attribute's data up to its NUL terminator.
// Netlink strings are C strings: the kernel reads them to the first NUL
// (nla_strscpy, nla_strcmp), as do libmnl and nft; whatever follows that
// NUL is not part of the string, so it is cut there rather than only
// trailing NULs trimmed. Compare it as string(StringBytes(b)) == s, which
// does not allocate.
func StringBytes(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}

// String is StringBytes as a string (a copy).
func String(b []byte) string { return string(StringBytes(b)) }

// Header is a netlink message header (struct nlmsghdr).
type Header struct {
	Len    uint32
	Type   uint16
	Flags  uint16
	Seq    uint32
	PortID uint32 // the sender's port: 0 for the kernel, or the committing socket's in notifications
}

func header(b []byte) Header {
	return Header{Len: binary.NativeEndian.Uint32(b), Type: binary.NativeEndian.Uint16(b[4:]),
		Flags: binary.NativeEndian.Uint16(b[6:]), Seq: binary.NativeEndian.Uint32(b[8:]),
		PortID: binary.NativeEndian.Uint32(b[12:])}
}

// Messages calls fn with the header and payload of each message of a
// datagram, and stops at the first error fn returns or at the first
// message that does not fit in b.
func Messages(b []byte, fn func(h Header, payload []byte) error) error {
	for len(b) > 0 {
		if len(b) < HeaderLen {
			return fmt.Errorf("%w: %d trailing bytes after the messages", ErrMalformed, len(b))
		}
		h := header(b)
		if h.Len < HeaderLen || int(h.Len) > len(b) {
			return fmt.Errorf("%w: message of %d bytes in %d", ErrMalformed, h.Len, len(b))
		}
		if err := fn(h, b[HeaderLen:h.Len]); err != nil {
			return err
		}
		b = b[min(Align(int(h.Len)), len(b)):]
	}
	return nil
}

// DumpMessages calls fn with each message of a datagram of a dump's
// replies to the request with sequence number seq, and reports whether the
// dump ended in it: at NLMSG_DONE, with the error the kernel put there, or
// at NLMSG_ERROR, with its error. Messages of other sequence numbers (late
// replies to earlier requests) are skipped.
func DumpMessages(b []byte, seq uint32, fn func(h Header, payload []byte) error) (done bool, err error) {
	err = Messages(b, func(h Header, payload []byte) error {
		if h.Seq != seq {
			return nil
		}
		switch h.Type {
		case unix.NLMSG_DONE:
			done = true
			return DoneErr(payload)
		case unix.NLMSG_ERROR:
			done = true
			return ParseAck(h.Flags, payload).Err()
		}
		return fn(h, payload)
	})
	return done, err
}

// Ack is an NLMSG_ERROR: the kernel's answer to a request that failed, or
// that asked for an ACK (Errno 0).
type Ack struct {
	Errno unix.Errno
	// Msg is the extended ACK's message (NLMSGERR_ATTR_MSG), if any.
	Msg string
	// Malformed is why the ACK could not be read whole. Its errno stands
	// (EBADMSG if even that was missing); its message may be lost.
	Malformed error
}

// Err returns the ACK as an error (nil for a success), with the kernel's
// message if it gave one.
func (a Ack) Err() error {
	var err error = a.Errno
	switch {
	case a.Errno == 0:
		return nil
	case a.Msg != "":
		err = fmt.Errorf("%w (kernel: %s)", a.Errno, a.Msg)
	}
	if a.Malformed != nil {
		err = fmt.Errorf("%w (%w)", err, a.Malformed)
	}
	return err
}

// ParseAck parses the payload of an NLMSG_ERROR whose header has flags.
// The kernel (net/netlink/af_netlink.c, netlink_ack) writes the error, the
// request's header, then, unless NLM_F_CAPPED, the request's payload
// padded to NLMSG_ALIGN (nlmsg_append), and, with NLM_F_ACK_TLVS, the
// NLMSGERR_ATTR_* TLVs: so they start at the aligned end of the request.
func ParseAck(flags uint16, payload []byte) Ack {
	if len(payload) < 4+HeaderLen {
		return Ack{Errno: unix.EBADMSG, Malformed: fmt.Errorf("%w: netlink error message of %d bytes", ErrMalformed, len(payload))}
	}
	a := Ack{Errno: unix.Errno(-int32(binary.NativeEndian.Uint32(payload)))}
	if flags&unix.NLM_F_ACK_TLVS == 0 {
		return a
	}
	tlvs := payload[4+HeaderLen:]
	if flags&unix.NLM_F_CAPPED == 0 {
		req := int(binary.NativeEndian.Uint32(payload[4:])) - HeaderLen
		if req < 0 || Align(req) > len(tlvs) {
			a.Malformed = fmt.Errorf("%w: netlink error message echoes a request of %d bytes in %d", ErrMalformed, req, len(tlvs))
			return a
		}
		tlvs = tlvs[Align(req):]
	}
	a.Malformed = Attrs(tlvs, func(typ uint16, data []byte) {
		if typ == unix.NLMSGERR_ATTR_MSG {
			a.Msg = String(data)
		}
	})
	return a
}

// DoneErr returns the error an NLMSG_DONE carries: a dump that failed part
// way ends with a negative errno.
func DoneErr(payload []byte) error {
	if len(payload) >= 4 {
		if code := int32(binary.NativeEndian.Uint32(payload)); code < 0 {
			return unix.Errno(-code)
		}
	}
	return nil
}
