package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
)

// testNS is a fresh network namespace for one kernel test (netns.New,
// nftproxy-t-<random>, needing root, `ip` and `nft`). The root namespace
// is never touched: every Netlink of a test is opened on ns.Fd.
type testNS struct{ *netns.NS }

func newTestNS(t testing.TB) *testNS {
	t.Helper()
	return &testNS{netns.New(t, "nftproxy-t", "nft")}
}

// nft runs nft in the namespace with optional stdin.
func (ns *testNS) nft(stdin string, args ...string) (string, error) {
	return ns.Run(stdin, append([]string{"nft"}, args...)...)
}

func (ns *testNS) mustNft(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := ns.nft(stdin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// list returns `nft list table <family> nftproxy`.
func (ns *testNS) list(t testing.TB, f nft.Family) string {
	t.Helper()
	return ns.mustNft(t, "", "list", "table", f.String(), nft.TableName)
}

// netlink opens a Netlink on the namespace, closed when the test ends.
func (ns *testNS) netlink(t testing.TB) *Netlink {
	t.Helper()
	n, err := NewNetlink(NetlinkOptions{NetNSFd: ns.Fd})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func apply(t testing.TB, n *Netlink, tx *nft.Transaction) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := n.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
}

// kernelFeatures probes the kernel of the namespace (ProbeKernel).
func (ns *testNS) kernelFeatures(t testing.TB) KernelFeatures {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	k, err := ns.netlink(t).ProbeKernel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// skipUnless skips the test, naming the feature, unless the kernel has
// it: e.g. "kernel 6.1.0-56-amd64 lacks NFT_TABLE_F_PERSIST (6.9)".
func skipUnless(t testing.TB, have bool, feature string) {
	t.Helper()
	if !have {
		t.Skipf("kernel %s lacks %s", kernelRelease(), feature)
	}
}

// requireOwnedTables skips a test of owned tables unless the kernel of ns
// lets nftproxy own its table (NFT_TABLE_F_OWNER and
// NFT_TABLE_F_PERSIST).
func (ns *testNS) requireOwnedTables(t testing.TB) {
	t.Helper()
	k := ns.kernelFeatures(t)
	skipUnless(t, k.TableOwner, FeatureTableOwner)
	skipUnless(t, k.TablePersist, FeatureTablePersist)
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "(unknown)"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// nftLanguage returns what the nft on the PATH reads of nftproxy's tables.
func (ns *testNS) nftLanguage(t testing.TB) nfttest.NftLanguage {
	t.Helper()
	return nfttest.SystemNft(t, ns.nft)
}

// listed returns the nft listing of the family's table in Canonical form.
func (ns *testNS) listed(t testing.TB, f nft.Family) string {
	t.Helper()
	return nft.Canonical(ns.list(t, f))
}

// dumped returns rs's Dump as the nft on the PATH lists it
// (nfttest.NftLanguage.Listing): what listed returns when the kernel
// holds rs.
func (ns *testNS) dumped(t testing.TB, rs *nft.Ruleset) string {
	t.Helper()
	return ns.nftLanguage(t).Listing(rs.Dump())
}

// requireNftReads skips the test unless the nft on the PATH reads text,
// naming what it lacks.
func (ns *testNS) requireNftReads(t testing.TB, text string) {
	t.Helper()
	if why := ns.nftLanguage(t).CannotReadReason(text); why != "" {
		t.Skip(why)
	}
}

// nftReads runs check in a subtest, "nft reads it", skipped (naming what
// it lacks) unless the nft on the PATH reads text: the rest of the test
// runs either way.
func (ns *testNS) nftReads(t *testing.T, text string, check func(t *testing.T)) {
	t.Helper()
	t.Run("nft reads it", func(t *testing.T) {
		ns.requireNftReads(t, text)
		check(t)
	})
}
