package nfttest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// TestListingOfNft098: NftLanguage.Listing predicts what Debian 11's nft
// 0.9.8 lists for the every-phrase tables (testdata: its `nft list
// ruleset` of the tables nftnl wrote on Linux 6.18, 2026-11-28), and
// leaves a dump alone for an nft that lacks nothing.
func TestListingOfNft098(t *testing.T) {
	b, err := os.ReadFile("testdata/every-phrase.nft-0.9.8.txt")
	if err != nil {
		t.Fatal(err)
	}
	listing := string(b)
	i := strings.Index(listing, "table ip6 ")
	old := nfttest.NftLanguage{Version: "v0.9.8", Lacks: nfttest.NftFeatures}
	for f, table := range map[nft.Family]string{nft.IPv4: listing[:i], nft.IPv6: listing[i:]} {
		dump := nfttest.EveryPhraseRuleset(f).Dump()
		if got, want := nft.Canonical(table), old.Listing(dump); got != want {
			t.Errorf("%s: nft 0.9.8's listing differs from the prediction: %s", f, nfttest.FirstDiff(got, want))
		}
		if got := (nfttest.NftLanguage{Version: "v1.0.6"}).Listing(dump); got != dump {
			t.Errorf("%s: an nft that lacks nothing lists the dump otherwise: %s", f, nfttest.FirstDiff(got, dump))
		}
		if got := old.Missing(); !strings.HasPrefix(got, "nft v0.9.8 lacks a numgen expression") {
			t.Errorf("Missing() = %q", got)
		}
	}
}
