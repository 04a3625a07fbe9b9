package ruleset

import (
	"fmt"
	"testing"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier/model/fuzzstate"
)

// nsTable is the table of a network namespace's kernel, programmed over
// netlink and listed with nft.
type nsTable struct {
	*nftnl.Netlink
	ns *netns.NS
}

// AsListed is a dump as the nft on the PATH lists it.
func (k nsTable) AsListed(t *testing.T, dump string) string {
	t.Helper()
	return systemNft(t, k.ns).Listing(dump)
}

func (k nsTable) Listing(t *testing.T, f nft.Family) string {
	t.Helper()
	out, err := k.ns.Run("", "nft", "list", "table", f.String(), nft.TableName)
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	return out
}

// TestKernelIncremental runs FuzzBuild's incremental check on its seeds in
// a kernel: the Services added, then removed, one transaction each, as the
// proxier does. Each transaction must apply, in particular those where a
// pick map and its chain come or go beside the elements that use them, and
// leave the table the Fake has.
func TestKernelIncremental(t *testing.T) {
	ns := netns.New(t, "nftproxy-inc", "nft")
	nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	for i, seed := range fuzzstate.Seeds() {
		st := fuzzstate.Decode(seed)
		for _, fam := range families {
			t.Run(fmt.Sprintf("seed %d %s", i, fam), func(t *testing.T) {
				checkIncremental(t, st, fam, nsTable{nl, ns})
				// A state without Services of fam leaves no table.
				del := fmt.Sprintf("add table %[1]s %[2]s; delete table %[1]s %[2]s", fam, nft.TableName)
				if out, err := ns.Run("", "nft", del); err != nil {
					t.Fatalf("nft delete table: %v: %s", err, out)
				}
			})
		}
	}
}
