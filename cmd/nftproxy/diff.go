package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nftnl"
	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// newDiffLoader opens the read-only netlink socket diff reads the
// kernel's tables with; tests open one on a namespace of their own.
var newDiffLoader = func() (nft.Loader, io.Closer, error) {
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{ReadOnly: true})
	return n, n, err
}

// diffOptions are nftproxy diff's own flags: dump's, and the output format.
type diffOptions struct {
	dumpOptions
	output string
}

func (d *diffOptions) addFlags(fs *pflag.FlagSet) {
	d.dumpOptions.addFlags(fs)
	fs.StringVarP(&d.output, "output", "o", "text", "nftproxy diff: `FORMAT` of the report: text or json.")
}

// executeDiff runs `nftproxy diff [flags]` and returns its exit status,
// as diff(1) does: 0 when the node's tables are the ones nftproxy would
// program now (dump's), 1 when they differ, 2 on error. It reads the
// kernel's tables of this network namespace over a read-only socket, so
// it runs beside a proxy that owns them and never writes.
func executeDiff(ctx context.Context, args []string, env environment) int {
	var d diffOptions
	o, err := parseCommandOptions("nftproxy diff", args, env, d.addFlags)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err == nil {
		err = checkCommandOptions("diff", o)
	}
	if err == nil && d.output != "text" && d.output != "json" {
		err = fmt.Errorf("--output %q: not text or json", d.output)
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "nftproxy diff: %v\n", err)
		return 2
	}
	if o.Version.print(env.stdout) {
		return 0
	}
	if err := applyLogging(&o.Config.Logging, o.FeatureGate, env.stderr, env.stderr); err != nil {
		fmt.Fprintf(env.stderr, "nftproxy diff: %v\n", err)
		return 2
	}
	defer klog.Flush()
	drifts, err := runDiff(ctx, o, d, env)
	if err == nil {
		err = writeDrifts(env.stdout, d.output, drifts)
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "nftproxy diff: %v\n", err)
		return 2
	}
	for _, dr := range drifts {
		if !dr.Empty() {
			return 1
		}
	}
	return 0
}

// runDiff compares each enabled family's table in the kernel with the one
// nftproxy would program on top of it (proxier.DesiredOn).
func runDiff(ctx context.Context, o *options, d diffOptions, env environment) ([]*nft.Drift, error) {
	objs, err := dumpObjects(ctx, o, d.dumpOptions, env)
	if err != nil {
		return nil, err
	}
	snap, problems := watch.NewSnapshot(o.Proxier.NodeName, objs)
	for _, p := range problems {
		klog.ErrorS(nil, "Skipping invalid part of object", "kind", p.Kind, "object", p.Object, "reason", p.Reason, "detail", p.Detail)
	}
	if snap.Node.Name == "" {
		klog.InfoS("No Node object of that name: NodePorts on its primary IPs and NodeCIDR local detection are left out", "node", o.Proxier.NodeName)
	}
	loader, closer, err := newDiffLoader()
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	var drifts []*nft.Drift
	for _, f := range enabledFamilies(o.Proxier) {
		loaded, err := loader.Load(ctx, f)
		if err != nil {
			return nil, err
		}
		drifts = append(drifts, nft.CompareLoaded(loaded, proxier.DesiredOn(o.Proxier, f, snap, loaded)))
	}
	return drifts, nil
}

// writeDrifts prints the drifts as text (nothing when there is none, like
// diff(1)) or as one JSON array, one object per family.
func writeDrifts(w io.Writer, format string, drifts []*nft.Drift) error {
	if format == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(drifts)
	}
	for _, d := range drifts {
		if _, err := io.WriteString(w, d.Text()); err != nil {
			return err
		}
	}
	return nil
}
