package watch

import (
	"errors"
	"fmt"
)

// The protobuf wire format, as far as decode.go reads it.
//
// It accepts what the generated (gogo) Unmarshal methods of the API types
// accept: varints of up to ten bytes, lengths checked against the input,
// unknown fields of every wire type skipped (groups included), and a field
// number of 0 or a stray end-group refused.

var (
	errTruncated     = errors.New("protobuf: unexpected end of input")
	errVarintTooLong = errors.New("protobuf: varint overflows 64 bits")
	errBadLength     = errors.New("protobuf: negative length")
)

// Wire types.
const (
	wireVarint     = 0
	wireFixed64    = 1
	wireBytes      = 2
	wireStartGroup = 3
	wireEndGroup   = 4
	wireFixed32    = 5
)

// protoFields walks the fields of one message: next reads the following
// field, whose number, wire type and value are then in num, typ and
// varint (wireVarint) or data (wireBytes). The first error ends the walk
// and stays in err.
type protoFields struct {
	b      []byte
	err    error
	num    int32
	typ    int
	varint uint64
	data   []byte
}

// uvarint reads a varint from the front of b, as gogo does: up to ten
// bytes, the bits past 64 dropped.
func uvarint(b []byte) (uint64, int, error) {
	var v uint64
	for i, shift := 0, uint(0); ; i, shift = i+1, shift+7 {
		if shift >= 64 {
			return 0, 0, errVarintTooLong
		}
		if i >= len(b) {
			return 0, 0, errTruncated
		}
		v |= uint64(b[i]&0x7f) << shift
		if b[i] < 0x80 {
			return v, i + 1, nil
		}
	}
}

func (f *protoFields) next() bool {
	if f.err != nil || len(f.b) == 0 {
		return false
	}
	key, n, err := uvarint(f.b)
	if err != nil {
		f.err = err
		return false
	}
	f.b = f.b[n:]
	f.num, f.typ = int32(key>>3), int(key&7)
	if f.num <= 0 {
		f.err = fmt.Errorf("protobuf: illegal field number %d", f.num)
		return false
	}
	if f.typ == wireEndGroup {
		f.err = errors.New("protobuf: end group outside a group")
		return false
	}
	rest, err := f.value(f.b)
	if err != nil {
		f.err = err
		return false
	}
	f.b = rest
	return true
}

// value reads the current field's value from the front of b and returns
// what follows it.
func (f *protoFields) value(b []byte) ([]byte, error) {
	switch f.typ {
	case wireVarint:
		v, n, err := uvarint(b)
		f.varint = v
		return b[n:], err
	case wireBytes:
		l, n, err := uvarint(b)
		if err != nil {
			return nil, err
		}
		if int(l) < 0 {
			return nil, errBadLength
		}
		b = b[n:]
		if int(l) > len(b) {
			return nil, errTruncated
		}
		f.data = b[:l]
		return b[l:], nil
	case wireFixed64:
		return skipN(b, 8)
	case wireFixed32:
		return skipN(b, 4)
	case wireStartGroup:
		return skipGroup(b)
	}
	return nil, fmt.Errorf("protobuf: illegal wire type %d", f.typ)
}

func skipN(b []byte, n int) ([]byte, error) {
	if len(b) < n {
		return nil, errTruncated
	}
	return b[n:], nil
}

// skipGroup skips the fields of a group up to its end.
func skipGroup(b []byte) ([]byte, error) {
	for {
		key, n, err := uvarint(b)
		if err != nil {
			return nil, err
		}
		b = b[n:]
		inner := protoFields{typ: int(key & 7)}
		if inner.typ == wireEndGroup {
			return b, nil
		}
		if b, err = inner.value(b); err != nil {
			return nil, err
		}
	}
}

// wrongType stops the walk: a field the decoder reads came with another
// wire type than its own, which gogo refuses too.
func (f *protoFields) wrongType(want int) {
	f.err = fmt.Errorf("protobuf: field %d has wire type %d, want %d", f.num, f.typ, want)
}

// bytes is the current field's value, a length-delimited one.
func (f *protoFields) bytes() []byte {
	if f.typ != wireBytes {
		f.wrongType(wireBytes)
		return nil
	}
	return f.data
}

// string is the current field's value as a string of its own.
func (f *protoFields) string() string { return string(f.bytes()) }

// enum is the current field's value, one of known if it is one (the
// constant, with no copy), else a string of its own.
func (f *protoFields) enum(known ...string) string {
	b := f.bytes()
	for _, k := range known {
		if string(b) == k {
			return k
		}
	}
	return string(b)
}

func (f *protoFields) uint() uint64 {
	if f.typ != wireVarint {
		f.wrongType(wireVarint)
		return 0
	}
	return f.varint
}

func (f *protoFields) int32() int32 { return int32(f.uint()) }

func (f *protoFields) bool() bool { return f.uint() != 0 }

// check ends the walk with err, the error of decoding a field's value.
// (The decoders of messages take the bytes of one and return an error,
// rather than a walk of it: a pointer handed to a function value would
// put each walk on the heap.)
func (f *protoFields) check(err error) {
	if err != nil && f.err == nil {
		f.err = err
	}
}

// mapEntry decodes b, an entry of a map<string, string>.
func mapEntry(b []byte) (key, value []byte, err error) {
	e := protoFields{b: b}
	for e.next() {
		switch e.num {
		case 1:
			key = e.bytes()
		case 2:
			value = e.bytes()
		}
	}
	return key, value, e.err
}
