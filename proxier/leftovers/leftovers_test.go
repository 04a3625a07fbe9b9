package leftovers

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft/nftnl"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// fakeKernel holds tables and chains per family in memory.
type fakeKernel struct {
	chains  map[nft.Family][]nftnl.ChainRef // a table with no chain is listed as {Table: name}
	deleted [][]string                      // every DeleteTables call's names
	failDel error
	failing error // every call fails with it
}

func (k *fakeKernel) ListTables(_ context.Context, f nft.Family) ([]string, error) {
	if k.failing != nil {
		return nil, k.failing
	}
	var tables []string
	for _, c := range k.chains[f] {
		if !slices.Contains(tables, c.Table) {
			tables = append(tables, c.Table)
		}
	}
	return tables, nil
}

func (k *fakeKernel) ListChains(_ context.Context, f nft.Family) ([]nftnl.ChainRef, error) {
	if k.failing != nil {
		return nil, k.failing
	}
	var chains []nftnl.ChainRef
	for _, c := range k.chains[f] {
		if c.Chain != "" {
			chains = append(chains, c)
		}
	}
	return chains, nil
}

func (k *fakeKernel) DeleteTables(_ context.Context, f nft.Family, names []string) error {
	k.deleted = append(k.deleted, names)
	if k.failDel != nil {
		return k.failDel
	}
	k.chains[f] = slices.DeleteFunc(k.chains[f], func(c nftnl.ChainRef) bool { return slices.Contains(names, c.Table) })
	return nil
}

// node is what a node migrated from kube-proxy can hold: kube-proxy's
// nftables tables, iptables-nft tables with kube-proxy's chains and
// kubelet's, nftproxy's table and an unrelated one.
func ref(table, chain string) nftnl.ChainRef { return nftnl.ChainRef{Table: table, Chain: chain} }

func node() *fakeKernel {
	return &fakeKernel{chains: map[nft.Family][]nftnl.ChainRef{
		nft.IPv4: {
			ref("kube-proxy", "services"), ref("kube-proxy", "nat-prerouting"), ref("kube-proxy", "service-ABC-default/web/tcp/"),
			ref("nat", "PREROUTING"), ref("nat", "KUBE-SERVICES"), ref("nat", "KUBE-SVC-X"), ref("nat", "KUBE-SEP-Y"),
			ref("nat", "KUBE-KUBELET-CANARY"), ref("filter", "KUBE-FIREWALL"), ref("filter", "KUBE-FORWARD"),
			ref("mangle", "KUBE-IPTABLES-HINT"), ref("nftproxy", "services"), ref("nftproxy", "KUBE-LIKE"),
			ref("firewalld", "filter_INPUT"), ref("cni", "kube-ish"),
		},
		nft.IPv6: {ref("kube-proxy", ""), ref("filter", "KUBE-KUBELET-CANARY")},
	}}
}

func TestDetect(t *testing.T) {
	k := node()
	ctx := context.Background()
	v4, err := Detect(ctx, k, nft.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	want := Findings{Family: nft.IPv4, Tables: []string{"kube-proxy"}, TableChains: 3, Chains: []nftnl.ChainRef{
		ref("filter", "KUBE-FORWARD"), ref("nat", "KUBE-SEP-Y"), ref("nat", "KUBE-SERVICES"), ref("nat", "KUBE-SVC-X")}}
	if !equal(v4, want) {
		t.Errorf("IPv4: %+v, want %+v", v4, want)
	}
	v6, err := Detect(ctx, k, nft.IPv6)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Findings{Family: nft.IPv6, Tables: []string{"kube-proxy"}}); !equal(v6, want) {
		t.Errorf("IPv6 (an empty kube-proxy table, kubelet's chain): %+v, want %+v", v6, want)
	}
	k.chains[nft.IPv6] = nil
	if v6, _ := Detect(ctx, k, nft.IPv6); !equal(v6, Findings{Family: nft.IPv6}) {
		t.Errorf("nothing: %+v", v6)
	}
	k.failing = errors.New("boom")
	if _, err := Detect(ctx, k, nft.IPv4); err == nil {
		t.Error("a failing kernel: no error")
	}
}

func equal(a, b Findings) bool {
	return a.Family == b.Family && slices.Equal(a.Tables, b.Tables) && a.TableChains == b.TableChains &&
		slices.Equal(a.Chains, b.Chains)
}

// TestCheck: the start check exports both kinds per family, and logs one
// line per finding: kube-proxy's table, each iptables table with its
// chains, saying what to do about it.
func TestCheck(t *testing.T) {
	logs := captureLogs(t)
	NewChecker(node(), []nft.Family{nft.IPv4, nft.IPv6}, false).Check(context.Background())
	for _, g := range []struct {
		fam, kind string
		want      float64
	}{
		{metrics.IPv4, metrics.LeftoverNFTablesTable, 1}, {metrics.IPv4, metrics.LeftoverIPTablesChains, 4},
		{metrics.IPv6, metrics.LeftoverNFTablesTable, 1}, {metrics.IPv6, metrics.LeftoverIPTablesChains, 0},
	} {
		if got := testutil.Value(t, metrics.KubeProxyLeftovers.WithLabelValues(g.fam, g.kind)); got != g.want {
			t.Errorf("leftovers{%s,%s} = %v, want %v", g.fam, g.kind, got, g.want)
		}
	}
	out := logs.String()
	for _, want := range []string{
		`"Found kube-proxy's nftables table: `, `table="ip kube-proxy" chains=3 todo="once nftproxy has synced, run ` + "`nft delete table ip kube-proxy`",
		`table="ip6 kube-proxy" chains=0`,
		`table="ip filter" chains=1 first=["KUBE-FORWARD"]`,
		`table="ip nat" chains=3 first=["KUBE-SEP-Y","KUBE-SERVICES","KUBE-SVC-X"] todo="once nftproxy has synced, run ` + "`kube-proxy --cleanup`",
		`iptables-legacy rules are not checked`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "Found "); n != 4 {
		t.Errorf("%d findings logged, want 4:\n%s", n, out)
	}
}

// TestRemoveTables: with the flag, kube-proxy's table of the family (and
// nothing else) is deleted, counted, and the gauge read again; without
// it, or without a table, nothing is deleted; a failure is counted and
// leaves the gauge at what is there.
func TestRemoveTables(t *testing.T) {
	ctx := context.Background()
	removals := func(fam, result string) float64 {
		return testutil.Value(t, metrics.KubeProxyTableRemovalsTotal.WithLabelValues(fam, result))
	}
	tables := func() float64 {
		return testutil.Value(t, metrics.KubeProxyLeftovers.WithLabelValues(metrics.IPv4, metrics.LeftoverNFTablesTable))
	}

	k := node()
	NewChecker(k, []nft.Family{nft.IPv4}, false).RemoveTables(ctx, nft.IPv4)
	if len(k.deleted) != 0 {
		t.Errorf("without the flag: deleted %q", k.deleted)
	}

	ok := removals(metrics.IPv4, metrics.ResultSuccess)
	c := NewChecker(k, []nft.Family{nft.IPv4}, true)
	c.Check(ctx)
	c.RemoveTables(ctx, nft.IPv4)
	if want := [][]string{{"kube-proxy"}}; !slices.EqualFunc(k.deleted, want, slices.Equal) {
		t.Errorf("deleted %q, want %q", k.deleted, want)
	}
	if got := removals(metrics.IPv4, metrics.ResultSuccess) - ok; got != 1 {
		t.Errorf("successful removals counted %v, want 1", got)
	}
	if got := tables(); got != 0 {
		t.Errorf("after the removal: leftovers{nftables-table} = %v, want 0", got)
	}
	if got := testutil.Value(t, metrics.KubeProxyLeftovers.WithLabelValues(metrics.IPv4, metrics.LeftoverIPTablesChains)); got != 4 {
		t.Errorf("after the removal: leftovers{iptables-chains} = %v, want 4 (never touched)", got)
	}
	c.RemoveTables(ctx, nft.IPv4)
	if len(k.deleted) != 1 {
		t.Errorf("no table left: deleted again: %q", k.deleted)
	}

	k = node()
	k.failDel = errors.New("operation not permitted")
	failed := removals(metrics.IPv4, metrics.ResultFailure)
	NewChecker(k, []nft.Family{nft.IPv4}, true).RemoveTables(ctx, nft.IPv4)
	if got := removals(metrics.IPv4, metrics.ResultFailure) - failed; got != 1 {
		t.Errorf("failed removals counted %v, want 1", got)
	}
	if got := tables(); got != 1 {
		t.Errorf("after a failed removal: leftovers{nftables-table} = %v, want 1", got)
	}
}

// TestRemovalSeriesFromStart: the removal counters of the checker's
// families are served at 0 from its creation, before any removal.
func TestRemovalSeriesFromStart(t *testing.T) {
	metrics.KubeProxyTableRemovalsTotal.Reset()
	NewChecker(&fakeKernel{}, []nft.Family{nft.IPv4, nft.IPv6}, false)
	for _, fam := range []string{metrics.IPv4, metrics.IPv6} {
		for _, result := range []string{metrics.ResultSuccess, metrics.ResultFailure} {
			labels := map[string]string{"ip_family": fam, "result": result}
			if v, ok := testutil.Served(t, metrics.Registry, "nftproxy_kube_proxy_table_removals_total", labels); !ok || v != 0 {
				t.Errorf("removals%v: served %v, value %v; want served at 0", labels, ok, v)
			}
		}
	}
}

// captureLogs sends klog's output to a buffer for the rest of the test.
func captureLogs(t *testing.T) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	return &buf
}
