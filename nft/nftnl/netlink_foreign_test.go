package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"

	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// foreignRuleset is what another proxy and iptables-nft leave behind: a
// kube-proxy table per family (a base chain, a rule, a set), iptables-nft's
// "ip nat" and "ip6 filter" tables with KUBE-* chains, and nftproxy's own
// table in ip.
const foreignRuleset = `
table ip kube-proxy {
	set cluster-ips { type ipv4_addr; elements = { 10.96.0.10 }; }
	chain services { ip daddr @cluster-ips counter; }
	chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }
}
table ip6 kube-proxy {
	chain services { }
}
table ip nat {
	chain PREROUTING { type nat hook prerouting priority dstnat; policy accept; counter jump KUBE-SERVICES; }
	chain KUBE-SERVICES { }
	chain KUBE-SVC-ABC { }
}
table ip6 filter {
	chain KUBE-FORWARD { }
}
table ip nftproxy {
	chain services { }
}
`

func withTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestNetlinkListForeign: ListTables and ListChains name every table and
// chain of the family asked for, ours and others', and none of the other
// family.
func TestNetlinkListForeign(t *testing.T) {
	ns := newTestNS(t)
	ns.mustNft(t, foreignRuleset, "-f", "-")
	n := ns.netlink(t)
	ctx := withTimeout(t)

	tests := []struct {
		f      nft.Family
		tables []string
		chains []ChainRef
	}{
		{nft.IPv4, []string{"kube-proxy", "nat", "nftproxy"}, []ChainRef{
			{"kube-proxy", "nat-prerouting"}, {"kube-proxy", "services"},
			{"nat", "KUBE-SERVICES"}, {"nat", "KUBE-SVC-ABC"}, {"nat", "PREROUTING"},
			{"nftproxy", "services"}}},
		{nft.IPv6, []string{"filter", "kube-proxy"}, []ChainRef{{"filter", "KUBE-FORWARD"}, {"kube-proxy", "services"}}},
	}
	for _, tt := range tests {
		t.Run(tt.f.String(), func(t *testing.T) {
			tables, err := n.ListTables(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(tables)
			if !slices.Equal(tables, tt.tables) {
				t.Errorf("ListTables = %q, want %q", tables, tt.tables)
			}
			chains, err := n.ListChains(ctx, tt.f)
			if err != nil {
				t.Fatal(err)
			}
			slices.SortFunc(chains, func(a, b ChainRef) int {
				return strings.Compare(a.Table+" "+a.Chain, b.Table+" "+b.Chain)
			})
			if !slices.Equal(chains, tt.chains) {
				t.Errorf("ListChains = %q, want %q", chains, tt.chains)
			}
		})
	}
}

// TestNetlinkDeleteTables: DeleteTables removes exactly the tables named,
// whatever they hold, dormant or not, tolerates one that does not exist
// (and does not leave it created), and leaves every other table as it was,
// handles included.
func TestNetlinkDeleteTables(t *testing.T) {
	ns := newTestNS(t)
	ns.mustNft(t, foreignRuleset, "-f", "-")
	ns.mustNft(t, "", "add", "table", "ip", "dormant-leftover", "{ flags dormant; }")
	n := ns.netlink(t)
	ctx := withTimeout(t)
	others := func() string {
		var b strings.Builder
		for _, tbl := range [][2]string{{"ip", "nat"}, {"ip6", "filter"}, {"ip6", "kube-proxy"}, {"ip", "nftproxy"}} {
			b.WriteString(ns.mustNft(t, "", "--handle", "list", "table", tbl[0], tbl[1]))
		}
		return b.String()
	}
	before := others()

	if err := n.DeleteTables(ctx, nft.IPv4, []string{"kube-proxy", "never-was", "dormant-leftover"}); err != nil {
		t.Fatal(err)
	}
	tables, err := n.ListTables(ctx, nft.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(tables)
	if want := []string{"nat", "nftproxy"}; !slices.Equal(tables, want) {
		t.Errorf("after deleting kube-proxy, never-was and dormant-leftover: tables %q, want %q", tables, want)
	}
	if after := others(); after != before {
		t.Errorf("other tables changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	// An empty list sends nothing; our own table is never deleted here.
	if err := n.DeleteTables(ctx, nft.IPv4, nil); err != nil {
		t.Errorf("no names: %v", err)
	}
	if err := n.DeleteTables(ctx, nft.IPv4, []string{"nat", nft.TableName}); err == nil {
		t.Errorf("deleting %q: no error", nft.TableName)
	}
	if after := others(); after != before {
		t.Errorf("a refused deletion changed tables:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestNetlinkDeleteTablesError: a kernel error names the table, and the
// batch is all-or-nothing: a table owned by another socket cannot be
// deleted, and the table before it in the same batch stays.
func TestNetlinkDeleteTablesError(t *testing.T) {
	ns := newTestNS(t)
	skipUnless(t, ns.kernelFeatures(t).TableOwner, FeatureTableOwner)
	ns.mustNft(t, foreignRuleset, "-f", "-")
	owner := ns.netlink(t)
	// A table owned by owner's socket (NFT_TABLE_F_OWNER, Linux ≥ 5.12).
	b := &batch{enc: encoder{}, family: nft.IPv4, firstSeq: owner.seq.Next(0), setIDs: map[string]uint32{}}
	b.op = -1
	b.control(unix.NFNL_MSG_BATCH_BEGIN, 0, 0)
	b.op = 0
	m := b.begin(unix.NFT_MSG_NEWTABLE, flagCreate)
	b.enc.Str(unix.NFTA_TABLE_NAME, "owned")
	b.enc.BE32(unix.NFTA_TABLE_FLAGS, 2) // NFT_TABLE_F_OWNER
	b.end(m)
	b.op = -1
	b.control(unix.NFNL_MSG_BATCH_END, flagAck, 0)
	owner.seq.Next(len(b.owners))
	if _, err := owner.send(b.enc.Buf); err != nil {
		t.Fatal(err)
	}
	if res, err := owner.readReplies(b); err != nil || len(res.errs) > 0 {
		t.Fatalf("create owned table: %v %v", err, res.errs)
	}

	err := ns.netlink(t).DeleteTables(withTimeout(t), nft.IPv4, []string{"kube-proxy", "owned"})
	if !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "table owned") {
		t.Errorf("deleting another socket's table: %v, want EPERM naming table owned", err)
	}
	out := ns.mustNft(t, "", "list", "tables", "ip")
	if !strings.Contains(out, "table ip kube-proxy") {
		t.Errorf("a failed batch deleted kube-proxy:\n%s", out)
	}
}
