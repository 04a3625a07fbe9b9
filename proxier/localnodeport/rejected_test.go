package localnodeport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/ruleset"
)

// fakeCounters serves the counters of each family's elements of
// localhost-nodeport-rejected; a family missing has no table. The first
// interrupted reads of a family fail with nftnl.ErrInterrupted.
type fakeCounters struct {
	packets     map[nft.Family]map[uint8]uint64
	interrupted map[nft.Family]int
	fail        map[nft.Family]error
	names       [][]string
}

func (f *fakeCounters) ReadSetCounters(_ context.Context, fam nft.Family, names []string, fn nftnl.CountedElement) error {
	f.names = append(f.names, names)
	if err := f.fail[fam]; err != nil {
		return err
	}
	set := &nft.Set{Name: ruleset.LocalhostRejectedSet, Key: []nft.DataType{nft.TypeInetProto}, Counter: true}
	for proto, n := range f.packets[fam] {
		fn(set, nft.Element{Key: []nft.Datum{nft.Int(uint32(proto))}}, nftnl.Counter{Packets: n, Bytes: 60 * n})
	}
	if f.interrupted[fam] > 0 {
		f.interrupted[fam]--
		return fmt.Errorf("dump: %w", nftnl.ErrInterrupted)
	}
	return nil
}

// TestRejectedCollector: one series per family and protocol refused, the
// protocol upper case as upstream's; a family without the table has none,
// a read interrupted by a commit is read again (not counted twice), and a
// family that cannot be read is left out; every read asks for the one set
// and holds the proxy's commits.
func TestRejectedCollector(t *testing.T) {
	r := &fakeCounters{
		packets: map[nft.Family]map[uint8]uint64{
			nft.IPv4: {nft.ProtoTCP: 3, nft.ProtoUDP: 5, nft.ProtoSCTP: 0},
			nft.IPv6: {nft.ProtoUDP: 7},
		},
		interrupted: map[nft.Family]int{nft.IPv6: 2},
	}
	held := 0
	c := NewRejectedCollector(r, []nft.Family{nft.IPv4, nft.IPv6}, func() func() { held++; return func() { held-- } })
	want := `
# HELP kubeproxy_nftables_localhost_nodeport_rejected_packets_total [ALPHA] Number of packets rejected on localhost NodePorts. UDP and SCTP are always rejected; TCP is rejected when the localhost NodePort proxy is not running
# TYPE kubeproxy_nftables_localhost_nodeport_rejected_packets_total counter
kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family="IPv4",protocol="SCTP"} 0
kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family="IPv4",protocol="TCP"} 3
kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family="IPv4",protocol="UDP"} 5
kubeproxy_nftables_localhost_nodeport_rejected_packets_total{ip_family="IPv6",protocol="UDP"} 7
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if held != 0 {
		t.Errorf("%d holds not released", held)
	}
	for _, names := range r.names {
		if !slices.Equal(names, []string{ruleset.LocalhostRejectedSet}) {
			t.Errorf("read sets %v", names)
		}
	}

	r.fail = map[nft.Family]error{nft.IPv4: errors.New("netlink: no buffer space")}
	delete(r.packets, nft.IPv6) // no table
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d series with IPv4 unreadable and no IPv6 table, want none", n)
	}
}
