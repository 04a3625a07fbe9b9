// Command conformance-table writes the tables of docs/conformance.md from
// what `make conformance` (e2e/conformance) leaves in its output directory:
// for each set the run ran and each proxy, the JUnit report
// (DIR[/SET]/junit-PROXY.xml) and the run's record (run-PROXY.json: its
// selection on the machine it ran on, ginkgo's exit). A table has a row per
// test, a column per proxy, why a test did not run, and before it the
// counts per proxy (selected, ran, passed, ...).
//
//	go run ./e2e/cmd/conformance-table --set sig-network --out bin/conformance --doc docs/conformance.md
//	go run ./e2e/cmd/conformance-table --cni flannel-nftables --out bin/conformance --doc docs/cnis.md
//
// Each table replaces what is between the doc's markers for its cluster and set; without
// --doc they are printed. With --print-selection it prints the set's ginkgo
// --focus and --skip on this machine instead (to run the same selection by
// hand; --packages names the agnhost image's package list, images/packages.txt
// of the output directory).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nftproxy/nftproxy/e2e/conformance"
)

// proxies are the columns, in order.
var proxies = []string{"nftproxy", "kube-proxy"}

func main() {
	set := flag.String("set", string(conformance.SetConformance), "the set make conformance ran (CONFORMANCE_SET): its tables and those of the sets it runs after it")
	out := flag.String("out", "bin/conformance", "make conformance's output directory")
	cniFlag := flag.String("cni", string(conformance.CNIBridge), "the cluster's CNI make conformance ran (CONFORMANCE_CNI)")
	primary := flag.String("primary", "ipv4", "the cluster's first family (CONFORMANCE_PRIMARY); the reports of any cluster but the IPv4-first bridge are in OUT/CNI[-ipv6]")
	doc := flag.String("doc", "", "the Markdown file whose tables to replace (default: print them)")
	selection := flag.Bool("print-selection", false, "print the set's ginkgo --focus and --skip on this machine, one a line, and exit")
	packages := flag.String("packages", "bin/conformance/images/packages.txt", "with --print-selection: the agnhost image's Debian packages")
	flag.Parse()
	s, err := conformance.ParseSet(*set)
	if err != nil {
		fail(err)
	}
	if *selection {
		m, err := conformance.DetectMachine(*packages)
		if err != nil {
			fail(err)
		}
		sel := s.Selection(m)
		fmt.Printf("--focus=%s\n--skip=%s\n", sel.Focus, sel.SkipPattern())
		return
	}
	cluster, err := conformance.ParseCluster(*cniFlag, *primary)
	if err != nil {
		fail(err)
	}
	if err := run(cluster, s, filepath.Join(*out, cluster.Dir()), *doc); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "conformance-table:", err)
	os.Exit(1)
}

func run(cluster conformance.Cluster, set conformance.Set, out, doc string) error {
	var text string
	if doc != "" {
		b, err := os.ReadFile(doc)
		if err != nil {
			return err
		}
		text = string(b)
	}
	for _, s := range set.Runs() {
		cols, err := readColumns(filepath.Join(out, s.Dir()))
		if err != nil {
			return fmt.Errorf("set %s: %w", s, err)
		}
		table := conformance.Table(s, cols)
		if doc == "" {
			fmt.Printf("%s:\n\n%s\n", s, table)
			continue
		}
		if text, err = conformance.ReplaceTable(text, cluster, s, table); err != nil {
			return fmt.Errorf("%s: %w", doc, err)
		}
	}
	if doc == "" {
		return nil
	}
	return os.WriteFile(doc, []byte(text), 0o644)
}

// readColumns reads each proxy's report and record in dir; a proxy without
// a report is left out, one with a report but no record is an error.
func readColumns(dir string) ([]conformance.Column, error) {
	var cols []conformance.Column
	for _, p := range proxies {
		rep, err := conformance.ReadJUnit(filepath.Join(dir, "junit-"+p+".xml"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(filepath.Join(dir, "run-"+p+".json"))
		if err != nil {
			return nil, err
		}
		var r conformance.Run
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("run-%s.json: %w", p, err)
		}
		cols = append(cols, conformance.Column{Proxy: p, Report: rep, Run: r})
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("no junit-PROXY.xml in %s", dir)
	}
	return cols, nil
}
