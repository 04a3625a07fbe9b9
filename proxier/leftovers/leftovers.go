// Package leftovers finds what kube-proxy left in the node's kernel when
// nftproxy replaces it, reports it (a log line per finding and the gauge
// nftproxy_kube_proxy_leftovers), and, when asked, deletes kube-proxy's
// nftables tables once nftproxy's own rules are in.
//
// Only nftables is read, over netlink: the tables of kube-proxy's nftables
// mode ("ip kube-proxy", "ip6 kube-proxy") and the KUBE-* chains its
// iptables and ipvs modes leave in iptables-nft's tables ("ip nat", "ip
// filter", "ip mangle" and their ip6 twins). Rules written with
// iptables-legacy live in x_tables, which nftables cannot see: they are not
// checked. Only kube-proxy's nftables tables are ever deleted; iptables
// chains are left to `kube-proxy --cleanup`, which knows which of them are
// kube-proxy's.
package leftovers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/nft/nftnl"

	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// KubeProxyTable is the table of kube-proxy's nftables mode, one per IP
// family (pkg/proxy/nftables, v1.29 to v1.36).
const KubeProxyTable = "kube-proxy"

// chainPrefix starts the name of every chain kube-proxy's iptables and ipvs
// modes create (KUBE-SERVICES, KUBE-SVC-…, KUBE-NODE-PORT, …).
const chainPrefix = "KUBE-"

// kubeletChains are KUBE-* chains that kubelet keeps in iptables on every
// node (pkg/kubelet/kubelet_network_linux.go, v1.36): not kube-proxy's,
// and `kube-proxy --cleanup` leaves them.
var kubeletChains = map[string]bool{
	"KUBE-IPTABLES-HINT":  true,
	"KUBE-KUBELET-CANARY": true,
	"KUBE-FIREWALL":       true,
}

// shownChains is how many chain names a log line lists.
const shownChains = 5

// Kernel lists and deletes nftables tables of any name (nftnl.Netlink).
type Kernel interface {
	ListTables(ctx context.Context, f nft.Family) ([]string, error)
	ListChains(ctx context.Context, f nft.Family) ([]nftnl.ChainRef, error)
	DeleteTables(ctx context.Context, f nft.Family, names []string) error
}

// Findings is what kube-proxy left in one family.
type Findings struct {
	Family nft.Family
	// Tables are kube-proxy's nftables tables: KubeProxyTable, or none.
	Tables []string
	// TableChains is the number of chains in Tables.
	TableChains int
	// Chains are the KUBE-* chains of other tables (iptables-nft's), but
	// kubelet's, sorted by table and name.
	Chains []nftnl.ChainRef
}

// Detect reads the tables and chains of family f and picks out
// kube-proxy's.
func Detect(ctx context.Context, k Kernel, f nft.Family) (Findings, error) {
	tables, err := k.ListTables(ctx, f)
	if err != nil {
		return Findings{}, err
	}
	chains, err := k.ListChains(ctx, f)
	if err != nil {
		return Findings{}, err
	}
	return classify(f, tables, chains), nil
}

// classify picks kube-proxy's objects out of a family's tables and chains.
func classify(f nft.Family, tables []string, chains []nftnl.ChainRef) Findings {
	fd := Findings{Family: f}
	if slices.Contains(tables, KubeProxyTable) {
		fd.Tables = []string{KubeProxyTable}
	}
	for _, c := range chains {
		switch {
		case c.Table == KubeProxyTable:
			fd.TableChains++
		case c.Table == nft.TableName:
		case strings.HasPrefix(c.Chain, chainPrefix) && !kubeletChains[c.Chain]:
			fd.Chains = append(fd.Chains, c)
		}
	}
	slices.SortFunc(fd.Chains, func(a, b nftnl.ChainRef) int {
		if c := strings.Compare(a.Table, b.Table); c != 0 {
			return c
		}
		return strings.Compare(a.Chain, b.Chain)
	})
	return fd
}

// setGauges exports the counts of fd.
func (fd Findings) setGauges() {
	fam := fd.Family.IPFamily()
	metrics.KubeProxyLeftovers.WithLabelValues(fam, metrics.LeftoverNFTablesTable).Set(float64(len(fd.Tables)))
	metrics.KubeProxyLeftovers.WithLabelValues(fam, metrics.LeftoverIPTablesChains).Set(float64(len(fd.Chains)))
}

// chainsByTable groups fd.Chains by table, in table order.
func (fd Findings) chainsByTable() [][]nftnl.ChainRef {
	var groups [][]nftnl.ChainRef
	for i, c := range fd.Chains {
		if i == 0 || c.Table != fd.Chains[i-1].Table {
			groups = append(groups, nil)
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], c)
	}
	return groups
}

// log writes one line per finding: kube-proxy's table, and each table
// holding its iptables chains; or one line saying there is none. remove
// says whether nftproxy will delete kube-proxy's table.
func (fd Findings) log(remove bool) {
	fam := fd.Family.IPFamily()
	for _, table := range fd.Tables {
		where := fmt.Sprintf("%s %s", fd.Family, table)
		todo := "nftproxy deletes it after its first sync of this family (--remove-kube-proxy-tables)"
		if !remove {
			todo = fmt.Sprintf("once nftproxy has synced, run `nft delete table %s`, or run nftproxy with --remove-kube-proxy-tables", where)
		}
		klog.InfoS("Found kube-proxy's nftables table: its stale rules still catch the new connections nftproxy's rules do not DNAT",
			"ipFamily", fam, "table", where, "chains", fd.TableChains, "todo", todo)
	}
	for _, group := range fd.chainsByTable() {
		names := make([]string, 0, shownChains)
		for _, c := range group[:min(len(group), shownChains)] {
			names = append(names, c.Chain)
		}
		klog.InfoS("Found KUBE-* chains of kube-proxy's iptables or ipvs mode (iptables-nft); nftproxy never deletes them",
			"ipFamily", fam, "table", fmt.Sprintf("%s %s", fd.Family, group[0].Table), "chains", len(group), "first", names,
			"todo", "once nftproxy has synced, run `kube-proxy --cleanup` on this node (iptables-legacy rules are not checked)")
	}
	if len(fd.Tables) == 0 && len(fd.Chains) == 0 {
		klog.InfoS("No kube-proxy leftovers in nftables (iptables-legacy rules are not checked)", "ipFamily", fam)
	}
}

// Checker looks for kube-proxy's leftovers at start and, if asked, deletes
// kube-proxy's nftables tables after nftproxy's first sync of each family.
type Checker struct {
	kernel   Kernel
	families []nft.Family
	remove   bool
}

// NewChecker returns a Checker of families on k; remove: RemoveTables
// deletes kube-proxy's tables (--remove-kube-proxy-tables). The families'
// removal counters are served at 0 from then on.
func NewChecker(k Kernel, families []nft.Family, remove bool) *Checker {
	for _, f := range families {
		for _, result := range []string{metrics.ResultSuccess, metrics.ResultFailure} {
			metrics.KubeProxyTableRemovalsTotal.WithLabelValues(f.IPFamily(), result)
		}
	}
	return &Checker{kernel: k, families: families, remove: remove}
}

// Check reports what each family holds. It runs before nftproxy's first
// sync; an error is logged and leaves the family's gauge unset.
func (c *Checker) Check(ctx context.Context) {
	for _, f := range c.families {
		fd, err := Detect(ctx, c.kernel, f)
		if err != nil {
			klog.ErrorS(err, "Cannot look for kube-proxy's leftovers", "ipFamily", f.IPFamily())
			continue
		}
		fd.log(c.remove)
		fd.setGauges()
	}
}

// RemoveTables deletes kube-proxy's nftables tables of family f in one
// transaction, if asked to and if there are any, then reads the family
// again so that the gauge tells what is left. Call it only once nftproxy's
// rules for f are in the kernel: until then kube-proxy's keep serving.
func (c *Checker) RemoveTables(ctx context.Context, f nft.Family) {
	if !c.remove {
		return
	}
	fam := f.IPFamily()
	fd, err := Detect(ctx, c.kernel, f)
	if err != nil {
		klog.ErrorS(err, "Cannot look for kube-proxy's tables; not removing them", "ipFamily", fam)
		return
	}
	if len(fd.Tables) == 0 {
		fd.setGauges()
		return
	}
	where := fmt.Sprintf("%s %s", f, strings.Join(fd.Tables, ", "))
	delErr := c.kernel.DeleteTables(ctx, f, fd.Tables)
	if delErr != nil {
		metrics.KubeProxyTableRemovalsTotal.WithLabelValues(fam, metrics.ResultFailure).Inc()
		klog.ErrorS(delErr, "Cannot delete kube-proxy's nftables table; its stale rules stay in the packet path",
			"ipFamily", fam, "table", where, "todo", "nft delete table "+where)
	} else {
		metrics.KubeProxyTableRemovalsTotal.WithLabelValues(fam, metrics.ResultSuccess).Inc()
		klog.InfoS("Deleted kube-proxy's nftables table: nftproxy's rules alone serve Services now",
			"ipFamily", fam, "table", where, "chains", fd.TableChains)
	}
	after, err := Detect(ctx, c.kernel, f)
	if err != nil {
		klog.ErrorS(err, "Cannot look for kube-proxy's leftovers again", "ipFamily", fam)
		return
	}
	after.setGauges()
	if delErr == nil && len(after.Tables) > 0 {
		klog.InfoS("kube-proxy's nftables table is there again: is kube-proxy still running on this node?",
			"ipFamily", fam, "table", where)
	}
}
