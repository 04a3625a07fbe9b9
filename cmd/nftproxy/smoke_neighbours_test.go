package main

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
)

// neighbourTable is the table of another program beside the proxy's,
// written with nft.
const neighbourTable = "inet smoke-neighbour"

// neighbourFeatures are what the neighbour's table holds, one piece each,
// loaded in order: what a firewall written for a recent nft uses. A piece
// the node's nft cannot load is left out (and logged with its name).
var neighbourFeatures = []struct{ name, nft string }{
	{"a table with filter, mangle and nat base chains", `
add table inet smoke-neighbour
add chain inet smoke-neighbour input { type filter hook input priority filter + 10; policy accept; }
add chain inet smoke-neighbour forward { type filter hook forward priority filter + 10; policy accept; }
add chain inet smoke-neighbour mangle { type filter hook prerouting priority mangle; policy accept; }
add chain inet smoke-neighbour postrouting { type nat hook postrouting priority srcnat + 10; policy accept; }
add rule inet smoke-neighbour postrouting ip saddr 192.0.2.0/24 masquerade`},
	{"a named counter and a named quota", `
add counter inet smoke-neighbour seen
add quota inet smoke-neighbour budget { over 100 mbytes; }
add rule inet smoke-neighbour input counter name "seen"
add rule inet smoke-neighbour input quota name "budget" drop`},
	{"an interval set of concatenations (ip saddr . tcp dport) with element comments", `
add set inet smoke-neighbour allowed { type ipv4_addr . inet_service; flags interval; elements = { 10.244.0.0/16 . 8000-8999 comment "pods", 10.10.0.0/24 . 30000-32767 comment "nodes" }; }
add rule inet smoke-neighbour forward ip saddr . tcp dport @allowed counter`},
	{"fib daddr type local", `
add rule inet smoke-neighbour input fib daddr type local counter`},
	{"ct mark set and matched", `
add rule inet smoke-neighbour mangle ct state new ct mark set 0x42
add rule inet smoke-neighbour forward ct mark 0x42 counter`},
	{"a verdict map on a concatenation", `
add map inet smoke-neighbour blocked { type ipv4_addr . inet_service : verdict; elements = { 192.0.2.1 . 22 : drop }; }
add rule inet smoke-neighbour forward ip daddr . tcp dport vmap @blocked`},
	{"a set with a counter on each element", `
add set inet smoke-neighbour watched { typeof ip saddr; counter; elements = { 192.0.2.99 }; }
add rule inet smoke-neighbour input ip saddr @watched`},
	{"th dport of an anonymous set of protocols", `
add rule inet smoke-neighbour input meta l4proto { tcp, udp } th dport 9 drop`},
	{"tcp option mptcp", `
add rule inet smoke-neighbour input tcp option mptcp exists counter`},
}

// iptablesRules are iptables-nft's neighbours: rules in the filter and
// nat tables of both families, which match none of the test's traffic.
var iptablesRules = [][]string{
	{"iptables-nft", "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "9999", "-j", "ACCEPT"},
	{"iptables-nft", "-t", "filter", "-A", "FORWARD", "-s", "192.0.2.0/24", "-j", "DROP"},
	{"iptables-nft", "-t", "nat", "-A", "POSTROUTING", "-s", "192.0.2.0/24", "-j", "MASQUERADE"},
	{"ip6tables-nft", "-t", "filter", "-A", "INPUT", "-p", "tcp", "--dport", "9999", "-j", "ACCEPT"},
	{"ip6tables-nft", "-t", "nat", "-A", "POSTROUTING", "-s", "2001:db8::/32", "-j", "MASQUERADE"},
}

// iptablesTables are the tables iptablesRules write.
var iptablesTables = []string{"ip filter", "ip nat", "ip6 filter", "ip6 nat"}

// TestSmokeNeighbours runs the proxy as TestSmoke does, with its tables
// owned (the default), beside other programs' tables: one written with
// nft using what a recent nft offers (before the proxy starts) and
// iptables-nft's (after). The proxy keeps syncing (a change of the API
// reaches the data path), leaves the others' tables as they were (nft -s
// lists them byte for byte as before), and its own reads of the ruleset
// work beside them: `nftproxy diff` finds no difference, `nftproxy
// explain` traces a connection to the endpoint it reaches, and the
// traffic metrics (--service-traffic-metrics) read the kernel's counters
// with no read error counted.
func TestSmokeNeighbours(t *testing.T) {
	start := time.Now()
	c := newSmokeCluster(t)
	c.startEndpoints(t)
	node := c.node.ns
	writeNeighbourTable(t, node)
	neighbours := map[string]string{neighbourTable: listStateless(t, node, neighbourTable)} // table → nft -s list table
	proxy := c.startSmokeProxy(t, "--service-traffic-metrics=endpoints")
	t.Run("iptables-nft", func(t *testing.T) {
		for _, tool := range []string{"iptables-nft", "ip6tables-nft"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("iptables-nft's tables left out: %v", err)
			}
		}
		for _, rule := range iptablesRules {
			runIn(t, node, rule...)
		}
		for _, table := range iptablesTables {
			neighbours[table] = listStateless(t, node, table)
		}
	})

	answered(t, "TCP to web's ClusterIP", 64, askTCP(t, c.client.ns, webTCP), allEndpoints...)
	before := proxy.api.list(t)
	t.Run("APIChange", func(t *testing.T) {
		testAPIChange(t, c, proxy, "ep-b")
	})

	t.Run("diff", func(t *testing.T) {
		diff := append([]string{"diff", "--from-file", "-"}, proxy.args...)
		code, out := runCommand(t, node, proxy.api.list(t), diff...)
		if code != 0 || out != "" {
			t.Errorf("nftproxy diff: exit status %d, want 0 and no differences:\n%s", code, out)
		}
		// The API's objects before the change differ from the kernel's
		// table: diff sees the tables it compares.
		code, out = runCommand(t, node, before, diff...)
		if code != 1 || !strings.Contains(out, c.pods["ep-a"].ipv4.String()) {
			t.Errorf("nftproxy diff against the objects before the change: exit status %d, want 1 and ep-a's address:\n%s", code, out)
		}
	})
	t.Run("explain", func(t *testing.T) {
		code, out := runCommand(t, node, "", "explain", "-o", "json", "--from", c.client.ipv4.String(), changingTCP.String())
		var ex struct {
			Outcomes []struct {
				Verdict, To, Service string
				Share                float64
			}
		}
		if err := json.Unmarshal([]byte(out), &ex); code != 0 || err != nil {
			t.Fatalf("nftproxy explain: exit status %d, %v:\n%s", code, err, out)
		}
		want := c.pods["ep-b"].ipv4.String() + ":8080"
		if len(ex.Outcomes) != 1 || ex.Outcomes[0].To != want || ex.Outcomes[0].Share != 1 || ex.Outcomes[0].Service != "smoke/changing:tcp" {
			t.Errorf("nftproxy explain %v from %v: %+v, want one outcome: DNAT to %s (smoke/changing:tcp)", changingTCP, c.client.ipv4, ex.Outcomes, want)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		const connections = 5
		answeredBy(t, "TCP to changing's ClusterIP", connections, askTCP(t, c.client.ns, changingTCP), "ep-b")
		m := scrape(t, node)
		endpoint := map[string]string{"service": "changing", "endpoint": c.pods["ep-b"].ipv4.String() + ":8080", "protocol": "tcp"}
		if n := m.sum("nftproxy_endpoint_new_connections_total", endpoint); n < connections {
			t.Errorf("nftproxy_endpoint_new_connections_total%v = %v, want at least %d", endpoint, n, connections)
		}
		if n := m.sum("nftproxy_service_new_connections_total", map[string]string{"service": "changing", "protocol": "tcp"}); n < connections {
			t.Errorf("nftproxy_service_new_connections_total of changing/tcp = %v, want at least %d", n, connections)
		}
		for _, family := range []string{"IPv4", "IPv6"} {
			if n := m.sum("nftproxy_traffic_counter_read_errors_total", map[string]string{"ip_family": family}); n != 0 {
				t.Errorf("nftproxy_traffic_counter_read_errors_total{ip_family=%q} = %v, want 0 (served from the start)", family, n)
			}
		}
		if n := m.sum("nftproxy_ruleset_read_failures_total", nil); n > 0 {
			t.Errorf("nftproxy_ruleset_read_failures_total = %v, want none", n)
		}
	})
	t.Run("unchanged", func(t *testing.T) {
		for table, before := range neighbours {
			if after := listStateless(t, node, table); after != before {
				t.Errorf("nft -s list table %s changed:\nbefore:\n%s\nafter:\n%s", table, before, after)
			}
		}
	})
	t.Logf("TestSmokeNeighbours: %v", time.Since(start).Round(time.Millisecond))
}

// writeNeighbourTable writes the neighbour's table in ns: the table
// itself, then each feature the node's nft can load, one subtest each
// (of "neighbour"), skipped, by its name, when that nft cannot.
func writeNeighbourTable(t *testing.T, ns *netns.NS) {
	t.Helper()
	base := neighbourFeatures[0]
	if _, err := ns.Run(base.nft, "nft", "-f", "-"); err != nil {
		t.Fatalf("neighbour table: %s: %v", base.name, err)
	}
	t.Run("neighbour", func(t *testing.T) {
		for _, f := range neighbourFeatures[1:] {
			t.Run(f.name, func(t *testing.T) {
				if _, err := ns.Run(f.nft, "nft", "-c", "-f", "-"); err != nil {
					t.Skipf("the node's nft cannot load it: %s", firstLine(err.Error()))
				}
				if _, err := ns.Run(f.nft, "nft", "-f", "-"); err != nil {
					t.Fatalf("nft -c accepted it, nft -f did not: %v", err)
				}
			})
		}
	})
}

// listStateless is `nft -s list table`: the table without its counters'
// and quotas' values, which the test's traffic changes. Debian 11's nft
// 0.9.8 lists them all the same: they are cut out here.
func listStateless(t *testing.T, ns *netns.NS, table string) string {
	t.Helper()
	out, err := ns.Run("", append([]string{"nft", "-s", "list", "table"}, strings.Fields(table)...)...)
	if err != nil {
		t.Fatalf("nft -s list table %s: %v", table, err)
	}
	return countersRE.ReplaceAllString(out, "")
}

// countersRE matches the values of a counter or a quota in a listing.
var countersRE = regexp.MustCompile(`\s*packets \d+ bytes \d+| used \d+ [kmg]?bytes`)

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
