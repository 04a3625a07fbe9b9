package ruleset

import (
	"context"
	"testing"

	"github.com/nftproxy/nftproxy/e2e/testbed/netnstest"
	"github.com/nftproxy/nftproxy/nft"
)

// TestKernelListsGoldens applies the golden rulesets to a real kernel, in a
// fresh network namespace, through the netlink backend, and checks that
// `nft list` decompiles every rule back to exactly what Dump says.
func TestKernelListsGoldens(t *testing.T) {
	netnstest.Require(t, "nft")
	for name, rs := range map[string]*nft.Ruleset{
		"basic":    Build(testConfig, nft.IPv4, testState()),
		"features": Build(featureConfig(), nft.IPv4, featureState()),
	} {
		t.Run(name, func(t *testing.T) {
			ns := netnstest.New(t, "nftproxy-rs", "nft")
			nl, err := nft.NewNetlink(nft.NetlinkOptions{NetNSFd: ns.Fd})
			if err != nil {
				t.Fatal(err)
			}
			defer nl.Close()
			if err := nl.Apply(context.Background(), nft.Diff(nil, rs)); err != nil {
				t.Fatal(err)
			}
			out, err := ns.Run("", "nft", "list", "table", "ip", nft.TableName)
			if err != nil {
				t.Fatal(err)
			}
			if got := nft.Canonical(out); got != rs.Dump() {
				t.Errorf("kernel lists:\n%s\nwant:\n%s", got, rs.Dump())
			}
		})
	}
}
