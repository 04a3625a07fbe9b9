package nftnl

import (
	"context"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// TestKernelFeatures: ProbeKernel answers the same twice, on a read-only
// socket too, and changes nothing: no table left, the generation where it
// was. What it finds is logged (make nodes runs it on each release's
// kernel) and checked against what the kernel then does: a table created
// with the flags it says the kernel accepts, an ACK of BATCH_END exactly
// when it says the kernel sends one.
func TestKernelFeatures(t *testing.T) {
	ns := newTestNS(t)
	ctx := context.Background()
	n := ns.netlink(t)
	before, err := n.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k, err := n.ProbeKernel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s: owner %v, persist %v, BATCH_END ACK %v", kernelRelease(), k.TableOwner, k.TablePersist, k.BatchEndACK)
	ro, err := NewNetlink(NetlinkOptions{NetNSFd: ns.Fd, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if again, err := ro.ProbeKernel(ctx); err != nil || again != k {
		t.Errorf("second probe, read-only: %s (%v), first %s", again, err, k)
	}
	if after, err := n.Generation(ctx); err != nil || after != before {
		t.Errorf("the probes moved the generation from %d to %d (%v)", before, after, err)
	}
	if out := ns.mustNft(t, "", "list", "tables"); out != "" {
		t.Errorf("the probes left tables:\n%s", out)
	}
	if k.TablePersist && !k.TableOwner {
		t.Errorf("NFT_TABLE_F_PERSIST without NFT_TABLE_F_OWNER")
	}

	// What the kernel does agrees.
	rs := nfttest.RealisticRuleset(nft.IPv4, nfttest.MakeServices(nft.IPv4, 3, 1))
	apply(t, n, nft.FullRewrite(rs))
	if got := n.LastBatch().Confirmed; got != k.BatchEndACK {
		t.Errorf("BATCH_END ACKed: %v; probed: %v", got, k.BatchEndACK)
	}
	owned := ns.ownedNetlink(t)
	apply(t, owned, nft.FullRewrite(rs))
	owning, why := owned.Owning()
	if want := k.TableOwner && k.TablePersist; owning != want {
		t.Errorf("a Netlink asked to own its table owns it: %v (%v); probed: %s", owning, why, k)
	}
}

// TestNetlinkOwnTableWhereTheKernelCan: asked to own its table, a Netlink
// owns it where the kernel has NFT_TABLE_F_OWNER and NFT_TABLE_F_PERSIST,
// and elsewhere writes it without flags, saying why (Owning): the kernel's
// refusal of the flags (EINVAL on Linux 5.10, EOPNOTSUPP on 6.1) is no
// failed sync. Then it changes the table as any other, and so does a
// rewrite, and a Netlink that does not own tables reads it back.
func TestNetlinkOwnTableWhereTheKernelCan(t *testing.T) {
	ns := newTestNS(t)
	k := ns.kernelFeatures(t)
	f := nft.IPv4
	svcs := nfttest.MakeServices(f, 10, 2)
	desired := nfttest.RealisticRuleset(f, svcs)
	n := ns.ownedNetlink(t)
	apply(t, n, nft.FullRewrite(desired))
	owning, why := n.Owning()
	t.Logf("kernel %s (%s): owning %v (%v)", kernelRelease(), k, owning, why)
	found, flags, err := ns.netlink(t).tableFlags(f)
	if err != nil || !found {
		t.Fatalf("table dump: found %v, %v", found, err)
	}
	if k.TableOwner && k.TablePersist {
		if !owning || why != nil {
			t.Fatalf("not owning the table: %v", why)
		}
		if flags != ownedFlags {
			t.Fatalf("owned table has flags %#x, want %#x", flags, ownedFlags)
		}
	} else {
		if owning || why == nil {
			t.Fatalf("Owning: %v, %v; want false and why", owning, why)
		}
		if flags != 0 {
			t.Fatalf("the table has flags %#x", flags)
		}
	}
	next := nfttest.RealisticRuleset(f, append(svcs, nfttest.MakeService(f, 99, 2)))
	apply(t, n, nft.Diff(loadOn(t, n, f), next))
	apply(t, n, nft.FullRewrite(next))
	plain := ns.netlink(t)
	if owning {
		n.Close() // an ownerless persistent table is rewritten, not read back
		apply(t, plain, nft.FullRewrite(next))
	}
	if tx := nft.Diff(loadOn(t, plain, f), next); !tx.Empty() {
		t.Errorf("the table read back differs from the one applied: %s", nfttest.OpCounts(tx))
	}
}
