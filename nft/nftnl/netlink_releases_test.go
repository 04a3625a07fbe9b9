package nftnl

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// nftReleases are the Debian suites whose `nft` the release tests run,
// oldest first: bullseye's 0.9.8, bookworm's 1.0.6 (the one installed
// here), trixie's 1.1.3 and sid's newest.
var nftReleases = []string{"bullseye", "bookworm", "trixie", "sid"}

// releaseNft returns the command that runs suite's `nft` as
// e2e/tools/nft-release.sh unpacked it (its own loader and libraries,
// nothing installed), or skips the test if it was not fetched.
func releaseNft(t testing.TB, suite string) []string {
	t.Helper()
	cache := os.Getenv("NFTPROXY_E2E_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Skipf("nft of %s: no cache directory: %v", suite, err)
		}
		cache = filepath.Join(home, ".cache", "nftproxy-e2e")
	}
	root := filepath.Join(cache, "nodes", "nft", suite, "root")
	if _, err := os.Stat(filepath.Join(root, ".complete")); err != nil {
		t.Skipf("nft of Debian %s not fetched (e2e/tools/nft-release.sh %s)", suite, suite)
	}
	return []string{filepath.Join(root, "lib64", "ld-linux-x86-64.so.2"),
		"--library-path", filepath.Join(root, "lib", "x86_64-linux-gnu") + ":" + filepath.Join(root, "usr", "lib", "x86_64-linux-gnu"),
		filepath.Join(root, "usr", "sbin", "nft")}
}

// runNft runs nft (a releaseNft command) with args and stdin in ns.
func runNft(ns *testNS, nft []string, stdin string, args ...string) (string, error) {
	return ns.Run(stdin, append(append([]string(nil), nft...), args...)...)
}

// ownerFlagsRE matches a table's flags line naming owner: a listing
// reloaded with it makes the table the short-lived nft's, gone when it
// exits.
var ownerFlagsRE = regexp.MustCompile(`(?m)^\s*flags .*\bowner\b.*\n`)

// TestNftReleasesListOurTable writes the ip and ip6 tables of every phrase
// (pick maps, endpoints maps, verdict maps, every rule shape) and lists the
// namespace with the `nft` of each Debian release e2e/tools/nft-release.sh
// fetched, skipping the others by name. No release may fail or abort
// (bullseye's 0.9.8 aborted on the pick maps while their key type named
// integer: setKeyMagic). 0.9.8 lists a pick map by its key type (`type
// ipv4_addr . inet_service . mark : …`); the later ones from its typeof,
// as nftproxy's own dump writes it, print JSON (`nft -j`), and reload their
// listing (without the owner flag) into another namespace, which they then
// list the same.
func TestNftReleasesListOurTable(t *testing.T) {
	rulesets := map[nft.Family]*nft.Ruleset{}
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		rulesets[f] = nfttest.EveryPhraseRuleset(f)
	}
	for _, suite := range nftReleases {
		t.Run(suite, func(t *testing.T) {
			cmd := releaseNft(t, suite)
			ns := newTestNS(t)
			for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
				apply(t, ns.netlink(t), nft.Diff(nil, rulesets[f]))
			}
			version, err := runNft(ns, cmd, "", "--version")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s", suite, strings.TrimSpace(version))
			listing, err := runNft(ns, cmd, "", "list", "ruleset")
			if err != nil {
				t.Fatalf("%s nft list ruleset: %v", suite, err)
			}
			picks := 0
			for f, rs := range rulesets {
				for _, s := range rs.Sets {
					if s.PickProto == 0 {
						continue
					}
					picks++
					want := pickListing(f, s, suite == "bullseye")
					if !strings.Contains(listing, want) {
						t.Errorf("%s lists %s map %s without %q", suite, f, s.Name, want)
					}
				}
			}
			if picks == 0 {
				t.Fatal("no pick map in the ruleset")
			}
			if suite == "bullseye" {
				// 0.9.8 reloads none of our listing, pick maps or not:
				// it has no `counter` statement in a set's declaration,
				// and rejects the concatenated data of a map's elements
				// (datatype mismatch), as tried by hand.
				return
			}
			out, err := runNft(ns, cmd, "", "-j", "list", "ruleset")
			if err != nil {
				t.Errorf("%s nft -j list ruleset: %v", suite, err)
			} else if !json.Valid([]byte(out)) {
				t.Errorf("%s nft -j list ruleset: not JSON:\n%s", suite, out)
			}
			again := newTestNS(t)
			if _, err := runNft(again, cmd, ownerFlagsRE.ReplaceAllString(listing, ""), "-f", "-"); err != nil {
				t.Fatalf("%s nft -f of its listing: %v\n%s", suite, err, listing)
			}
			relisted, err := runNft(again, cmd, "", "list", "ruleset")
			if err != nil {
				t.Fatalf("%s nft list ruleset after reloading: %v", suite, err)
			}
			if relisted != ownerFlagsRE.ReplaceAllString(listing, "") {
				t.Errorf("%s lists its reloaded listing differently:\n%s\nfirst:\n%s", suite, relisted, listing)
			}
		})
	}
}

// pickListing is the line nft lists for a pick map's declaration: its
// typeof, as the dump writes it, or for nft 0.9.8 (old) the types of its
// key (setKeyMagic) and data.
func pickListing(f nft.Family, s *nft.Set, old bool) string {
	if old {
		addr := "ipv4_addr"
		if f == nft.IPv6 {
			addr = "ipv6_addr"
		}
		return fmt.Sprintf("type %s . inet_service . mark : %s . inet_service\n", addr, addr)
	}
	return fmt.Sprintf("typeof %s daddr . %s dport . numgen random mod %d : %s daddr . %s dport\n",
		f, nft.ProtoName(s.PickProto), s.PickMod, f, nft.ProtoName(s.PickProto))
}

// TestNetlinkPickMapKeyTypeRewritten: a pick map whose key type names
// integer for its numgen field, as nft writes it (here from nftproxy's own
// dump) and nftproxy did before setKeyMagic, loads as a map that is not
// the pick map wanted, so the next transaction writes it anew; then nft
// 0.9.8 (if fetched) lists the table, and a restart finds nothing to do.
func TestNetlinkPickMapKeyTypeRewritten(t *testing.T) {
	f := nft.IPv4
	ns := newTestNS(t)
	// The pick maps and their chain of every phrase: Load reads back a
	// table that nft wrote only if it has no endpoints map (nft opens
	// those with an interval end Load refuses).
	every := nfttest.EveryPhraseRuleset(f)
	rs := nft.NewRuleset(f)
	rs.AddChain(every.Chains["pick"])
	for _, s := range every.Sets {
		if s.PickProto != 0 {
			rs.AddSet(s)
		}
	}
	ns.mustNft(t, rs.Dump(), "-f", "-")
	loaded := load(t, ns, f)
	if loaded == nil {
		t.Fatal("Load found no table")
	}
	picks := 0
	for name, want := range rs.Sets {
		if want.PickProto == 0 {
			continue
		}
		picks++
		if have := loaded.Sets[name]; have == nil || nft.SameSetDefinition(have, want) || have.PickProto != 0 {
			t.Errorf("pick map %s written by nft (key type integer) loaded as %+v: want a set that is not the pick map", name, have)
		}
	}
	if picks == 0 {
		t.Fatal("no pick map in the ruleset")
	}
	apply(t, ns.netlink(t), nft.Diff(loaded, rs))
	got := load(t, ns, f)
	for name, want := range rs.Sets {
		if have := got.Sets[name]; want.PickProto != 0 && (have == nil || !nft.SameSetDefinition(have, want) || !sameElements(&have.Elements, &want.Elements)) {
			t.Errorf("pick map %s rewritten: loaded %+v, want %+v", name, have, want)
		}
	}
	if tx := nft.Diff(got, rs); !tx.Empty() {
		t.Errorf("restart after the rewrite: %s", nfttest.OpCounts(tx))
	}
	t.Run("bullseye", func(t *testing.T) {
		if _, err := runNft(ns, releaseNft(t, "bullseye"), "", "list", "ruleset"); err != nil {
			t.Errorf("bullseye nft list ruleset after the rewrite: %v", err)
		}
	})
}
