package conntrack

import (
	"net/netip"
	"testing"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
)

// BenchmarkParseFlow decodes a dump's worth of flows (10,000, as CT_NEW
// messages), as dumpOne does.
func BenchmarkParseFlow(b *testing.B) {
	var e encoder
	for i := range 10000 {
		fl := natFlow(ProtoUDP, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 40000),
			netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.244.1.5:5353"))
		fl.ID = uint32(i)
		e.appendCreate(uint32(i), fl, 1)
	}
	var payloads [][]byte
	_ = nlcodec.Messages(e.Buf, func(_ nlcodec.Header, p []byte) error {
		payloads = append(payloads, p)
		return nil
	})
	b.ReportAllocs()
	for b.Loop() {
		for _, p := range payloads {
			if _, err := parseFlow(p); err != nil {
				b.Fatal(err)
			}
		}
	}
}
