package nftnl

import (
	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// These tests need neither root nor nft; the kernel tests in
// netlink_test.go and netlink_nftbytes_test.go check the same facts against
// the kernel and nft itself.

func littleEndianHost(t *testing.T) {
	t.Helper()
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("expected bytes were captured on a little-endian host")
	}
}

// TestSetUserdataMatchesNft: NEWSET userdata as nft 1.0.6 wrote it on x86
// (`nft --debug=mnl -f`, 2026-11), for each set shape nftproxy uses.
func TestSetUserdataMatchesNft(t *testing.T) {
	littleEndianHost(t)
	v4, v6 := nft.TypeIPv4Addr, nft.TypeIPv6Addr
	for _, tc := range []struct {
		name string
		set  nft.Set
		want string
	}{
		{"vmap ipv4_addr . inet_proto . inet_service with comment",
			nft.Set{Key: []nft.DataType{v4, nft.TypeInetProto, nft.TypeInetService}, Data: []nft.DataType{nft.TypeVerdict}, Comment: "ClusterIP"},
			// keyorder 0, dataorder 0, typeof{concat, no fields}, data interval 0, comment
			"000400000000" + "010400000000" + "030800040d0000000100" + "060400000000" + "070a436c7573746572495000"},
		{"vmap ipv6_addr . inet_proto . inet_service",
			nft.Set{Key: []nft.DataType{v6, nft.TypeInetProto, nft.TypeInetService}, Data: []nft.DataType{nft.TypeVerdict}},
			"000400000000010400000000030800040d0000000100060400000000"},
		{"vmap inet_proto . inet_service",
			nft.Set{Key: []nft.DataType{nft.TypeInetProto, nft.TypeInetService}, Data: []nft.DataType{nft.TypeVerdict}},
			"000400000000010400000000030800040d0000000100060400000000"},
		{"set ipv4_addr", nft.Set{Key: []nft.DataType{v4}}, "000402000000"},
		{"set ipv6_addr, dynamic, timeout, size",
			nft.Set{Key: []nft.DataType{v6}, Dynamic: true, Timeout: 10 * time.Minute, Size: 65535}, "000402000000"},
		{"set ipv4_addr . ipv4_addr . inet_proto . inet_service",
			nft.Set{Key: []nft.DataType{v4, v4, nft.TypeInetProto, nft.TypeInetService}},
			"000400000000030800040d0000000100"},
		// typeof numgen random mod 65536 : ip daddr . tcp dport; flags interval; comment "c"
		{"endpoints map ip tcp with comment", *withComment(nft.NewEndpointsMap(nft.IPv4, "m", nft.ProtoTCP), "c"),
			// key byte order host, data byte order none
			"000401000000" + "010400000000" +
				// key typeof: numgen{random, 65536, 0}
				"031a" + "000417000000" + "0112" + "000401000000" + "010400000100" + "020400000000" +
				// data typeof: concat{0: payload{ip(12), daddr(12)}, 1: payload{tcp(8), dport(2)}}
				"0434" + "00040d000000" + "012c" +
				"0014" + "000407000000" + "010c" + "00040c000000" + "01040c000000" +
				"0114" + "000407000000" + "010c" + "000408000000" + "010402000000" +
				"060400000000" + "07026300"},
		{"endpoints map ip6 udp", *nft.NewEndpointsMap(nft.IPv6, "m", nft.ProtoUDP),
			"000401000000010400000000031a0004170000000112000401000000010400000100020400000000043400040d000000012c" +
				"0014000407000000010c00040d0000000104090000000114000407000000010c000406000000010402000000060400000000"},
		{"endpoints map ip6 sctp", *nft.NewEndpointsMap(nft.IPv6, "m", nft.ProtoSCTP),
			"000401000000010400000000031a0004170000000112000401000000010400000100020400000000043400040d000000012c" +
				"0014000407000000010c00040d0000000104090000000114000407000000010c00040a000000010402000000060400000000"},
	} {
		family := nft.IPv4
		if tc.set.EndpointsProto != 0 && tc.set.Data[0] == v6 {
			family = nft.IPv6
		}
		got, err := setUserdata(family, &tc.set)
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(got) != tc.want {
			t.Errorf("%s:\n got %x\nwant %s", tc.name, got, tc.want)
		}
	}
}

func withComment(s *nft.Set, c string) *nft.Set {
	s.Comment = c
	return s
}

func TestSetTypeAndLength(t *testing.T) {
	for _, tc := range []struct {
		types []nft.DataType
		magic uint32
		len   int
	}{
		{[]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, 0x730d, 12}, // nft: 0x0000730d, 12
		{[]nft.DataType{nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService}, 0x830d, 24},
		{[]nft.DataType{nft.TypeInetProto, nft.TypeInetService}, 0x030d, 8},
		{[]nft.DataType{nft.TypeIPv6Addr, nft.TypeIPv6Addr, nft.TypeInetProto, nft.TypeInetService}, 0x20830d, 40},
		{[]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetService}, 0x1cd, 8}, // 7<<6 | 13
		{[]nft.DataType{nft.TypeIPv6Addr, nft.TypeInetService}, 0x20d, 20},
		{[]nft.DataType{nft.TypeInetProto}, 12, 1},
		{nft.NewEndpointsMap(nft.IPv4, "m", nft.ProtoTCP).Key, 4, 4}, // nft: integer, 4
		{nft.NewEndpointsMap(nft.IPv4, "m", nft.ProtoTCP).Data, 0x1cd, 8},
		{nft.NewEndpointsMap(nft.IPv6, "m", nft.ProtoTCP).Data, 0x20d, 20},
	} {
		if m, l := typeMagic(tc.types), tupleLen(tc.types); m != tc.magic || l != tc.len {
			t.Errorf("%v: magic %#x len %d, want %#x %d", tc.types, m, l, tc.magic, tc.len)
		}
	}
}

func TestEncodeTuple(t *testing.T) {
	littleEndianHost(t)
	a4, a6 := netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")
	for _, tc := range []struct {
		types []nft.DataType
		vals  []nft.Datum
		want  string
	}{
		// nft: element 0a60000a 00000006 00005000
		{[]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetProto, nft.TypeInetService}, []nft.Datum{nft.Addr(a4), nfttest.TCP, nft.Int(80)}, "0a60000a0600000000500000"},
		{[]nft.DataType{nft.TypeIPv6Addr, nft.TypeInetService}, []nft.Datum{nft.Addr(a6), nft.Int(8080)}, "fd000096000000000000000000000010" + "1f900000"},
		{[]nft.DataType{nft.TypeIPv4Addr}, []nft.Datum{nft.Addr(a4)}, "0a60000a"},
		{[]nft.DataType{nft.TypeInetService}, []nft.Datum{nft.Int(53)}, "0035"},
		{[]nft.DataType{nft.TypeMark}, []nft.Datum{nft.Int(0x4000)}, "00400000"},
	} {
		got, err := encodeTuple(nft.IPv4, tc.types, tc.vals)
		if err != nil || hex.EncodeToString(got) != tc.want {
			t.Errorf("%v %v: %x, %v; want %s", tc.types, tc.vals, got, err, tc.want)
		}
	}
	// An endpoints map's keys are in network byte order (nft: element
	// 00800000 for 32768, the rule's byteorder hton).
	m := nft.NewEndpointsMap(nft.IPv4, "m", nft.ProtoTCP)
	if got, err := encodeKey(nft.IPv4, m, []nft.Datum{nft.Int(65536 + 32767)}); err != nil ||
		hex.EncodeToString(got) != "00017fff" {
		t.Errorf("endpoints key: %x, %v", got, err)
	}
	for _, bad := range []struct {
		types []nft.DataType
		vals  []nft.Datum
	}{
		{[]nft.DataType{nft.TypeIPv4Addr}, []nft.Datum{nft.Addr(a6)}},
		{[]nft.DataType{nft.TypeIPv6Addr}, []nft.Datum{nft.Addr(netip.MustParseAddr("::ffff:10.0.0.1"))}},
		{[]nft.DataType{nft.TypeInetProto}, []nft.Datum{nft.Int(256)}},
		{[]nft.DataType{nft.TypeInetService}, []nft.Datum{nft.Int(65536)}},
		{[]nft.DataType{nft.TypeIPv4Addr, nft.TypeInetService}, []nft.Datum{nft.Addr(a4)}},
	} {
		if _, err := encodeTuple(nft.IPv4, bad.types, bad.vals); err == nil {
			t.Errorf("%v %v: no error", bad.types, bad.vals)
		}
	}
}

func TestSlotReg(t *testing.T) {
	// nft --debug=netlink: ip daddr . meta l4proto . th dport → reg 1, 9, 10;
	// ip6: reg 1, 2, 13; ip6 saddr . ip6 daddr . l4proto . dport → 1, 2, 3, 17.
	for slot, want := range map[int]uint32{0: 1, 1: 9, 2: 10, 4: 2, 5: 13, 8: 3, 9: 17} {
		if got := slotReg(slot); got != want {
			t.Errorf("slot %d: reg %d, want %d", slot, got, want)
		}
	}
}

// TestElementSplitting: a long element list becomes several messages of
// the same batch, each below the limit, every element exactly once.
func TestElementSplitting(t *testing.T) {
	defer func(old int) { maxElemListLen = old }(maxElemListLen)
	maxElemListLen = 1000
	s := &nft.Set{Name: "cluster-ips", Key: []nft.DataType{nft.TypeIPv4Addr}}
	var elems []nft.Element
	for i := range 500 {
		elems = append(elems, nft.Element{Key: []nft.Datum{nft.Addr(netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}))}})
	}
	tx := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{{Kind: nft.OpAddSet, Set: s}, {Kind: nft.OpAddElements, Set: s, Elements: elems}}}
	b, err := encodeTransaction(tx, batchOptions{firstSeq: 7})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	msgs := 0
	for i, m := range splitMessages(b.enc.Buf) {
		if seq := binary.NativeEndian.Uint32(m[8:]); seq != 7+uint32(i) {
			t.Errorf("message %d has sequence %d", i, seq)
		}
		if binary.NativeEndian.Uint16(m[4:])&0xff != unix.NFT_MSG_NEWSETELEM {
			continue
		}
		msgs++
		if b.owners[i] != 1 {
			t.Errorf("element message %d owned by op %d", i, b.owners[i])
		}
		list := (&nla{kids: parseNLAs(m[20:])}).child(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		if len(list.data)+4 > maxElemListLen {
			t.Errorf("element list of %d bytes", len(list.data)+4)
		}
		if id := (&nla{kids: parseNLAs(m[20:])}).child(unix.NFTA_SET_ELEM_LIST_SET_ID); id == nil {
			t.Errorf("element message without the set ID of the set created in the batch")
		}
		for _, e := range list.kids {
			seen[hex.EncodeToString(e.child(unix.NFTA_SET_ELEM_KEY).child(unix.NFTA_DATA_VALUE).data)]++
		}
	}
	if msgs < 500*16/1000 {
		t.Errorf("%d element messages", msgs)
	}
	if len(seen) != 500 {
		t.Errorf("%d distinct elements sent", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("element %s sent %d times", k, n)
		}
	}
	if b.elements != 500 {
		t.Errorf("counted %d elements", b.elements)
	}
}

func TestEncodeErrorsNameTheOp(t *testing.T) {
	s := &nft.Set{Name: "cluster-ips", Key: []nft.DataType{nft.TypeIPv4Addr}}
	for _, tc := range []struct {
		op   nft.Op
		want string
	}{
		{nft.Op{Kind: nft.OpAddElements, Set: s, Elements: []nft.Element{{Key: []nft.Datum{nft.Addr(netip.MustParseAddr("fd00::1"))}}}},
			`op 0 add-elements "cluster-ips": element fd00::1: key: field 0: fd00::1 is not an IPv4 address`},
		{nft.Op{Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{nft.MatchL4Proto{Proto: nft.ProtoTCP},
			nft.DNAT{To: netip.MustParseAddrPort("[fd00::1]:80")}}}},
			`op 0 add-rule "c": rule "meta l4proto tcp dnat to [fd00::1]:80": fd00::1 is not an ip address`},
		{nft.Op{Kind: nft.OpAddRule, ChainName: "c", Rule: nft.Rule{Phrases: []nft.Phrase{nft.Drop()}, Comment: strings.Repeat("x", 300)}},
			`op 0 add-rule "c": comment`},
		{nft.Op{Kind: nft.OpAddSet, Set: &nft.Set{Name: "s", Key: []nft.DataType{nft.TypeIPv4Addr}, Comment: strings.Repeat("x", 255)}},
			`op 0 add-set "s": comment`},
	} {
		_, err := encodeTransaction(&nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{tc.op}}, batchOptions{firstSeq: 1})
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("error %v, want prefix %q", err, tc.want)
		}
	}
}

// TestParseReplies: errors with and without NLM_F_CAPPED, with an extended
// ACK message (mdlayher/netlink v1.11.2 fails on the capped form).
func TestParseReplies(t *testing.T) {
	errMsg := func(seq uint32, errno int32, flags uint16, reqPayload []byte, ext string) []byte {
		var b []byte
		b = binary.NativeEndian.AppendUint32(b, 0)
		b = binary.NativeEndian.AppendUint16(b, unix.NLMSG_ERROR)
		b = binary.NativeEndian.AppendUint16(b, flags)
		b = binary.NativeEndian.AppendUint32(b, seq)
		b = binary.NativeEndian.AppendUint32(b, 0)
		b = binary.NativeEndian.AppendUint32(b, uint32(errno))
		// the request's header: length includes its payload even if capped
		b = binary.NativeEndian.AppendUint32(b, uint32(nlcodec.HeaderLen+len(reqPayload)+64))
		b = append(b, make([]byte, 12)...)
		if flags&unix.NLM_F_CAPPED == 0 {
			b = append(b, reqPayload...)
			b = append(b, make([]byte, 64)...)
		}
		if ext != "" {
			e := encoder{nlcodec.Encoder{Buf: b}}
			e.Str(unix.NLMSGERR_ATTR_MSG, ext)
			e.BE32(unix.NLMSGERR_ATTR_OFFS, 20)
			b = e.Buf
		}
		binary.NativeEndian.PutUint32(b, uint32(len(b)))
		return b
	}
	dgram := append(errMsg(5, -int32(unix.ENOENT), unix.NLM_F_CAPPED|unix.NLM_F_ACK_TLVS, nil, "no such chain"),
		errMsg(6, -int32(unix.EEXIST), unix.NLM_F_ACK_TLVS, []byte{1, 2, 3, 4}, "exists")...)
	dgram = append(dgram, errMsg(7, 0, unix.NLM_F_CAPPED, nil, "")...)
	got, err := parseReplies(dgram)
	if err != nil {
		t.Fatal(err)
	}
	want := []reply{
		{typ: unix.NLMSG_ERROR, seq: 5, ack: nlcodec.Ack{Errno: unix.ENOENT, Msg: "no such chain"}},
		{typ: unix.NLMSG_ERROR, seq: 6, ack: nlcodec.Ack{Errno: unix.EEXIST, Msg: "exists"}},
		{typ: unix.NLMSG_ERROR, seq: 7},
	}
	if len(got) != len(want) {
		t.Fatalf("%d replies, want %d", len(got), len(want))
	}
	for i := range want {
		g := got[i]
		if g.typ != want[i].typ || g.seq != want[i].seq || g.ack != want[i].ack {
			t.Errorf("reply %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestDescribeError(t *testing.T) {
	tx := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{
		{Kind: nft.OpResetTable},
		{Kind: nft.OpAddChain, Chain: &nft.Chain{Name: "svc"}},
		{Kind: nft.OpAddRule, ChainName: "svc", Rule: nft.Rule{Phrases: []nft.Phrase{nft.Jump("missing")}}},
	}}
	b, err := encodeTransaction(tx, batchOptions{firstSeq: 100})
	if err != nil {
		t.Fatal(err)
	}
	// begin, 3 table messages, chain, rule, end
	if len(b.owners) != 7 {
		t.Fatalf("%d messages", len(b.owners))
	}
	err = describeError(tx, b, []msgError{{5, nlcodec.Ack{Errno: unix.ENOENT}}, {6, nlcodec.Ack{Errno: unix.EINVAL}}})
	if want := `op 2 add-rule "svc" (rule "jump missing"): no such file or directory (and 1 more errors)`; err.Error() != want {
		t.Errorf("got %q\nwant %q", err, want)
	}
	if !errors.Is(err, unix.ENOENT) {
		t.Errorf("%v does not wrap ENOENT", err)
	}
	err = describeError(tx, b, []msgError{{0, nlcodec.Ack{Errno: unix.ENOMEM, Msg: "commit failed"}}})
	if want := "commit: cannot allocate memory (kernel: commit failed)"; err.Error() != want {
		t.Errorf("got %q, want %q", err, want)
	}
}

// TestBatchBufferOffHeap: a batch encoded into an anonymous mapping is the
// batch encoded into the heap, also when it outgrows the mapping (append
// moves it to the heap; the mapping is unmapped all the same).
func TestBatchBufferOffHeap(t *testing.T) {
	tx := listElements(nft.Diff(nil, shapeSRuleset(nft.IPv4, 64, nfttest.MakeServices(nft.IPv4, 3000, 5))))
	heap, err := encodeTransaction(tx, batchOptions{firstSeq: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(heap.enc.Buf) < 2*offHeapBatch {
		t.Fatalf("a batch of %d bytes does not test a mapping of half its size", len(heap.enc.Buf))
	}
	for _, tc := range []struct {
		name  string
		scale func(n int) int
	}{{"room", func(n int) int { return n }}, {"outgrown", func(n int) int { return n / 2 }}} {
		t.Run(tc.name, func(t *testing.T) {
			bb := &batchBuffer{}
			b, err := encodeTransaction(tx, batchOptions{firstSeq: 1, buffer: func(n int) []byte { return bb.get(tc.scale(n)) }})
			if err != nil {
				t.Fatal(err)
			}
			if bb.region == nil {
				t.Fatal("no mapping for a batch this size")
			}
			if !bytes.Equal(b.enc.Buf, heap.enc.Buf) {
				t.Errorf("batches differ: %d and %d bytes", len(b.enc.Buf), len(heap.enc.Buf))
			}
			bb.release()
			if bb.region != nil {
				t.Error("release left the mapping")
			}
		})
	}
}

// listElements turns the AllElements ops of tx into ops listing the
// elements, in one order, so that tx encodes the same every time.
func listElements(tx *nft.Transaction) *nft.Transaction {
	out := &nft.Transaction{Family: tx.Family, Ops: slices.Clone(tx.Ops)}
	for i, op := range out.Ops {
		if op.AllElements {
			out.Ops[i].Elements, out.Ops[i].AllElements = slices.Collect(op.AllOf()), false
		}
	}
	return out
}

// TestAllElementsEncodeAsList: an op adding every element of its set
// (a full rewrite's) encodes as the op listing those elements: the same
// messages, but for the order of the elements.
func TestAllElementsEncodeAsList(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		tx := nft.Diff(nil, shapeSRuleset(f, 64, nfttest.MakeServices(f, 300, 3)))
		all, err := encodeTransaction(tx, batchOptions{firstSeq: 1})
		if err != nil {
			t.Fatal(err)
		}
		listed, err := encodeTransaction(listElements(tx), batchOptions{firstSeq: 1})
		if err != nil {
			t.Fatal(err)
		}
		a, l := batchElements(all.enc.Buf), batchElements(listed.enc.Buf)
		if !reflect.DeepEqual(a, l) {
			t.Errorf("%s: the elements differ", f)
		}
		if len(a) < 5 || all.elements != listed.elements || all.elements == 0 {
			t.Errorf("%s: %d sets with elements, %d and %d elements", f, len(a), all.elements, listed.elements)
		}
		if len(all.enc.Buf) != len(listed.enc.Buf) || !reflect.DeepEqual(all.owners, listed.owners) {
			t.Errorf("%s: batches of %d and %d bytes, %d and %d messages", f,
				len(all.enc.Buf), len(listed.enc.Buf), len(all.owners), len(listed.owners))
		}
	}
}

// batchElements returns, by set name, the sorted encodings of the elements
// a batch adds, and the other messages whole under the key "".
func batchElements(b []byte) map[string][]string {
	out := map[string][]string{}
	for _, m := range splitMessages(b) {
		if binary.NativeEndian.Uint16(m[4:])&0xff != unix.NFT_MSG_NEWSETELEM {
			out[""] = append(out[""], hex.EncodeToString(m[8:])) // without length and type: sequence on
			continue
		}
		attrs := &nla{kids: parseNLAs(m[20:])}
		set := string(attrs.child(unix.NFTA_SET_ELEM_LIST_SET).data)
		for _, e := range attrs.child(unix.NFTA_SET_ELEM_LIST_ELEMENTS).kids {
			out[set] = append(out[set], hex.EncodeToString(e.data))
		}
	}
	for k, v := range out {
		if k != "" {
			slices.Sort(v)
		}
	}
	return out
}
