package nftnl

import (
	"context"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
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

// TestMissingExpressions: the kernel here has every expression type
// nftproxy writes, in both families; the probe commits nothing (the
// generation stays) and leaves no table. make nodes runs it on each
// release's kernel.
func TestMissingExpressions(t *testing.T) {
	ns := newTestNS(t)
	ctx := context.Background()
	n := ns.netlink(t)
	before, err := n.Generation(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		missing, err := n.MissingExpressions(ctx, f)
		if err != nil || len(missing) > 0 {
			t.Errorf("%s: missing %q, %v", f, missing, err)
		}
	}
	if after, err := n.Generation(ctx); err != nil || after != before {
		t.Errorf("the probes moved the generation from %d to %d (%v)", before, after, err)
	}
	if out := ns.mustNft(t, "", "list", "tables"); out != "" {
		t.Errorf("the probes left tables:\n%s", out)
	}
}

func TestMissingExpressionsFromErrors(t *testing.T) {
	n := len(RuleExpressions)
	fib := slices.IndexFunc(RuleExpressions, func(x RuleExpression) bool { return x.Name == "fib" })
	tests := []struct {
		name    string
		errno   map[int]unix.Errno
		missing []string
		bad     bool
	}{
		{"every type known", map[int]unix.Errno{3: unix.EINVAL, 4: unix.EINVAL, 3 + n: unix.ENOENT}, nil, false},
		{"no fib", map[int]unix.Errno{3 + fib: unix.ENOENT, 3 + n: unix.ENOENT}, []string{"the fib expression (Linux 4.10)"}, false},
		{"the probe's failure did not happen", map[int]unix.Errno{}, nil, true},
		{"another refusal", map[int]unix.Errno{3: unix.ENOMEM, 3 + n: unix.ENOENT}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			missing, err := missingExpressions(tt.errno, 3, n)
			if (err != nil) != tt.bad || !slices.Equal(missing, tt.missing) {
				t.Errorf("missingExpressions = %q, %v; want %q, error %v", missing, err, tt.missing, tt.bad)
			}
		})
	}
}

// TestRuleExpressionsCoverTheEncoder: every expression the batches of the
// every-phrase tables name (rules and set declarations) is one
// MissingExpressions probes.
func TestRuleExpressionsCoverTheEncoder(t *testing.T) {
	probed := map[string]bool{}
	for _, x := range RuleExpressions {
		probed[x.Name] = true
	}
	written := map[string]bool{}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		b, err := encodeTransaction(nft.Diff(nil, nfttest.EveryPhraseRuleset(f)), batchOptions{firstSeq: 1})
		if err != nil {
			t.Fatal(err)
		}
		err = nlcodec.Messages(b.enc.Buf, func(h nlcodec.Header, payload []byte) error {
			if len(payload) < 4 {
				return nil
			}
			var list uint16
			switch h.Type & 0xff {
			case unix.NFT_MSG_NEWRULE:
				list = unix.NFTA_RULE_EXPRESSIONS
			case unix.NFT_MSG_NEWSET:
				list = nftaSetExpr
			default:
				return nil
			}
			return nlcodec.Attrs(payload[4:], func(typ uint16, data []byte) {
				if typ&^unix.NLA_F_NESTED != list {
					return
				}
				exprNames(data, list == nftaSetExpr, written)
			})
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for name := range written {
		if !probed[name] {
			t.Errorf("the encoder writes the %s expression, which MissingExpressions does not probe", name)
		}
	}
	if len(written) < 10 {
		t.Errorf("found only %v in the batches: the test reads them wrong", written)
	}
}

// exprNames adds the NFTA_EXPR_NAMEs of an expression list (or, single, of
// one expression's attributes) to names.
func exprNames(b []byte, single bool, names map[string]bool) {
	name := func(attrs []byte) {
		nlcodec.Attrs(attrs, func(typ uint16, data []byte) {
			if typ == unix.NFTA_EXPR_NAME {
				names[nlcodec.String(data)] = true
			}
		})
	}
	if single {
		name(b)
		return
	}
	nlcodec.Attrs(b, func(typ uint16, data []byte) {
		if typ&^unix.NLA_F_NESTED == unix.NFTA_LIST_ELEM {
			name(data)
		}
	})
}
