package conntrack

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
)

// ipsConfirmed: a created entry is confirmed at once, and a CTA_STATUS
// that clears the bit is refused (EBUSY).
const ipsConfirmed = 1 << 3

// appendCreate encodes the creation of a flow with the given timeout in
// seconds (CT_NEW with NLM_F_CREATE|NLM_F_EXCL). nftproxy never creates
// flows; tests use it to fill a table quickly.
func (e *encoder) appendCreate(seq uint32, fl Flow, timeout uint32) {
	m := e.begin(ctMsgNew, unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK, seq, familyOf(fl))
	e.tuple(ctaTupleOrig, fl.Proto, fl.Orig)
	e.tuple(ctaTupleReply, fl.Proto, fl.Reply)
	e.BE32(ctaTimeout, timeout)
	if !fl.Unanswered {
		e.BE32(ctaStatus, ipsSeenReply|ipsConfirmed)
	}
	if fl.Zone != 0 {
		e.BE16(ctaZone, fl.Zone)
	}
	e.EndMsg(m)
}

// testFlows covers both families, UDP and SCTP, zones and IDs.
func testFlows() []Flow {
	v4 := natFlow(ProtoUDP, netip.MustParseAddrPort("10.1.0.1:40000"), netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.244.1.5:5353"))
	v6 := natFlow(ProtoSCTP, netip.MustParseAddrPort("[fd00:1::1]:40000"), netip.MustParseAddrPort("[fd00:96::10]:9"), netip.MustParseAddrPort("[fd00:244::5]:9999"))
	zoned := v4
	zoned.Orig.Src = netip.MustParseAddrPort("10.1.0.2:65535")
	zoned.Reply.Dst = zoned.Orig.Src
	zoned.Zone, zoned.ID = 65535, 0xfedcba98
	return []Flow{v4, v6, zoned}
}

// oneMessage checks that b holds exactly one netlink message and returns
// its type, flags, sequence number and payload.
func oneMessage(t *testing.T, b []byte) (typ, flags uint16, seq uint32, payload []byte) {
	t.Helper()
	n := 0
	if err := nlcodec.Messages(b, func(h nlcodec.Header, p []byte) error {
		typ, flags, seq, payload = h.Type, h.Flags, h.Seq, p
		n++
		return nil
	}); err != nil || n != 1 || int(binary.NativeEndian.Uint32(b)) != len(b) {
		t.Fatalf("want one message of %d bytes: %d messages, %v", len(b), n, err)
	}
	return
}

// TestEncodeParse: what we encode as a tuple, parseFlow reads back.
func TestEncodeParse(t *testing.T) {
	for _, fl := range testFlows() {
		var e encoder
		e.appendCreate(7, fl, 600)
		typ, flags, seq, payload := oneMessage(t, e.Buf)
		if typ != ctType(ctMsgNew) || seq != 7 || flags&unix.NLM_F_CREATE == 0 {
			t.Errorf("header: type %#x flags %#x seq %d", typ, flags, seq)
		}
		if payload[0] != familyOf(fl) {
			t.Errorf("nfgenmsg family %d, want %d", payload[0], familyOf(fl))
		}
		// A dump entry carries the ID too.
		withID := slices.Clone(payload)
		idAttr := binary.NativeEndian.AppendUint16(nil, 8)
		idAttr = binary.NativeEndian.AppendUint16(idAttr, ctaID)
		idAttr = binary.BigEndian.AppendUint32(idAttr, fl.ID)
		withID = append(withID, idAttr...)
		got, err := parseFlow(withID)
		if err != nil {
			t.Fatal(err)
		}
		if got != fl {
			t.Errorf("parsed %+v, want %+v", got, fl)
		}
	}
}

// TestDeleteMessage: a delete always names the tuple (without one the
// kernel would flush the table), its ID and zone when known, and asks for
// an ACK.
func TestDeleteMessage(t *testing.T) {
	for _, fl := range append(testFlows(), Flow{Proto: ProtoUDP}) {
		var e encoder
		e.appendDelete(42, fl)
		typ, flags, seq, payload := oneMessage(t, e.Buf)
		if typ != ctType(ctMsgDelete) || seq != 42 || flags != unix.NLM_F_REQUEST|unix.NLM_F_ACK {
			t.Errorf("header: type %#x flags %#x seq %d", typ, flags, seq)
		}
		var types []uint16
		var orig []byte
		if err := nlcodec.Attrs(payload[nlcodec.GenHeaderLen:], func(typ uint16, data []byte) {
			types = append(types, typ)
			if typ == ctaTupleOrig {
				orig = data
			}
		}); err != nil {
			t.Fatal(err)
		}
		want := []uint16{ctaTupleOrig}
		if fl.ID != 0 {
			want = append(want, ctaID)
		}
		if fl.Zone != 0 {
			want = append(want, ctaZone)
		}
		if !slices.Equal(types, want) {
			t.Errorf("attributes %v, want %v", types, want)
		}
		if !fl.Orig.Src.IsValid() {
			continue // the zero flow: still a tuple, of zero addresses
		}
		var d nlcodec.Decoder
		tup, proto, ok := parseTuple(&d, orig)
		if !ok || d.Err() != nil || tup != fl.Orig || proto != fl.Proto {
			t.Errorf("tuple %+v proto %d (%v), want %+v %d", tup, proto, d.Err(), fl.Orig, fl.Proto)
		}
	}
}

func TestDumpRequest(t *testing.T) {
	for _, proto := range []uint8{0, ProtoUDP, ProtoTCP} {
		unanswered := proto == ProtoTCP
		var e encoder
		e.appendDump(3, uint8(IPv6), proto, unanswered)
		typ, flags, _, payload := oneMessage(t, e.Buf)
		if typ != ctType(ctMsgGet) || flags != unix.NLM_F_REQUEST|unix.NLM_F_DUMP || payload[0] != unix.AF_INET6 {
			t.Errorf("header: type %#x flags %#x family %d", typ, flags, payload[0])
		}
		var types []uint16
		var filterFlags uint32
		var num uint8
		status, mask := uint32(1), uint32(0)
		_ = nlcodec.Attrs(payload[nlcodec.GenHeaderLen:], func(typ uint16, data []byte) {
			types = append(types, typ)
			switch typ {
			case ctaStatus:
				status = binary.BigEndian.Uint32(data)
			case ctaStatusMask:
				mask = binary.BigEndian.Uint32(data)
			case ctaFilter:
				_ = nlcodec.Attrs(data, func(typ uint16, data []byte) {
					if typ == ctaFilterOrigFlags {
						filterFlags = binary.NativeEndian.Uint32(data)
					}
				})
			case ctaTupleOrig:
				_ = nlcodec.Attrs(data, func(typ uint16, data []byte) {
					_ = nlcodec.Attrs(data, func(typ uint16, data []byte) {
						if typ == ctaProtoNum {
							num = data[0]
						}
					})
				})
			}
		})
		if proto == 0 && len(types) != 0 {
			t.Errorf("unfiltered dump has attributes %v", types)
		}
		want := []uint16{ctaTupleOrig, ctaFilter}
		if unanswered {
			want = append(want, ctaStatus, ctaStatusMask)
		}
		if proto != 0 && (!slices.Equal(types, want) || filterFlags != ctaFilterFlagProtoNum || num != proto) {
			t.Errorf("filtered dump: attributes %v, flags %#x, protocol %d", types, filterFlags, num)
		}
		if unanswered && (status != 0 || mask != ipsSeenReply|ipsDstNAT) {
			t.Errorf("status filter: status %#x mask %#x, want 0 and %#x", status, mask, ipsSeenReply|ipsDstNAT)
		}
	}
}

func TestParseFlowRejects(t *testing.T) {
	var e encoder
	m := e.begin(ctMsgNew, 0, 1, unix.AF_INET)
	e.tuple(ctaTupleOrig, ProtoUDP, testFlows()[0].Orig)
	e.EndMsg(m)
	if _, err := parseFlow(e.Buf[nlcodec.HeaderLen:]); err == nil {
		t.Error("a flow without reply tuple parsed")
	}
	if _, err := parseFlow([]byte{2, 0}); err == nil {
		t.Error("a short message parsed")
	}
	// A whole flow, cut short inside its last attribute: an error, not
	// a flow decoded in part.
	e = encoder{}
	e.appendCreate(1, testFlows()[2], 1)
	if fl, err := parseFlow(e.Buf[nlcodec.HeaderLen : len(e.Buf)-3]); !errors.Is(err, nlcodec.ErrMalformed) {
		t.Errorf("a truncated flow parsed: %+v, error %v", fl, err)
	}
	// An address of the wrong length.
	e = encoder{}
	m = e.begin(ctMsgNew, 0, 1, unix.AF_INET)
	for _, typ := range []uint16{ctaTupleOrig, ctaTupleReply} {
		tup := e.Nest(typ)
		ip := e.Nest(ctaTupleIP)
		e.Attr(ctaIPv4Src, []byte{10, 0, 0})
		e.Attr(ctaIPv4Dst, []byte{10, 0, 0, 1})
		e.EndNest(ip)
		e.EndNest(tup)
	}
	e.EndMsg(m)
	if fl, err := parseFlow(e.Buf[nlcodec.HeaderLen:]); !errors.Is(err, nlcodec.ErrMalformed) {
		t.Errorf("a 3-byte address parsed: %+v, error %v", fl, err)
	}
}

// FuzzParseFlow: no input makes the decoder panic, and whatever it
// accepts has valid addresses.
func FuzzParseFlow(f *testing.F) {
	for _, fl := range testFlows() {
		var e encoder
		e.appendCreate(1, fl, 1)
		f.Add(e.Buf[nlcodec.HeaderLen:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, err := parseFlow(b)
		if err == nil && (!fl.Orig.Src.IsValid() || !fl.Reply.Dst.IsValid()) {
			t.Errorf("accepted a flow with invalid addresses: %+v", fl)
		}
	})
}

// TestCreateMatchesConntrackList checks our tuple encoding against the
// kernel and the conntrack tool, independently of our decoder: flows we
// create are listed by `conntrack -L` as we meant them.
func TestCreateMatchesConntrackList(t *testing.T) {
	ns := newTestNS(t)
	s, err := ns.netlink(t).open()
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	var udp []Flow // SCTP would need vtags, TCP a state
	for _, fl := range testFlows() {
		fl.Proto, fl.ID = ProtoUDP, 0
		udp = append(udp, fl)
	}
	first := s.seq.Next(len(udp))
	for i, fl := range udp {
		s.enc.appendCreate(first+uint32(i), fl, 600)
	}
	if err := s.exchange(reconcileCtx(t), first, len(udp), func(i int, ack nlcodec.Ack) {
		if err := ack.Err(); err != nil {
			t.Errorf("create %s: %v", udp[i], err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	listed := append(ns.list(t, IPv4), ns.list(t, IPv6)...)
	if diff := flowDiff(listed, udp); diff != "" {
		t.Error(diff)
	}
}
