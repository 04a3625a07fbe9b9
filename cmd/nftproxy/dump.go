package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/nftproxy/nftproxy/proxier"
	"github.com/nftproxy/nftproxy/proxier/watch"
)

// newDumpClient is newClient; tests replace it with a fake API.
var newDumpClient = func(c clientOptions) (kubernetes.Interface, error) {
	client, _, err := newClient(c)
	return client, err
}

// dumpOptions are nftproxy dump's own flags.
type dumpOptions struct {
	fromFiles []string
}

func (d *dumpOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringArrayVar(&d.fromFiles, "from-file", nil, "nftproxy dump: read the objects from `FILE` instead of the API: YAML or JSON, one object, several documents or a List, such as the output of 'kubectl get svc,endpointslices,nodes,servicecidrs -A -o yaml'; - is standard input. Repeatable.")
}

// executeDump runs `nftproxy dump [flags]` and returns its exit status
// (as execute): it prints, per IP family, the table nftproxy would program
// for the node (--hostname-override), in nft syntax that `nft -f` loads,
// built from the API's objects (listed once) or from --from-file, with
// kube-proxy's flags and --config applied as for the proxy. It touches no
// kernel.
func executeDump(ctx context.Context, args []string, env environment) int {
	var d dumpOptions
	o, err := parseCommandOptions("nftproxy dump", args, env, d.addFlags)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err == nil {
		err = checkCommandOptions("dump", o)
	}
	if err != nil {
		fmt.Fprintf(env.stderr, "nftproxy dump: %v\n", err)
		return 2
	}
	if o.Version.print(env.stdout) {
		return 0
	}
	if err := applyLogging(&o.Config.Logging, o.FeatureGate, env.stderr, env.stderr); err != nil {
		fmt.Fprintf(env.stderr, "nftproxy dump: %v\n", err)
		return 2
	}
	defer klog.Flush()
	if err := runDump(ctx, o, d, env); err != nil {
		fmt.Fprintf(env.stderr, "nftproxy dump: %v\n", err)
		return 1
	}
	return 0
}

// checkCommandOptions refuses the proxy's commands, which command (dump,
// diff) does not run.
func checkCommandOptions(command string, o *options) error {
	var given []string
	for _, c := range []struct {
		flag string
		set  bool
	}{{"--cleanup", o.Cleanup}, {"--init-only", o.InitOnly}, {"--write-config-to", o.WriteConfigTo != ""}} {
		if c.set {
			given = append(given, c.flag)
		}
	}
	if len(given) > 0 {
		return fmt.Errorf("%s: not a %s option", strings.Join(given, ", "), command)
	}
	return nil
}

// runDump reads the objects, converts them as the watchers do and writes
// each family's desired table to env.stdout.
func runDump(ctx context.Context, o *options, d dumpOptions, env environment) error {
	objs, err := dumpObjects(ctx, o, d, env)
	if err != nil {
		return err
	}
	node := o.Proxier.NodeName
	snap, problems := watch.NewSnapshot(node, objs)
	for _, p := range problems {
		klog.ErrorS(nil, "Skipping invalid part of object", "kind", p.Kind, "object", p.Object, "reason", p.Reason, "detail", p.Detail)
	}
	if snap.Node.Name == "" {
		klog.InfoS("No Node object of that name: NodePorts on its primary IPs and NodeCIDR local detection are left out", "node", node)
	}
	klog.V(2).InfoS("Objects", "node", node, "services", len(snap.Services), "endpointSlices", len(snap.Slices),
		"serviceCIDRs", snap.ServiceCIDRs)
	for _, f := range enabledFamilies(o.Proxier) {
		if _, err := io.WriteString(env.stdout, proxier.Desired(o.Proxier, f, snap).Dump()); err != nil {
			return err
		}
	}
	return nil
}

// dumpObjects lists the objects from the API, or reads the --from-file
// files.
func dumpObjects(ctx context.Context, o *options, d dumpOptions, env environment) (watch.Objects, error) {
	if len(d.fromFiles) == 0 {
		client, err := newDumpClient(o.Client)
		if err != nil {
			return watch.Objects{}, err
		}
		return watch.List(ctx, client, o.Proxier.NodeName)
	}
	var objs watch.Objects
	for _, name := range d.fromFiles {
		r, err := openInput(name, env)
		if err != nil {
			return objs, err
		}
		skipped, err := watch.Decode(r, &objs)
		if err != nil {
			return objs, fmt.Errorf("--from-file %s: %w", name, err)
		}
		if skipped > 0 {
			klog.InfoS("Skipped objects of other kinds", "file", name, "count", skipped)
		}
	}
	return objs, nil
}

// openInput opens file name (read as --config is), or standard input for
// "-".
func openInput(name string, env environment) (io.Reader, error) {
	if name == "-" {
		return env.stdin, nil
	}
	data, err := env.readFile(name)
	if err != nil {
		return nil, fmt.Errorf("--from-file: %w", err)
	}
	return bytes.NewReader(data), nil
}
