package ruleset

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// TestKernelListsGoldens applies the golden rulesets to a real kernel, in a
// fresh network namespace, through the netlink backend, and checks that
// `nft list` decompiles every rule back to exactly what Dump says.
func TestKernelListsGoldens(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kernel test: needs root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("kernel test: needs nft")
	}
	for name, rs := range map[string]*nft.Ruleset{
		"basic":    Build(testConfig, nft.IPv4, testState()),
		"features": Build(featureConfig(), nft.IPv4, featureState()),
	} {
		t.Run(name, func(t *testing.T) {
			ns := fmt.Sprintf("nftproxy-rs-%08x", rand.Uint32())
			if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
				t.Fatalf("ip netns add: %v: %s", err, out)
			}
			t.Cleanup(func() { exec.Command("ip", "netns", "delete", ns).Run() })
			f, err := os.Open("/run/netns/" + ns)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			nl, err := nft.NewNetlink(nft.NetlinkOptions{NetNSFd: int(f.Fd())})
			if err != nil {
				t.Fatal(err)
			}
			defer nl.Close()
			if err := nl.Apply(context.Background(), nft.Diff(nil, rs)); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "table", "ip", nft.TableName).CombinedOutput()
			if err != nil {
				t.Fatalf("nft list: %v: %s", err, out)
			}
			if got := nft.Canonical(string(out)); got != rs.Dump() {
				t.Errorf("kernel lists:\n%s\nwant:\n%s", got, rs.Dump())
			}
		})
	}
}
