package scenarios

import (
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// switchDwell is how long each step of a switch-over runs before the next.
const switchDwell = time.Second

// TestMigrateFromKubeProxy switches nodes from upstream kube-proxy to
// nftproxy (and one back), step by step as docs/migrating-from-kube-proxy.md
// describes it, while a client pod on the node opens a new connection
// through a dual-stack ClusterIP every 20 ms and keeps long-lived ones
// open: no new connection may fail and no long-lived one may break, at
// any step.
func TestMigrateFromKubeProxy(t *testing.T) {
	m := newMigrateBed(t)
	t.Run("nftables mode", m.switchFromNFTables)
	t.Run("nftables mode, table kept", m.keepKubeProxyTable)
	t.Run("iptables mode", m.switchFromIPTables)
}

// switchFromNFTables: kube-proxy's nftables mode to nftproxy with
// --remove-kube-proxy-tables, and back.
func (m *migrateBed) switchFromNFTables(t *testing.T) {
	n := m.bed.AddNode("n1")
	a, b, client := m.backend(n, "a1"), m.backend(n, "b1"), n.AddPod("c1")
	svc := m.service(t, "web1", a)
	kp := m.startKubeProxy(t, n, "nftables")
	tr := m.traffic(t, client, svc, "a1", "kube-proxy (nftables mode) serving")
	time.Sleep(switchDwell)

	tr.Step("kube-proxy stopped (SIGTERM): its rules stay")
	kp.Stop(10 * time.Second)
	m.wantTables(t, n, "after kube-proxy stopped", []string{"ip kube-proxy", "ip6 kube-proxy"}, nil)
	time.Sleep(switchDwell)

	tr.Step("nftproxy started with --remove-kube-proxy-tables")
	np := n.Start(m.nftproxyArgs(n, "--remove-kube-proxy-tables")...)
	for _, fam := range []string{"IPv4", "IPv6"} {
		m.waitLog(t, np, `"Deleted kube-proxy's nftables table: nftproxy's rules alone serve Services now" ipFamily="`+fam+`"`)
	}
	m.checkFoundLog(t, np, "nftproxy deletes it after its first sync")
	m.checkRemovalOrder(t, np)
	m.wantTables(t, n, "after nftproxy's first syncs", []string{"ip nftproxy", "ip6 nftproxy"}, []string{"kube-proxy"})
	m.wantMetrics(t, n, map[string]float64{
		`nftproxy_kube_proxy_leftovers{ip_family="IPv4",kind="nftables-table"}`:       0,
		`nftproxy_kube_proxy_leftovers{ip_family="IPv6",kind="nftables-table"}`:       0,
		`nftproxy_kube_proxy_table_removals_total{ip_family="IPv4",result="success"}`: 1,
		`nftproxy_kube_proxy_table_removals_total{ip_family="IPv6",result="success"}`: 1,
		`nftproxy_kube_proxy_table_removals_total{ip_family="IPv4",result="failure"}`: 0,
		`nftproxy_kube_proxy_table_removals_total{ip_family="IPv6",result="failure"}`: 0,
	})
	time.Sleep(switchDwell)

	tr.Step("Service change: endpoint b1 added")
	m.endpoints(t, svc, a, b)
	m.waitAnswered(t, tr, "b1")
	time.Sleep(switchDwell)

	tr.Step("nftproxy stopped (SIGTERM): its rules stay")
	np.Stop(10 * time.Second)
	m.wantTables(t, n, "after nftproxy stopped", []string{"ip nftproxy", "ip6 nftproxy"}, nil)
	time.Sleep(switchDwell)

	tr.Step("kube-proxy (nftables mode) started again")
	kp = m.startKubeProxy(t, n, "nftables")
	defer kp.Stop(10 * time.Second)
	time.Sleep(switchDwell)

	tr.Step("nftproxy --cleanup")
	n.MustExec(t, m.nftproxy, "--cleanup")
	m.wantTables(t, n, "after nftproxy --cleanup", []string{"ip kube-proxy", "ip6 kube-proxy"}, []string{"nftproxy"})
	time.Sleep(switchDwell)

	tr.Step("kube-proxy alone")
	m.waitAnswered(t, tr, "b1")
	time.Sleep(switchDwell)
	switchReport(t, tr.Stop())
}

// keepKubeProxyTable: nftproxy without --remove-kube-proxy-tables reports
// kube-proxy's tables and leaves them, and their stale rules still catch
// what nftproxy does not DNAT (a Service left without endpoints goes to
// its old endpoint instead of being refused), until they are deleted by
// hand.
func (m *migrateBed) keepKubeProxyTable(t *testing.T) {
	n := m.bed.AddNode("n3")
	a, b, client := m.backend(n, "a3"), m.backend(n, "b3"), n.AddPod("c3")
	svc := m.service(t, "web3", a)
	gone := m.service(t, "gone3", a) // left without endpoints once nftproxy runs
	goneAddr := netip.AddrPortFrom(netip.MustParseAddr(gone.Spec.ClusterIPs[0]), 80)
	kp := m.startKubeProxy(t, n, "nftables")
	tr := m.traffic(t, client, svc, "a3", "kube-proxy (nftables mode) serving, then stopped")
	time.Sleep(switchDwell)
	kp.Stop(10 * time.Second)

	tr.Step("nftproxy started without --remove-kube-proxy-tables")
	np := n.Start(m.nftproxyArgs(n)...)
	defer np.Stop(10 * time.Second)
	m.waitLog(t, np, `"Synced" ipFamily="IPv4"`)
	m.waitLog(t, np, `"Synced" ipFamily="IPv6"`)
	m.checkFoundLog(t, np, "once nftproxy has synced, run `nft delete table ")
	m.wantMetrics(t, n, map[string]float64{
		`nftproxy_kube_proxy_leftovers{ip_family="IPv4",kind="nftables-table"}`:  1,
		`nftproxy_kube_proxy_leftovers{ip_family="IPv6",kind="nftables-table"}`:  1,
		`nftproxy_kube_proxy_leftovers{ip_family="IPv4",kind="iptables-chains"}`: 0,
		`nftproxy_kube_proxy_leftovers{ip_family="IPv6",kind="iptables-chains"}`: 0,
	})
	m.wantTables(t, n, "without --remove-kube-proxy-tables", []string{"ip kube-proxy", "ip6 kube-proxy", "ip nftproxy"}, nil)
	time.Sleep(switchDwell)

	// nftproxy's chains are the newer ones: its rules decide for the
	// Services it knows, with the current state.
	tr.Step("Service change beside kube-proxy's table: endpoint b3 added")
	m.endpoints(t, svc, a, b)
	m.waitAnswered(t, tr, "b3")
	time.Sleep(switchDwell)

	tr.Step("gone3 left without endpoints")
	m.endpoints(t, gone)
	m.waitNoEndpoints(t, n, goneAddr.Addr())
	got := m.dialN(t, client, goneAddr, 5)
	t.Logf("STALE gone3 without endpoints, kube-proxy's table kept: %s", summarize(got))
	if !onlyFrom("a3")(got) {
		t.Errorf("gone3 without endpoints, beside kube-proxy's stale table: %q, want a3 answering (stale DNAT)", got)
	}
	time.Sleep(switchDwell)

	tr.Step("nft delete table ip kube-proxy; … ip6 kube-proxy")
	n.MustExec(t, "nft", "delete table ip kube-proxy; delete table ip6 kube-proxy")
	got = m.dialN(t, client, goneAddr, 5)
	t.Logf("STALE gone3 without endpoints, kube-proxy's table deleted: %s", summarize(got))
	if !all("refused")(got) {
		t.Errorf("gone3 without endpoints, kube-proxy's table deleted: %q, want refused", got)
	}
	time.Sleep(switchDwell)
	switchReport(t, tr.Stop())
}

// switchFromIPTables: kube-proxy's iptables mode (iptables-nft) to
// nftproxy, whose start finds the chains and leaves them, whose rules
// decide for the Services they know, and then `kube-proxy --cleanup`
// removes the chains.
func (m *migrateBed) switchFromIPTables(t *testing.T) {
	for _, tool := range []string{"iptables-nft", "ip6tables-nft", "iptables-nft-save", "ip6tables-nft-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("NFTPROXY_E2E") == "1" {
				t.Fatalf("needs %s (e2e/tools/deps.sh installs iptables): %v", tool, err)
			}
			t.Skipf("needs %s: %v", tool, err)
		}
	}
	n := m.bed.AddNode("n2")
	a, b, client := m.backend(n, "a2"), m.backend(n, "b2"), n.AddPod("c2")
	svc := m.service(t, "web2", a)
	kp := m.startKubeProxy(t, n, "iptables")
	tr := m.traffic(t, client, svc, "a2", "kube-proxy (iptables mode) serving")
	time.Sleep(switchDwell)

	tr.Step("kube-proxy stopped (SIGTERM): its rules stay")
	kp.Stop(10 * time.Second)
	saved := m.iptablesSave(t, n)
	if !strings.Contains(saved, ":KUBE-SERVICES") {
		t.Fatalf("no KUBE-SERVICES chain after kube-proxy's iptables mode:\n%s", saved)
	}
	time.Sleep(switchDwell)

	tr.Step("nftproxy started with --remove-kube-proxy-tables")
	np := n.Start(m.nftproxyArgs(n, "--remove-kube-proxy-tables")...)
	m.waitLog(t, np, `"Synced" ipFamily="IPv4"`)
	m.waitLog(t, np, `"Synced" ipFamily="IPv6"`)
	for _, table := range []string{`table="ip nat"`, `table="ip filter"`, `table="ip6 nat"`} {
		if !regexp.MustCompile(`"Found KUBE-\* chains of kube-proxy's iptables or ipvs mode \(iptables-nft\); nftproxy never deletes them" ipFamily="IPv[46]" ` +
			regexp.QuoteMeta(table) + ` chains=\d+ .*kube-proxy --cleanup`).MatchString(np.Log()) {
			t.Errorf("no log line about the KUBE-* chains of %s:\n%s", table, np.Log())
		}
	}
	for _, fam := range []string{"IPv4", "IPv6"} {
		if v := m.metric(t, n, `nftproxy_kube_proxy_leftovers{ip_family="`+fam+`",kind="iptables-chains"}`); v < 5 {
			t.Errorf("%s: leftovers{iptables-chains} = %v, want kube-proxy's chains (at least 5)", fam, v)
		}
		if v := m.metric(t, n, `nftproxy_kube_proxy_leftovers{ip_family="`+fam+`",kind="nftables-table"}`); v != 0 {
			t.Errorf("%s: leftovers{nftables-table} = %v, want 0", fam, v)
		}
	}
	if after := m.iptablesSave(t, n); after != saved {
		t.Errorf("nftproxy changed iptables rules:\nbefore:\n%s\nafter:\n%s", saved, after)
	}
	time.Sleep(switchDwell)

	// nftproxy's chains are newer than iptables-nft's: its rules decide
	// for the Services they know.
	tr.Step("Service change beside kube-proxy's chains: endpoint b2 added")
	m.endpoints(t, svc, a, b)
	m.waitAnswered(t, tr, "b2")
	time.Sleep(switchDwell)

	tr.Step("kube-proxy --cleanup")
	n.MustExec(t, m.kubeProxy, "--cleanup")
	// KUBE-FIREWALL is kubelet's too: kube-proxy leaves it.
	if after := m.iptablesSave(t, n); regexp.MustCompile(`:KUBE-(?:[^F]|F[^I])`).MatchString(after) {
		t.Errorf("KUBE-* chains but KUBE-FIREWALL after kube-proxy --cleanup:\n%s", after)
	}
	m.wantTables(t, n, "after kube-proxy --cleanup", []string{"ip nftproxy", "ip6 nftproxy"}, nil)
	time.Sleep(switchDwell)

	tr.Step("nftproxy alone")
	m.waitAnswered(t, tr, "b2")
	time.Sleep(switchDwell)
	switchReport(t, tr.Stop())
	np.Stop(10 * time.Second)
}

// checkFoundLog checks that nftproxy logged, at start, kube-proxy's table
// of each family with its chains and what to do about it (todo's start).
func (m *migrateBed) checkFoundLog(t *testing.T, p *testbed.Process, todo string) {
	t.Helper()
	for _, fam := range []struct{ name, table string }{{"IPv4", "ip kube-proxy"}, {"IPv6", "ip6 kube-proxy"}} {
		re := regexp.MustCompile(`"Found kube-proxy's nftables table: [^"]*" ipFamily="` + fam.name + `" table="` +
			fam.table + `" chains=[1-9]\d* todo="` + regexp.QuoteMeta(todo))
		line := re.FindString(p.Log())
		if line == "" {
			t.Errorf("no log line of kube-proxy's %s table saying %q:\n%s", fam.table, todo, p.Log())
		}
		t.Logf("FOUND %s…", line)
	}
}

// checkRemovalOrder checks the order of nftproxy's log: each family's
// kube-proxy table found at start, then its first sync, then the table
// deleted.
func (m *migrateBed) checkRemovalOrder(t *testing.T, p *testbed.Process) {
	t.Helper()
	log := p.Log()
	for _, fam := range []string{"IPv4", "IPv6"} {
		found := strings.Index(log, `"Found kube-proxy's nftables table: `)
		synced := strings.Index(log, `"Synced" ipFamily="`+fam+`"`)
		deleted := strings.Index(log, `"Deleted kube-proxy's nftables table: nftproxy's rules alone serve Services now" ipFamily="`+fam+`"`)
		if found < 0 || synced < 0 || deleted < 0 || !(found < synced && synced < deleted) {
			t.Errorf("%s: want kube-proxy's table found (at %d), then the first sync (at %d), then the table deleted (at %d):\n%s",
				fam, found, synced, deleted, log)
			continue
		}
		t.Logf("REMOVAL %s: kube-proxy's table deleted %v after the first sync was logged", fam,
			klogTime(log, deleted).Sub(klogTime(log, synced)))
	}
}

// klogTime is the time of day of the klog line holding log[i]
// ("I1124 05:31:52.748109 …").
func klogTime(log string, i int) time.Time {
	line := log[strings.LastIndexByte(log[:i], '\n')+1:]
	if len(line) < 21 {
		return time.Time{}
	}
	at, _ := time.Parse("15:04:05.000000", line[6:21])
	return at
}
