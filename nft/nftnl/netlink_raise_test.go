package nftnl

import (
	"context"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// loadRules reads the table back with its rules decoded, as explain does.
func loadRules(t testing.TB, ns *testNS, f nft.Family) *nft.Ruleset {
	t.Helper()
	n, err := NewNetlink(NetlinkOptions{NetNSFd: ns.Fd, ReadOnly: true, Rules: true})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rs, err := n.Load(ctx, f)
	if err != nil || rs == nil {
		t.Fatalf("Load: %v (table found: %v)", err, rs != nil)
	}
	return rs
}

// TestNetlinkLoadRules: the kernel's rules, read back and decoded, are the
// rules written (phrases and comments) for every phrase in both families;
// rules nft adds with expressions nftproxy never writes decode to their
// phrases around an Opaque part.
func TestNetlinkLoadRules(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newTestNS(t)
			rs := nfttest.EveryPhraseRuleset(f)
			apply(t, ns.netlink(t), nft.Diff(nil, rs))
			got := loadRules(t, ns, f)
			for name, want := range rs.Chains {
				have := got.Chains[name]
				if have == nil || len(have.Rules) != len(want.Rules) {
					t.Errorf("chain %s: loaded %+v, want %d rules", name, have, len(want.Rules))
					continue
				}
				for i := range want.Rules {
					if g, w := have.Rules[i].Text(f), want.Rules[i].Text(f); g != w {
						t.Errorf("chain %s rule %d:\n got %s\nwant %s", name, i, g, w)
					}
				}
			}

			addr := nfttest.Addr(f, "10.1.2.3", "fd00::3")
			ns.mustNft(t, "", "add", "chain", f.String(), nft.TableName, "tampered")
			ns.mustNft(t, "", "add", "rule", f.String(), nft.TableName, "tampered", "counter", "drop")
			ns.mustNft(t, "", "add", "rule", f.String(), nft.TableName, "tampered",
				f.String(), "daddr", addr.String(), "tcp", "dport", "80", "drop", "comment", `"by hand"`)
			tampered := loadRules(t, ns, f).Chains["tampered"]
			want := []string{
				"[counter] drop",
				f.String() + " daddr " + addr.String() + ` meta l4proto tcp [payload cmp] drop comment "by hand"`,
			}
			if tampered == nil || len(tampered.Rules) != len(want) {
				t.Fatalf("chain tampered: loaded %+v", tampered)
			}
			for i, w := range want {
				if g := tampered.Rules[i].Text(f); g != w {
					t.Errorf("tampered rule %d:\n got %s\nwant %s", i, g, w)
				}
			}
		})
	}
}
