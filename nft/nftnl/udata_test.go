package nftnl

import (
	"reflect"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// TestRuleUserdata: the comment and the digest share the userdata; a digest
// that would not fit the kernel's 256 bytes next to a long comment is left
// out, the comment never.
func TestRuleUserdata(t *testing.T) {
	d := nft.RulesDigest{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	for _, tc := range []struct {
		comment string
		digest  *nft.RulesDigest
	}{
		{"masquerade", nil},
		{"", &d},
		{"masquerade", &d},
		{strings.Repeat("c", 235), &d}, // 2+236 + 2+16 = 256: fits
		{strings.Repeat("c", 236), &d}, // 257: the digest is left out
		{strings.Repeat("c", 253), &d},
	} {
		var e encoder
		if err := e.ruleUserdata(tc.comment, tc.digest); err != nil {
			t.Fatal(err)
		}
		attrs := parseNLAs(e.Buf)
		if len(attrs) != 1 || len(attrs[0].data) > 256 {
			t.Fatalf("comment of %d bytes: %v", len(tc.comment), attrs)
		}
		want := tc.digest != nil && (tc.comment == "" || 2+len(tc.comment)+1+2+16 <= 256)
		if got, ok := ruleDigest(attrs[0].data); ok != want || ok && got != d {
			t.Errorf("comment of %d bytes: digest %x %v, want %v", len(tc.comment), got, ok, want)
		}
		if tc.comment != "" && !strings.HasPrefix(string(attrs[0].data[2:]), tc.comment+"\x00") {
			t.Errorf("comment of %d bytes lost", len(tc.comment))
		}
	}
	var e encoder
	if e.ruleUserdata("", nil); len(e.Buf) != 0 {
		t.Errorf("no comment, no digest: wrote %x", e.Buf)
	}
	if err := e.ruleUserdata(strings.Repeat("c", 254), nil); err == nil {
		t.Error("a 254-byte comment was accepted: with its type, length and NUL it exceeds 256 bytes")
	}
}

// TestDecodeInvertsEncode: the set types and element values Load decodes
// are the ones newSet and setElements encode, for every set shape.
func TestDecodeInvertsEncode(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		for _, rs := range []*nft.Ruleset{nfttest.EveryPhraseRuleset(f), nfttest.RealisticRuleset(f, nfttest.MakeServices(f, 60, 2))} {
			for _, s := range rs.Sets {
				key, ok := decodeTypes(typeMagic(s.Key), uint32(tupleLen(s.Key)))
				if !ok || !reflect.DeepEqual(key, s.Key) {
					t.Errorf("%s: key types %v decoded as %v", s.Name, s.Key, key)
				}
				for e := range s.Elements.All() {
					b, err := encodeKey(f, s, e.Key)
					if err != nil {
						t.Fatal(err)
					}
					got, err := decodeTupleOrder(nil, f, s.Key, b, s.EndpointsProto != 0)
					if err != nil || s.KeyString(got) != s.KeyString(e.Key) {
						t.Errorf("%s: key %s decoded as %v (%v)", s.Name, s.KeyString(e.Key), got, err)
					}
				}
			}
		}
	}
	if _, ok := decodeTypes(typeMagic([]nft.DataType{nft.TypeIPv4Addr}), 16); ok {
		t.Error("a length that does not fit the type was accepted")
	}
	if _, ok := decodeTypes(50, 4); ok {
		t.Error("an unknown type was accepted")
	}
	mark := []nft.DataType{nft.TypeMark}
	b, _ := encodeTuple(nft.IPv4, mark, []nft.Datum{nft.Int(0x4000)})
	if got, _ := decodeTupleOrder(nil, nft.IPv4, mark, b, false); got[0].Int != 0x4000 {
		t.Errorf("mark decoded as %v", got)
	}
	for _, k := range []nft.VerdictKind{nft.VerdictAccept, nft.VerdictDrop, nft.VerdictReturn, nft.VerdictJump, nft.VerdictGoto} {
		var e encoder
		e.verdict(nft.Verdict{Kind: k, Chain: "c"})
		var got nft.Verdict
		var d nlcodec.Decoder
		d.Attrs(e.Buf, func(t uint16, v []byte) { got = decodeVerdict(&d, v) })
		if d.Err() != nil {
			t.Error(d.Err())
		}
		if got.Kind != k {
			t.Errorf("verdict %s decoded as %s", k, got.Kind)
		}
	}
}
