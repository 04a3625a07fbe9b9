package nftnl

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
	"golang.org/x/sys/unix"
)

// elementMessages encodes the elements of s as Apply would and returns the
// attributes of each NEWSETELEM message, as a set element dump returns
// them.
func elementMessages(tb testing.TB, s *nft.Set) [][]byte {
	tb.Helper()
	tx := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{{Kind: nft.OpAddElements, Set: s, AllElements: true}}}
	b, err := encodeTransaction(tx, batchOptions{firstSeq: 1})
	if err != nil {
		tb.Fatal(err)
	}
	var out [][]byte
	for buf := b.enc.Buf; len(buf) >= 16; {
		l := int(binary.NativeEndian.Uint32(buf))
		if binary.NativeEndian.Uint16(buf[4:])&0xff == unix.NFT_MSG_NEWSETELEM {
			out = append(out, buf[16+4:l])
		}
		buf = buf[(l+3)&^3:]
	}
	return out
}

// benchSets are a verdict map keyed by address . protocol . port and an
// endpoints map, 10,000 elements each.
func benchSets() []*nft.Set {
	vm := &nft.Set{Name: "vmap", Key: []nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService},
		Data: []nft.DataType{nft.TypeVerdict}}
	ep := nft.NewEndpointsMap(nft.IPv4, "endpoints", nft.ProtoTCP)
	for i := range 10000 {
		a := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		vm.Elements.Put(nft.Element{Key: []nft.Datum{nft.Addr(a), {Int: 6}, {Int: 80}},
			Verdict: &nft.Verdict{Kind: nft.VerdictJump, Chain: "svc-x"}, Comment: "ns/svc:http"})
	}
	for slot := range uint16(2000) {
		eps := make([]netip.AddrPort, 5)
		for j := range eps {
			eps[j] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte(slot >> 4), byte(j)}), 8080)
		}
		for _, e := range nft.EndpointsElements(slot, eps) {
			ep.Elements.Put(e)
		}
	}
	return []*nft.Set{vm, ep}
}

// BenchmarkDecodeElements decodes the element dump of a set, as Load does
// (the set's own growth included).
func BenchmarkDecodeElements(b *testing.B) {
	for _, s := range benchSets() {
		msgs := elementMessages(b, s)
		b.Run(s.Name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				into := &nft.Set{Name: s.Name, Key: s.Key, Data: s.Data, EndpointsProto: s.EndpointsProto}
				var ends []uint32
				var sc elementScratch
				for _, m := range msgs {
					if err := decodeElements(nft.IPv4, into, m, &ends, &sc, nil); err != nil {
						b.Fatal(err)
					}
				}
				if into.Elements.Len() != s.Elements.Len() {
					b.Fatalf("decoded %d elements, want %d", into.Elements.Len(), s.Elements.Len())
				}
			}
		})
	}
}

// TestDecodeReportsMalformed: an element dump, a chain or a set whose
// attributes do not fit is an error, not a set or chain read in part.
func TestDecodeReportsMalformed(t *testing.T) {
	for _, s := range benchSets() {
		msgs := elementMessages(t, s)
		last := msgs[len(msgs)-1]
		// The element list's length claims 8 bytes more than there are.
		bad := slices.Clone(last)
		var d nlcodec.Decoder
		d.Attrs(bad, func(typ uint16, data []byte) {
			if typ == unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				off := len(bad) - len(data) - nlcodec.AttrLen
				binary.NativeEndian.PutUint16(bad[off:], uint16(len(data)+nlcodec.AttrLen+8))
			}
		})
		bad = append(bad, 0, 0, 0, 0) // room for the claim to run past
		into := &nft.Set{Name: s.Name, Key: s.Key, Data: s.Data, EndpointsProto: s.EndpointsProto}
		var ends []uint32
		var sc elementScratch
		if err := decodeElements(nft.IPv4, into, bad, &ends, &sc, nil); !errors.Is(err, nlcodec.ErrMalformed) {
			t.Errorf("set %s: a malformed element list decoded (%d elements), error %v", s.Name, into.Elements.Len(), err)
		}
		if err := decodeElements(nft.IPv4, into, last[:len(last)-3], &ends, &sc, nil); !errors.Is(err, nlcodec.ErrMalformed) {
			t.Errorf("set %s: a truncated element list decoded, error %v", s.Name, err)
		}
	}
	var e encoder
	e.Str(unix.NFTA_CHAIN_TABLE, nft.TableName)
	e.Str(unix.NFTA_CHAIN_NAME, "c")
	h := e.Nest(unix.NFTA_CHAIN_HOOK)
	e.Attr(unix.NFTA_HOOK_HOOKNUM, []byte{0, 0, 1}) // a u32 of 3 bytes
	e.EndNest(h)
	var d nlcodec.Decoder
	if c, _ := decodeChain(&d, e.Buf); !errors.Is(d.Err(), nlcodec.ErrMalformed) {
		t.Errorf("a chain with a 3-byte hook number decoded: %+v, error %v", c, d.Err())
	}
	e = encoder{}
	e.Str(unix.NFTA_SET_TABLE, nft.TableName)
	e.Str(unix.NFTA_SET_NAME, "s")
	e.Buf = append(e.Buf, 8, 0, unix.NFTA_SET_FLAGS, 0) // header only: runs past the end
	d = nlcodec.Decoder{}
	if s := decodeSet(&d, nft.IPv4, e.Buf); !errors.Is(d.Err(), nlcodec.ErrMalformed) {
		t.Errorf("a truncated set decoded: %+v, error %v", s, d.Err())
	}
}

// TestMonitorMalformedNotification: a notification whose attributes do
// not fit is an error (Run reports it as a Lost commit: what it changed
// cannot be told), not a change of another table.
func TestMonitorMalformedNotification(t *testing.T) {
	var e encoder
	m := e.BeginMsg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWCHAIN, 0, 0, uint8(nft.IPv4), 0)
	e.Str(unix.NFTA_CHAIN_TABLE, nft.TableName)
	e.Str(unix.NFTA_CHAIN_NAME, "c")
	e.EndMsg(m)
	var acc commitAccumulator
	h := nlcodec.Header{Type: unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN, PortID: 42}
	if _, _, err := acc.add(h, e.Buf[nlcodec.HeaderLen:]); err != nil || len(acc.order) != 1 {
		t.Fatalf("a chain notification: %d changes, error %v", len(acc.order), err)
	}
	if _, _, err := acc.add(h, e.Buf[nlcodec.HeaderLen:len(e.Buf)-3]); !errors.Is(err, nlcodec.ErrMalformed) {
		t.Errorf("a truncated notification: error %v", err)
	}
}
