package ruleset

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/fuzzstate"
)

// TestKernelListsGoldens applies the golden rulesets to a real kernel, in a
// fresh network namespace, through the netlink backend, and checks that
// `nft list` decompiles every rule back to exactly what Dump says.
func TestKernelListsGoldens(t *testing.T) {
	netns.Require(t, "nft")
	for name, rs := range map[string]*nft.Ruleset{
		"basic":    Build(testConfig, nft.IPv4, testState()),
		"features": Build(featureConfig(), nft.IPv4, featureState()),
		"counters": Build(countersConfig(), nft.IPv4, testState()),
	} {
		t.Run(name, func(t *testing.T) {
			ns := netns.New(t, "nftproxy-rs", "nft")
			nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
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
			if got, want := nft.Canonical(out), nftListing(t, ns, rs); got != want {
				t.Errorf("kernel lists:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestKernelListsHostileNames programs, in a fresh network namespace,
// rulesets built from names no valid Service has (quotes, braces,
// semicolons, newlines, non-ASCII; names that bypassed the API server's
// validation through etcd, which the watch layer would skip), from names
// at the API's limits, and from every seed and corpus entry of FuzzBuild.
// `nft list` must print exactly what Dump says, and `nft -f` of that
// listing must load the same table again: nothing from a name can change
// what the listing says.
func TestKernelListsHostileNames(t *testing.T) {
	netns.Require(t, "nft")
	states := map[string]func(nft.Family) []model.ServicePortState{"hostile names": hostilePorts}
	for i, data := range append(fuzzstate.Seeds(), fuzzCorpus(t, "FuzzBuild")...) {
		st := fuzzstate.Decode(data)
		states[fmt.Sprintf("FuzzBuild input %d", i)] = func(f nft.Family) []model.ServicePortState { return fuzzPorts(st, f) }
	}
	ns := netns.New(t, "nftproxy-rs", "nft")
	nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	var unread string // why nft could not reload a listing
	for name, ports := range states {
		for _, f := range families {
			rs := Build(fuzzConfig(f), f, ports(f))
			if err := nl.Apply(context.Background(), nft.Diff(nil, rs)); err != nil {
				t.Fatalf("%s, %s: %v", name, f, err)
			}
			listing, err := ns.Run("", "nft", "list", "table", f.String(), nft.TableName)
			if err != nil {
				t.Fatalf("%s, %s: %v", name, f, err)
			}
			if got, want := nft.Canonical(listing), nftListing(t, ns, rs); got != want {
				t.Fatalf("%s, %s: kernel lists:\n%s\nwant:\n%s", name, f, got, want)
			}
			// One batch: the table goes, and comes back from its listing.
			reload := fmt.Sprintf("delete table %s %s\n%s", f, nft.TableName, listing)
			if why := systemNft(t, ns).CannotReadReason(reload); why != "" {
				unread = why
			} else if _, err := ns.Run(reload, "nft", "-f", "-"); err != nil {
				t.Fatalf("%s, %s: the listing does not load: %v", name, f, err)
			}
			if err := nl.Apply(context.Background(), &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if unread != "" {
		t.Skipf("every listing is as Dump says; not every one reloaded: %s", unread)
	}
}

// systemNft returns what the nft on the PATH reads of nftproxy's tables
// (nfttest.ProbeNft), probed in ns.
func systemNft(t *testing.T, ns *netns.NS) nfttest.NftLanguage {
	t.Helper()
	return nfttest.SystemNft(t, func(stdin string, args ...string) (string, error) {
		return ns.Run(stdin, append([]string{"nft"}, args...)...)
	})
}

// nftListing is rs's Dump as the nft on the PATH lists it, in Canonical
// form (nfttest.NftLanguage.Listing): nft 0.9.8 lists pick maps by key
// type and `dnat ip addr . port to`.
func nftListing(t *testing.T, ns *netns.NS, rs *nft.Ruleset) string {
	t.Helper()
	return systemNft(t, ns).Listing(rs.Dump())
}

// hostilePorts are service ports whose names try to end a comment or an
// identifier early and start nft syntax of their own, with endpoints and
// session affinity, so that every kind of name is derived from them.
func hostilePorts(f nft.Family) []model.ServicePortState {
	vip, eps := ip("10.96.9.1"), []netip.AddrPort{ap("10.244.9.1:8080"), ap("10.244.9.2:65535")}
	if f == nft.IPv6 {
		vip, eps = ip("fd00:96::9:1"), []netip.AddrPort{ap("[fd00:2440:1234:5678:9abc:def0:1234:1001]:65535"), ap("[fd00:244::9:2]:8080")}
	}
	l63 := strings.Repeat("n", 63)
	var out []model.ServicePortState
	for i, n := range []model.ServicePortName{
		spName(`x" } chain evil { drop`, `a;b#c`, `p\"`, nft.ProtoTCP),
		spName("a\nb", "c\x00d", "\r\n }", nft.ProtoUDP),
		spName("ñamespace", "服务", "\xff\xfe", nft.ProtoSCTP),
		spName(l63, l63, l63, nft.ProtoTCP),
		spName(strings.Repeat("z", 300), "s", "", nft.ProtoTCP),
	} {
		out = append(out, model.ServicePortState{Name: n, ClusterIP: vip, Port: uint16(80 + i), NodePort: uint16(30080 + i),
			Endpoints: eps, LocalEndpoints: eps[:1], AffinityTimeout: time.Duration(i) * time.Hour})
	}
	return out
}

// fuzzCorpus reads the inputs of a fuzz target's corpus in testdata (the
// files `go test -fuzz` writes: a header, then one []byte literal).
func fuzzCorpus(t *testing.T, target string) [][]byte {
	files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", target, "*"))
	var out [][]byte
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		lit, ok := strings.CutPrefix(lines[len(lines)-1], "[]byte(")
		data, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
		if len(lines) != 2 || !ok || err != nil {
			t.Fatalf("%s: not a corpus file of one []byte: %v", name, err)
		}
		out = append(out, []byte(data))
	}
	return out
}
