package nodes

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/nft/nfttest"
)

// requireUserlands skips a test that runs the releases' tools on this
// machine unless NFTPROXY_E2E=1 (make e2e) or NFTPROXY_NODES=1: it
// fetches each release's userland first (about 15 s and 100 MB of package
// lists each, the first time).
func requireUserlands(t *testing.T) {
	t.Helper()
	if os.Getenv("NFTPROXY_E2E") != "1" && os.Getenv("NFTPROXY_NODES") != "1" {
		t.Skip("fetches the userland of Debian's releases: set NFTPROXY_E2E=1 (make e2e) or NFTPROXY_NODES=1")
	}
	netns.Require(t)
}

// releaseNft is a release's nft, run on this machine.
type releaseNft struct {
	u *Userland
}

func prepareNft(t *testing.T, r Release) releaseNft {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	u, err := PrepareUserland(ctx, r, kubebin.CacheDir())
	if err != nil {
		t.Fatalf("prepare %s's userland: %v", r.Suite, err)
	}
	t.Logf("%s: nft %s, prepared in %s", r, u.Tool("nft"), preparation(u.Prepared))
	return releaseNft{u}
}

// run runs the release's nft with args and stdin in ns.
func (n releaseNft) run(ns *netns.NS, stdin string, args ...string) (string, error) {
	cmd, err := n.u.Command("nft", args...)
	if err != nil {
		return "", err
	}
	return ns.Run(stdin, cmd.Args...)
}

// language probes what the release's nft reads of nftproxy's tables
// (nfttest.ProbeNft), in ns.
func (n releaseNft) language(t *testing.T, ns *netns.NS) nfttest.NftLanguage {
	t.Helper()
	l, err := nfttest.ProbeNft(func(stdin string, args ...string) (string, error) { return n.run(ns, stdin, args...) })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ownerFlagsRE matches a table's flags line naming owner: a listing
// reloaded with it makes the table the short-lived nft's, gone when it
// exits.
var ownerFlagsRE = regexp.MustCompile(`(?m)^\s*flags .*\bowner\b.*\n`)

// TestNftReleasesListOurTable writes the ip and ip6 tables of every phrase
// (pick maps, endpoints maps, verdict maps, every rule shape) with
// nftproxy's Netlink on this machine's kernel and lists the namespace with
// the nft of each Debian release (NFTPROXY_NODES_SUITES), run here with
// its own libraries (PrepareUserland). No release may fail or abort
// (bullseye's 0.9.8 aborted on the pick maps while their key type named
// integer, nftnl's setKeyMagic), nor fail to load another table beside
// them. An nft that reads a numgen expression in a typeof lists a pick map
// by it, as nftproxy's own dump writes it; one that does not (0.9.8) by
// its key type (`type ipv4_addr . inet_service . mark : …`). Each nft then
// prints the tables as JSON (`nft -j`) and reloads its listing (without
// the owner flag) into another namespace, which it lists the same, unless
// it lacks something of the language the listing uses
// (nfttest.NftLanguage): the test says what and skips that part.
func TestNftReleasesListOurTable(t *testing.T) {
	requireUserlands(t)
	rulesets := map[nft.Family]*nft.Ruleset{}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		rulesets[f] = nfttest.EveryPhraseRuleset(f)
	}
	for _, r := range hostReleases(t) {
		t.Run(r.Suite, func(t *testing.T) {
			n := prepareNft(t, r)
			ns := netns.New(t, "nftproxy-rel")
			nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
			if err != nil {
				t.Fatal(err)
			}
			defer nl.Close()
			for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
				if err := nl.Apply(t.Context(), nft.Diff(nil, rulesets[f])); err != nil {
					t.Fatal(err)
				}
			}
			version, err := n.run(ns, "", "--version")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s", r.Suite, strings.TrimSpace(version))
			listing, err := n.run(ns, "", "list", "ruleset")
			if err != nil {
				t.Fatalf("%s nft list ruleset: %v", r.Suite, err)
			}
			lang := n.language(t, netns.New(t, "nftproxy-rel"))
			byType := !lang.Has(nfttest.NftNumgenInConcatTypeof)
			picks := 0
			for f, rs := range rulesets {
				for _, s := range rs.Sets {
					if s.PickProto == 0 {
						continue
					}
					picks++
					if want := pickListing(f, s, byType); !strings.Contains(listing, want) {
						t.Errorf("%s lists %s map %s without %q", r.Suite, f, s.Name, want)
					}
				}
			}
			if picks == 0 {
				t.Fatal("no pick map in the ruleset")
			}
			// nft before 1.0.1 reads the whole ruleset for any `nft -f`
			// (kube-proxy requires 5.13 to keep such an nft off its
			// nodes, kubernetes#124152): another program's ruleset must
			// load beside ours.
			other := "table inet nodes-other {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t}\n}\n"
			if _, err := n.run(ns, other, "-f", "-"); err != nil {
				t.Errorf("%s nft -f of another table beside ours: %v", r.Suite, err)
			} else if _, err := n.run(ns, "", "delete", "table", "inet", "nodes-other"); err != nil {
				t.Errorf("%s nft delete table beside ours: %v", r.Suite, err)
			}
			out, err := n.run(ns, "", "-j", "list", "ruleset")
			if err != nil {
				t.Errorf("%s nft -j list ruleset: %v", r.Suite, err)
			} else if !json.Valid([]byte(out)) {
				t.Errorf("%s nft -j list ruleset: not JSON:\n%s", r.Suite, out)
			}
			if why := lang.CannotReadReason(listing); why != "" {
				t.Skipf("it lists the tables and prints them as JSON; a listing is not reloaded: %s", why)
			}
			again := netns.New(t, "nftproxy-rel")
			reload := ownerFlagsRE.ReplaceAllString(listing, "")
			if _, err := n.run(again, reload, "-f", "-"); err != nil {
				t.Fatalf("%s nft -f of its listing: %v\n%s", r.Suite, err, listing)
			}
			relisted, err := n.run(again, "", "list", "ruleset")
			if err != nil {
				t.Fatalf("%s nft list ruleset after reloading: %v", r.Suite, err)
			}
			if relisted != reload {
				t.Errorf("%s lists its reloaded listing differently:\n%s\nfirst:\n%s", r.Suite, relisted, listing)
			}
		})
	}
}

// pickListing is the line nft lists for a pick map's declaration: its
// typeof, as the dump writes it, or for an nft that reads no numgen in a
// typeof (byType) the types of its key (setKeyMagic) and data.
func pickListing(f nft.Family, s *nft.Set, byType bool) string {
	if byType {
		addr := "ipv4_addr"
		if f == nft.IPv6 {
			addr = "ipv6_addr"
		}
		return fmt.Sprintf("type %s . inet_service . mark : %s . inet_service\n", addr, addr)
	}
	return fmt.Sprintf("typeof %s daddr . %s dport . numgen random mod %d : %s daddr . %s dport\n",
		f, nft.ProtoName(s.PickProto), s.PickMod, f, nft.ProtoName(s.PickProto))
}

// TestNftReleasesListRewrittenPickMaps: pick maps that nft wrote (their
// key type naming integer for the numgen field, as nftproxy wrote them
// before setKeyMagic) are rewritten by nftproxy's next transaction, after
// which every release's nft lists the namespace (0.9.8 aborted on the
// maps nft wrote).
func TestNftReleasesListRewrittenPickMaps(t *testing.T) {
	requireUserlands(t)
	f := nft.IPv4
	rs := nfttest.PickMapsRuleset(f)
	ns := netns.New(t, "nftproxy-rel", "nft")
	if _, err := ns.Run(rs.Dump(), "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	nl, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: ns.Fd})
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	loaded, err := nl.Load(t.Context(), f)
	if err != nil {
		t.Fatal(err)
	}
	tx := nft.Diff(loaded, rs)
	if tx.Empty() {
		t.Fatal("the pick maps nft wrote load as nftproxy's own: nothing to rewrite")
	}
	if err := nl.Apply(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	for _, r := range hostReleases(t) {
		t.Run(r.Suite, func(t *testing.T) {
			n := prepareNft(t, r)
			if _, err := n.run(ns, "", "list", "ruleset"); err != nil {
				t.Errorf("%s nft list ruleset after the rewrite: %v", r.Suite, err)
			}
		})
	}
}
